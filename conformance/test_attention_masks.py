"""Attention masks over the KV cache: causal, sliding-window, ragged and equal lengths, prefill and decode.

Two levels:

* The attention op itself (``reference.ops.attention.attention_torch``, the path every CPU step and every
  prefill takes) against attention written out from its definition in float64: query ``i`` of a sequence
  sees keys ``j`` with ``i - window < j <= i``. The batches cover what the op's shortcuts depend on: every
  sequence the same length or not, longer than the window or not. (The decode step skips the mask when
  all lengths are equal and the window does not bite, so equal lengths past the window are a case of
  their own.)
* The whole Gemma 3 tiny model against transformers with prompts of *equal* length past its 4-token
  window, so that every decode step has equal lengths (conformance/test_gemma3_oracle.py covers ragged
  ones).

Tolerance of the op test: both sides compute in float64 (unit roundoff 1.1e-16) over a few dozen terms
of order 1, so they agree to ~1e-14; 1e-10 leaves room for any summation order. A key too many or too
few in a window moves outputs of order 1 by ~1e-1.
"""

from __future__ import annotations

import pytest
import torch

from conformance.oracle import OracleCase
from reference.ops.attention import Attention, attention_torch
from reference.ops.attention_metadata import AttentionMetadata

HEADS, KV_HEADS, HEAD_SIZE = 4, 2, 8
WINDOW = 4
MAX_LEN = 16
F64_CLOSE = dict(rtol=0, atol=1e-10)


def _attention_by_definition(q, keys, values, positions, window):
    """float64 attention of queries at ``positions`` over one sequence's ``keys``/``values`` [L, Hkv, D]."""
    group = HEADS // KV_HEADS
    out = torch.empty(len(positions), HEADS, HEAD_SIZE, dtype=torch.float64)
    for t, p in enumerate(positions):
        visible = [j for j in range(len(keys)) if j <= p and (window is None or j > p - window)]
        for h in range(HEADS):
            kv = h // group  # query heads of one kv head are adjacent (transformers' repeat_kv)
            scores = torch.stack([q[t, h] @ keys[j, kv] for j in visible]) * HEAD_SIZE**-0.5
            out[t, h] = scores.softmax(0) @ values[visible, kv]
    return out


def _run(layer, query_lens, seq_lens, rows, generator):
    """One step through the op; returns (q, k, v, out) of the real tokens as [n, heads, D]."""
    n = sum(query_lens)
    q = torch.randn(n, HEADS * HEAD_SIZE, generator=generator, dtype=torch.float64)
    k, v = (torch.randn(n, KV_HEADS * HEAD_SIZE, generator=generator, dtype=torch.float64) for _ in range(2))
    out = torch.full_like(q, float("nan"))
    md = AttentionMetadata.build(query_lens, seq_lens, rows, MAX_LEN, "cpu")
    attention_torch(layer, md, q, k, v, out)
    return [x.view(n, -1, HEAD_SIZE) for x in (q, k, v, out)]


LENGTHS = {
    "equal-past-window": [9, 9, 9],
    "equal-one-past-window": [WINDOW, WINDOW, WINDOW],  # after one decode step: window + 1 keys
    "equal-within-window": [2, 2],
    "ragged": [3, 9, 6],
}


@pytest.mark.requires("components")
@pytest.mark.parametrize("window", [None, WINDOW], ids=["full", "sliding_window"])
@pytest.mark.parametrize("lengths", list(LENGTHS.values()), ids=list(LENGTHS))
def test_prefill_and_decode_attend_to_exactly_the_keys_the_mask_allows(lengths, window):
    generator = torch.Generator().manual_seed(len(lengths) * 100 + sum(lengths))
    layer = Attention(HEADS, KV_HEADS, HEAD_SIZE, HEAD_SIZE**-0.5, "layer", sliding_window=window)
    rows = [2 * i for i in range(len(lengths))]  # not consecutive: the cache is addressed by row
    layer.kv_cache = torch.zeros(2, 2 * len(lengths), MAX_LEN, KV_HEADS, HEAD_SIZE, dtype=torch.float64)
    q, k, v, out = _run(layer, lengths, lengths, rows, generator)
    keys, values, start = [], [], 0
    for i, n in enumerate(lengths):
        keys.append(k[start : start + n])
        values.append(v[start : start + n])
        expected = _attention_by_definition(q[start : start + n], keys[i], values[i], range(n), window)
        torch.testing.assert_close(out[start : start + n], expected, **F64_CLOSE, msg=lambda m: f"prefill {i}: {m}")
        start += n
    for step in range(3):  # decode: one new token per sequence, each step one key more
        seq_lens = [n + step + 1 for n in lengths]
        q, k, v, out = _run(layer, [1] * len(lengths), seq_lens, rows, generator)
        for i, n in enumerate(seq_lens):
            keys[i], values[i] = torch.cat([keys[i], k[i : i + 1]]), torch.cat([values[i], v[i : i + 1]])
            expected = _attention_by_definition(q[i : i + 1], keys[i], values[i], [n - 1], window)
            torch.testing.assert_close(out[i : i + 1], expected, **F64_CLOSE, msg=lambda m: f"decode {step}, {i}: {m}")


@pytest.fixture(scope="module")
def equal_lengths(impl) -> OracleCase:
    case = OracleCase("gemma-3-tiny", impl, prompt_lens=(6, 6, 6), decode_steps=4)
    assert case.config.sliding_window < 6, "the prompts must be longer than the window"
    return case


# eager and no_inductor: the mask is the attention op's, which every mode calls the same way
# (Inductor's compile of Gemma costs seconds on a CPU; test_gemma3_oracle runs it)
@pytest.mark.parametrize("mode", ["eager", "no_inductor"])
def test_gemma3_with_equal_prompt_lengths_past_the_window_matches_transformers(equal_lengths, mode):
    equal_lengths.assert_matches_oracle(mode, "cpu")


@pytest.mark.parametrize(
    "query_lens, leading",
    [([1, 1, 5, 1, 3], 2), ([4, 1, 1], 0), ([1, 1, 1], 3), ([2], 0), ([1, 7], 1)],
)
def test_the_varlen_table_from_a_sequence_on_holds_that_sequences_and_the_ones_after(query_lens, leading):
    """What a mixed step on CUDA splits at (the decode kernel takes the leading one-token sequences, the
    prefill kernel the rest, through ``varlen_tensor(first=...)``): the split point and each column of the
    table from it, checked on the CPU where the table is built."""
    seq_lens = [q + 3 * i for i, q in enumerate(query_lens)]
    rows = list(range(len(query_lens)))[::-1]
    md = AttentionMetadata.build(query_lens, seq_lens, rows, 64, "cpu")
    assert md.num_leading_single_tokens == leading
    starts = [sum(query_lens[:i]) for i in range(len(query_lens))]
    for first in {0, leading}:
        table = md.varlen_tensor("cpu", first=first).tolist()
        assert table == [starts[first:], query_lens[first:], seq_lens[first:], rows[first:]]
