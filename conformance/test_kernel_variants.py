"""A step's sequence and token counts, and where its metadata sits in memory, never make Triton compile a
custom-op kernel again (issue 22): the piecewise modes' kernels compile once per model shape; the full
graph's variable-length attention once per search depth (a constexpr: the bit length of its entry count,
three depths at ``max_num_seqs=8``), the small-M GEMM once per row tile (16, 32, 64) and config.

Triton specialises an integer argument that equals 1 or is a multiple of 16, and a pointer that is 16-byte
aligned, into a separate compiled variant (``triton.runtime.jit``, ``specialize_impl``). Where that
argument is a count the capture sizes vary (sequences per step, GEMM rows) or a pointer the kernel only reads
scalars through (per-sequence metadata), every variant is a compile a cold start pays for nothing: a cold
8B ``no_inductor`` start on the H100 compiled prefill attention twice (1 sequence, then 8) and decode
attention twice (its ``seq_lens`` once at an 8-byte offset), 0.4-0.6 s each (perf/NOTES.md, v35). The
kernels mark those arguments ``do_not_specialize`` / ``do_not_specialize_on_alignment``; these tests launch
each kernel through its wrapper over such steps and require one compiled kernel for all of them.
"""

from __future__ import annotations

import pytest
import torch

from reference.ops.library import HAS_TRITON

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.requires("components"),
    pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed"),
]

COUNTS = (1, 3, 16, 17)  # Triton's value classes: == 1, neither, a multiple of 16, neither again
D, KV_HEADS, GROUP, ROWS, MAX_LEN = 64, 2, 4, 24, 64


def _compiled_kernels(monkeypatch, kernel) -> list:
    """Spy on ``kernel`` (a ``triton.JITFunction``): the list fills with the compiled kernel of each launch."""
    seen, run = [], kernel.run

    def spy(*args, **kwargs):
        compiled = run(*args, **kwargs)
        seen.append(compiled)
        return compiled

    monkeypatch.setattr(kernel, "run", spy)
    return seen


def _metadata(values: list[int], offset: int) -> torch.Tensor:
    """``values`` as int64 on the GPU, starting ``offset`` elements (8 bytes each) into its storage."""
    return torch.tensor([0] * offset + values, dtype=torch.int64, device="cuda")[offset:]


def _one_variant(seen: list, what: str) -> None:
    assert seen, f"{what}: the kernel was never launched"
    variants = {id(k) for k in seen}
    assert len(variants) == 1, f"{what}: {len(variants)} compiled variants for {len(seen)} launches of one shape"


@pytest.fixture
def attention_inputs():
    cache = torch.zeros(2, ROWS, MAX_LEN, KV_HEADS, D, device="cuda", dtype=torch.bfloat16)
    tokens = 2 * max(COUNTS)
    qkv = torch.randn(tokens, (KV_HEADS * GROUP + 2 * KV_HEADS) * D, device="cuda", dtype=torch.bfloat16)
    q, k, v = qkv.split([KV_HEADS * GROUP * D, KV_HEADS * D, KV_HEADS * D], dim=-1)
    return cache, q, k, v, torch.empty_like(q)


def test_rotary_compiles_once_for_every_token_count_and_positions_offset(monkeypatch, attention_inputs):
    from reference.ops import triton_kernels

    _, q, k, _, _ = attention_inputs
    cos_sin = torch.randn(MAX_LEN, D, device="cuda")  # [P, D] fp32: cos | sin
    seen = _compiled_kernels(monkeypatch, triton_kernels._rotary_kernel)
    for t in COUNTS:
        for offset in (0, 1):
            triton_kernels.rotary(_metadata(list(range(t)), offset), q[:t], k[:t], cos_sin, D)
    _one_variant(seen, "rotary")


def test_decode_attention_compiles_once_for_every_batch_and_metadata_offset(monkeypatch, attention_inputs):
    from reference.ops import triton_kernels

    cache, q, k, v, out = attention_inputs
    seen = _compiled_kernels(monkeypatch, triton_kernels._decode_attention_kernel)
    for b in COUNTS:
        for offset in (0, 1):
            rows, seq_lens = _metadata(list(range(b)), offset), _metadata([5] * b, offset)
            triton_kernels.decode_attention(q, k, v, cache, rows, seq_lens, out, D**-0.5, None, None)
    _one_variant(seen, "decode attention")


def test_prefill_attention_compiles_once_for_every_sequence_count_and_metadata_offset(monkeypatch, attention_inputs):
    from reference.ops import triton_kernels

    cache, q, _, _, out = attention_inputs
    seen = _compiled_kernels(monkeypatch, triton_kernels._prefill_attention_kernel)
    for b in COUNTS:
        for offset in (0, 1):
            # per sequence: first token, 2 queries, length 2, cache row (AttentionMetadata.varlen_tensor's rows)
            seqs = _metadata([2 * s for s in range(b)] + [2] * b + [2] * b + list(range(b)), offset).view(4, b)
            triton_kernels.prefill_attention(q, cache, seqs, 2, out, D**-0.5, None, None)
    _one_variant(seen, "prefill attention")


def test_full_graph_attention_kernels_compile_once_for_every_capacity_and_metadata_offset(
    monkeypatch, attention_inputs
):
    """The full graph's cache write and variable-length attention (``cudagraph_mode='full'``). Its search
    depth is a constexpr of the entry count's bit length, so the counts compared here share one (16, 17)."""
    from reference.ops import graph_attention_kernels as kernels

    cache, q, k, v, out = attention_inputs
    writes = _compiled_kernels(monkeypatch, kernels._write_kv_cache_kernel)
    attends = _compiled_kernels(monkeypatch, kernels._varlen_attention_kernel)
    for s in (16, 17):
        for offset in (0, 1):
            kernels.write_kv_cache(k[:s], v[:s], cache, _metadata([r * MAX_LEN for r in range(s)], offset))
            cu, lens, rows = _metadata(list(range(s + 1)), offset), _metadata([1] * s, offset), _metadata(
                list(range(s)), offset
            )
            kernels.varlen_attention(q, cache, cu, lens, rows, s, out, D**-0.5, None, None)
    _one_variant(writes, "write_kv_cache")
    _one_variant(attends, "varlen attention")


def test_small_m_linear_compiles_once_for_every_row_count_of_a_row_tile(monkeypatch):
    """Row counts 1-16 share the kernel's 16-row tile (``row_tile``); the count itself only masks rows."""
    from reference.ops import linear_kernels

    weight = torch.randn(256, 128, device="cuda", dtype=torch.bfloat16)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 1, "num_warps": 4}
    seen = _compiled_kernels(monkeypatch, linear_kernels._small_m_linear_kernel)
    for m in (1, 3, 16):
        linear_kernels.small_m_linear(torch.randn(m, 128, device="cuda", dtype=torch.bfloat16), weight, config=config)
    _one_variant(seen, "small-M linear")
