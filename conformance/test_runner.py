"""ModelRunner: padding to capture sizes, batching, KV-cache decode, warm-up and input validation (CPU).

Tolerances. These tests compare the same float32 model run two ways whose GEMMs and attention calls see
different shapes (a batch vs one sequence, a padded vs an exact token count, a cached decode vs a full
recompute). CPU kernels may then block their sums differently, which moves logits of order 1 by a few
float32 ulps; torch's float32 defaults (rtol 1.3e-6, atol 1e-5) admit that. A real fault (a padding row
read by attention, a key written to the wrong cache slot, a stale position) moves logits by > 1e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import build_llama, make_runner, small_llama_config, token_ids
from conformance.implementation import make_runner as runner_for
from reference.config import mode_config

HF = small_llama_config()
RUNNER_MODES = ["eager", "no_inductor"]  # Inductor through the runner: test_equivalence (compiles are slow on CPU)


def _prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    return [token_ids(n, HF.vocab_size, seed=seed + i) for i, n in enumerate(lengths)]


# ---------------------------------------------------------------------- padding
@pytest.mark.eager
@pytest.mark.no_inductor
def test_padded_size_is_the_smallest_capture_size_that_fits(impl):
    sizes = (1, 2, 4, 8, 16, 24)
    runner = make_runner(impl, "no_inductor", HF, max_num_batched_tokens=40, cudagraph_capture_sizes=list(sizes))
    assert runner.capture_sizes == sizes  # padded on every device, the CPU included
    eager = make_runner(impl, "eager", HF, max_num_batched_tokens=40)
    assert eager.capture_sizes == () and eager.padded_size(3) == 3  # no graphs, no padding
    for n in range(1, 41):
        padded = runner.padded_size(n)
        if n > max(sizes):
            assert padded == n, n  # above the largest size: its own size, no graph
        else:  # a capture size that holds the step, and no smaller one would
            assert padded in sizes and padded >= n and not any(n <= s < padded for s in sizes), (n, padded)


@pytest.mark.no_inductor
@pytest.mark.gpu
def test_capture_sizes_above_the_token_budget_are_dropped(impl):
    runner = make_runner(
        impl,
        "no_inductor",
        HF,
        device="cuda",
        dtype=torch.bfloat16,
        max_num_batched_tokens=20,
        max_cudagraph_capture_size=32,
    )
    assert runner.capture_sizes == (1, 2, 4, 8, 16)
    assert [runner.padded_size(n) for n in (3, 9, 16, 17, 20)] == [4, 16, 16, 17, 20]


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_padding_rows_do_not_change_the_real_rows(mode, impl):
    """A runner that pads gives the same logits as one that does not."""
    unpadded = {} if mode == "eager" else {"cudagraph_mode": "none"}  # no graphs: no capture sizes to pad to
    plain, padded = make_runner(impl, mode, HF, **unpadded), make_runner(impl, mode, HF)
    padded.capture_sizes = (4, 8, 16)  # eager has no capture sizes of its own: pad it as a piecewise runner would
    seen = []

    class RecordSizes:  # stands in for the compiled model and records the token count of each call
        def __init__(self, compiled):
            self.compiled = compiled

        @property
        def awaits_trace(self):
            return self.compiled.awaits_trace

        def __call__(self, ids, positions):
            seen.append(len(ids))
            return self.compiled(ids, positions)

    padded.compiled = RecordSizes(padded.compiled)
    logits = prefill_and_decode({"plain": plain, "padded": padded}, _prompts([2, 5, 3]), 4, leader="plain")
    assert seen == [16, 4, 4, 4, 4]  # 10 prompt tokens padded to 16, then 3 decode tokens padded to 4
    for step, (expected, actual) in enumerate(zip(logits["plain"], logits["padded"])):
        torch.testing.assert_close(actual, expected, msg=lambda m: f"step {step}: {m}")


# ---------------------------------------------------------------------- batching and the KV cache
@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_a_batch_of_prompts_gives_each_prompt_its_own_logits(mode, impl):
    runner = make_runner(impl, mode, HF)
    prompts = _prompts([1, 6, 3, 9])
    batched = runner.step(prompts, [0] * 4, [0, 1, 2, 3])
    assert batched.shape == (4, HF.vocab_size) and batched.dtype == torch.float32
    alone = torch.cat([runner.step([prompt], [0], [row]) for row, prompt in enumerate(prompts)])
    torch.testing.assert_close(batched, alone)


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_decoding_from_the_kv_cache_matches_recomputing_the_whole_sequence(mode, impl):
    runner = make_runner(impl, mode, HF, max_num_seqs=6)
    rows = [2, 0]  # not consecutive, not in order: the cache is addressed by row, not by batch index
    scratch = [1, 3]  # rows for the full recomputes
    seqs = _prompts([4, 7])
    logits = runner.step(seqs, [0, 0], rows)
    for step in range(4):
        nxt = logits.argmax(-1).tolist()
        logits = runner.step([[t] for t in nxt], [len(s) for s in seqs], rows)
        seqs = [s + [t] for s, t in zip(seqs, nxt)]
        recomputed = runner.step(seqs, [0, 0], scratch)
        torch.testing.assert_close(logits, recomputed, msg=lambda m: f"decode step {step}: {m}")

    # one step that decodes sequence 0 and prefills a new sequence in row 4
    newcomer = _prompts([3], seed=7)[0]
    nxt = logits[0].argmax().item()
    mixed = runner.step([[nxt], newcomer], [len(seqs[0]), 0], [rows[0], 4])
    recomputed = runner.step([seqs[0] + [nxt], newcomer], [0, 0], [scratch[0], 5])
    torch.testing.assert_close(mixed, recomputed)


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_a_decode_step_fed_a_device_tensor_equals_the_step_fed_host_lists(mode, impl):
    """The engine's decode loop feeds the previous step's samples without reading them on the host; the
    step must compute exactly what the same ids given as lists compute (the same runner, the same
    position rewritten, so bitwise)."""
    runner = make_runner(impl, mode, HF, max_num_seqs=4)
    rows, prompts = [3, 0, 2], _prompts([4, 1, 6])
    nxt = runner.step(prompts, [0] * 3, rows).argmax(-1)  # [3] int64 on the model's device
    context = [len(p) for p in prompts]
    from_lists = runner.step([[t] for t in nxt.tolist()], context, rows)
    from_tensor = runner.step(nxt, context, rows)
    torch.testing.assert_close(from_tensor, from_lists, rtol=0, atol=0)
    assert not torch.equal(runner.step(nxt.flip(0), context, rows), from_tensor)  # the tensor's ids are used


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_a_mixed_step_with_fed_decodes_equals_the_step_fed_host_lists(mode, impl):
    """Continuous batching's mixed step: decodes fed the previous step's samples on the device (``fed``)
    first, then prompt chunks from the host (a continuing chunk and a new prompt); the same step given
    every id as lists computes exactly the same (bitwise: the same runner, the same input buffer)."""
    runner = make_runner(impl, mode, HF, max_num_seqs=4)
    rows, prompts = [3, 0], _prompts([4, 2])
    fed = runner.step(prompts, [0, 0], rows).argmax(-1)  # [2] int64 on the model's device
    chunk, new = _prompts([5, 3], seed=7)
    runner.step([chunk[:2]], [0], [1])  # row 1's prompt so far: 2 of its 5 tokens
    args = ([len(p) for p in prompts] + [2, 0], rows + [1, 2])
    from_lists = runner.step([[t] for t in fed.tolist()] + [chunk[2:], new], *args)
    mixed = runner.step([chunk[2:], new], *args, fed=fed)
    torch.testing.assert_close(mixed, from_lists, rtol=0, atol=0)
    assert mixed.shape == (4, HF.vocab_size)
    assert not torch.equal(runner.step([chunk[2:], new], *args, fed=fed.flip(0)), mixed)  # fed's ids are used


@pytest.mark.eager
def test_an_empty_fed_is_no_fed_and_without_fed_every_sequence_needs_its_host_list(impl):
    """A fed of zero tokens leaves every sequence to its host list; without fed, a list short of the rows is
    refused (the rows left over are not taken for fed decodes)."""
    runner = make_runner(impl, "eager", HF, max_num_seqs=4)
    prompts = _prompts([3, 2])
    lists = runner.step(prompts, [0, 0], [0, 1])
    empty = runner.step(prompts, [0, 0], [0, 1], fed=torch.empty(0, dtype=torch.int64))
    torch.testing.assert_close(empty, lists, rtol=0, atol=0)
    with pytest.raises(ValueError) as err:
        runner.step(prompts[:1], [3, 2], [0, 1])
    assert str(err.value) == (
        "new_tokens (1), context_lens (2) and rows (2): expected one entry per sequence in each"
    )


@pytest.mark.eager
@pytest.mark.parametrize(
    "new_tokens, fed, message",
    [
        pytest.param([[5]], torch.tensor([1]), r"^fed: a token tensor must be \[2\] \(one per sequence\)", id="short"),
        pytest.param([[5]], [1, 2], r"^fed: expected a \[2\] int64 token tensor on cpu, got \[1, 2\]", id="list"),
        pytest.param([[5]], torch.tensor([1, -3]), r"^fed\[1\]: token id -3 is outside the vocabulary", id="negative"),
        pytest.param(torch.tensor([1, 2, 3]), torch.tensor([1]), r"^new_tokens is a token tensor and fed is given",
                     id="twice"),  # fmt: skip
    ],
)
def test_bad_fed_tokens_are_refused_naming_fed(new_tokens, fed, message, impl):
    runner = make_runner(impl, "eager", HF, max_num_seqs=4)
    runner.step(_prompts([2, 2, 2]), [0, 0, 0], [0, 1, 2])
    with pytest.raises(ValueError, match=message):
        runner.step(new_tokens, [2, 2, 2], [0, 1, 2], fed=fed)


BAD_TOKEN_TENSORS = [
    pytest.param(
        torch.tensor([1, 2]), r": a token tensor must be \[3\] \(one per sequence\) int64 on cpu, got \[2\]", id="too_few"
    ),
    pytest.param(torch.tensor([[1, 2, 3]]), r": a token tensor .* got \[1, 3\] int64", id="two_dims"),
    pytest.param(torch.tensor([1, 2, 3], dtype=torch.int32), r": a token tensor .* got \[3\] int32", id="int32"),
    pytest.param(torch.tensor([1.0, 2.0, 3.0]), r": a token tensor .* got \[3\] float32", id="float"),
    pytest.param(
        torch.tensor([1, HF.vocab_size, 3]),
        rf"\[1\]: token id {HF.vocab_size} is outside the vocabulary, expected an int in "
        rf"0\.\.{HF.vocab_size - 1}$",
        id="past_vocab",
    ),
    pytest.param(torch.tensor([1, 2, -1]), r"\[2\]: token id -1 is outside the vocabulary", id="negative"),
]


@pytest.mark.no_inductor
@pytest.mark.parametrize("tokens, message", BAD_TOKEN_TENSORS)
def test_a_bad_token_tensor_is_refused_naming_new_tokens_and_leaves_the_runner_usable(tokens, message, impl):
    """A padded runner (capture sizes 1, 2, 4): a refused tensor must not leave its ids in the input
    buffer, where later steps would read them as padding."""
    runner = make_runner(impl, "no_inductor", HF, max_num_seqs=4)
    rows, context = [0, 1, 2], [1, 1, 1]
    runner.step([[5], [6], [7]], [0, 0, 0], rows)
    expected = runner.step(torch.tensor([8, 9, 10]), context, rows)  # padded to 4
    with pytest.raises(ValueError, match=rf"^new_tokens{message}"):
        runner.step(tokens, context, rows)
    torch.testing.assert_close(runner.step(torch.tensor([8, 9, 10]), context, rows), expected, rtol=0, atol=0)


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_warm_up_reports_its_cost_and_its_dummy_tokens_do_not_leak(mode, impl):
    warm, cold = make_runner(impl, mode, HF), make_runner(impl, mode, HF)
    stats = warm.warm_up()
    assert stats.compile_s > 0
    assert (stats.capture_s, stats.graph_gib, stats.capture_sizes) == (0.0, 0.0, ())  # CPU: no graphs
    prompts = _prompts([3, 5])
    logits = prefill_and_decode({"warm": warm, "cold": cold}, prompts, 2, leader="cold")
    for expected, actual in zip(logits["cold"], logits["warm"]):
        torch.testing.assert_close(actual, expected)


@pytest.mark.eager
@pytest.mark.parametrize("mode", ["no_inductor"])
def test_the_first_step_may_be_a_single_token_without_warm_up(mode, impl):
    runner, eager = make_runner(impl, mode, HF), make_runner(impl, "eager", HF)
    torch.testing.assert_close(runner.step([[5]], [0], [0]), eager.step([[5]], [0], [0]))


# ---------------------------------------------------------------------- bad input
BAD_STEPS = [
    pytest.param(
        [[1] * 21], [0], [0], r"a step takes 1..20 tokens \(max_num_batched_tokens\), got 21", id="too_many_tokens"
    ),
    pytest.param([], [], [], r"a step takes 1..20 tokens \(max_num_batched_tokens\), got 0", id="no_tokens"),
    pytest.param([[1, 2, 3]], [14], [0], r"seq_len \(17\) <= max_model_len \(16\)", id="past_max_model_len"),
    pytest.param(
        [[1], []], [0, 0], [0, 1], r"^new_tokens\[1\]: empty; a sequence takes at least one", id="empty_sequence"
    ),
    # what is not an int token id is named, never truncated to one (1.5 ran as id 1) nor a bare TypeError
    pytest.param([[1, 1.5]], [0], [0], r"^new_tokens\[0\]\[1\]: expected an int token id, got 1\.5$", id="float_id"),
    pytest.param([[True]], [0], [0], r"^new_tokens\[0\]\[0\]: expected an int token id, got True$", id="bool_id"),
    pytest.param([[float("nan")]], [0], [0], r"^new_tokens\[0\]\[0\]: expected an int token id", id="nan_id"),
    pytest.param([[2, None]], [0], [0], r"^new_tokens\[0\]\[1\]: expected an int token id, got None$", id="none_id"),
    pytest.param([1, 2], [0, 0], [0, 1], r"^new_tokens\[0\]: expected a list of token ids, got 1$", id="flat_list"),
    pytest.param([[1], [2]], [0], [0, 1], r"^new_tokens \(2\), context_lens \(1\) and rows \(2\): expected one entry "
                 "per sequence in each$", id="fewer_context_lens_than_sequences"),
    pytest.param([[1], [2]], [0, 0], [0], r"^new_tokens \(2\), context_lens \(2\) and rows \(1\): expected one",
                 id="fewer_rows_than_sequences"),
    pytest.param([[1]], [0, 0], [0], r"^new_tokens \(1\), context_lens \(2\) and rows \(1\): expected one",
                 id="more_context_lens_than_sequences"),
    pytest.param([[1]], [0], [2], r"rows: .*0\.\.1 \(max_num_seqs\), got \[2\]", id="row_past_max_num_seqs"),
    pytest.param([[1]], [0], [-1], r"rows: .*0\.\.1 \(max_num_seqs\), got \[-1\]", id="negative_row"),
    pytest.param([[1], [2]], [0, 0], [1, 1], r"rows: expected distinct .*got \[1, 1\]", id="two_sequences_one_row"),
    pytest.param(
        [[HF.vocab_size]],
        [0],
        [0],
        rf"^new_tokens\[0\]\[0\]: token id {HF.vocab_size} is outside the vocabulary, "
        rf"expected an int in 0\.\.{HF.vocab_size - 1}$",
        id="token_id_past_vocab",
    ),
    # the offending id and where it is, not the largest id of the step (5 here is valid)
    pytest.param(
        [[-2, 5]], [0], [0], r"^new_tokens\[0\]\[0\]: token id -2 is outside the vocabulary", id="negative_token_id"
    ),
    pytest.param(
        [[1], [2, 3, HF.vocab_size + 7]],
        [0, 0],
        [0, 1],
        rf"^new_tokens\[1\]\[2\]: token id {HF.vocab_size + 7} is outside",
        id="token_id_past_vocab_in_the_second_sequence",
    ),
]


@pytest.mark.eager
def test_numpy_integer_token_ids_are_token_ids(impl):
    runner = make_runner(impl, "eager", HF, max_num_seqs=2, max_model_len=16, max_num_batched_tokens=20)
    as_ints = runner.step([[5, 6]], [0], [1])
    torch.testing.assert_close(runner.step([[np.int64(5), np.int32(6)]], [0], [1]), as_ints, rtol=0, atol=0)


@pytest.mark.eager
@pytest.mark.parametrize("new_tokens, context_lens, rows, message", BAD_STEPS)
def test_a_bad_step_raises_value_error_naming_the_limit_and_leaves_the_runner_usable(
    new_tokens, context_lens, rows, message, impl
):
    runner = make_runner(impl, "eager", HF, max_num_seqs=2, max_model_len=16, max_num_batched_tokens=20)
    expected = runner.step([[5, 6]], [0], [1])
    with pytest.raises(ValueError, match=message):
        runner.step(new_tokens, context_lens, rows)
    torch.testing.assert_close(runner.step([[5, 6]], [0], [1]), expected, rtol=0, atol=0)


@pytest.mark.eager
@pytest.mark.parametrize("field", ["max_num_seqs", "max_model_len"])
def test_a_runner_needs_positive_sizes(field, impl):
    config = mode_config("eager")
    sizes = {"max_num_seqs": 2, "max_model_len": 16, field: 0}
    with pytest.raises(ValueError, match=f"{field}: expected a positive int, got 0"):
        runner_for(impl, build_llama(HF, config), config, **sizes)


@pytest.mark.eager
def test_a_runner_refuses_a_max_model_len_past_the_models_positions(impl):
    """The warm-up's dummy tokens reach position max_model_len - 1: past the rotary table, an IndexError from
    inside torch on a CPU and a device-side assert (a dead CUDA context) on a GPU. LLM checked it; the
    runner, which the suite and implementers drive directly, did not."""
    config = mode_config("eager")
    positions = HF.max_position_embeddings
    with pytest.raises(ValueError, match=rf"^max_model_len \({positions + 1}\) exceeds the model's max_position_emb"):
        runner_for(impl, build_llama(HF, config), config, max_num_seqs=1, max_model_len=positions + 1)


@pytest.mark.eager
def test_a_token_budget_larger_than_the_kv_cache_is_refused_naming_both(impl):
    """No step can hold more tokens than max_num_seqs x max_model_len; a larger budget would only show up as
    warm-up dummies that do not fit the cache."""
    config = mode_config("eager")
    sizes = {"max_num_seqs": 2, "max_model_len": 4, "max_num_batched_tokens": 64}
    message = r"max_num_batched_tokens \(64\) exceeds max_num_seqs x max_model_len \(2 x 4 = 8\)"
    with pytest.raises(ValueError, match=message):
        runner_for(impl, build_llama(HF, config), config, **sizes)


@pytest.mark.parametrize("mode", RUNNER_MODES)
def test_a_runner_of_one_token_per_step_warms_up_and_steps(mode, impl):
    """Compiled levels trace with 2 tokens; the runner pads that call even when steps hold one token."""
    runner = make_runner(impl, mode, HF, max_num_seqs=1, max_num_batched_tokens=1)
    runner.warm_up()
    assert runner.step([[5]], [0], [0]).shape == (1, HF.vocab_size)
