"""The Triton kernels behind the custom ops agree with the torch implementations they replace.

Tolerances: in fp32 both sides compute the same formula with different reduction orders, so they agree
to a few fp32 ulps (rtol 1e-5). In bf16 the kernels keep fp32 intermediates where torch rounds to bf16
after each op, so outputs may differ by one bf16 rounding step of the result (relative 2**-8 = 0.0039);
we allow 0.008 relative (two steps). Attention gets the same relative bound plus an absolute 2e-2: its output
is a weighted sum of unit-scale values, which can cancel to near zero, where the rounding of the terms (not
of the result) bounds the difference. The relative part matters where few keys are seen: a prompt's first
tokens attend to one or a few values, so an output can be 2-4 in magnitude, where two bf16 steps are 0.016-0.031
(an absolute bound alone failed there on the H200 at 2f873eb: 0.0234 at 2 of 212,480 elements). RoPE's
outputs can cancel to near zero, so its bf16 error is bounded by the pair it rotates, not by the output: see
``_assert_rotated_close``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from reference.ops import attention
from reference.ops.attention import attention_torch
from reference.ops.attention_metadata import AttentionMetadata
from reference.ops.layernorm import rms_norm_reference
from reference.ops.library import HAS_TRITON

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.requires("components"),
    pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed"),
]

DTYPES = {"fp32": (torch.float32, dict(rtol=1e-5, atol=1e-5)), "bf16": (torch.bfloat16, dict(rtol=8e-3, atol=8e-3))}


@pytest.fixture(params=list(DTYPES), ids=list(DTYPES))
def dtype_tol(request):
    return DTYPES[request.param]


def _attention_tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Triton's attention against the torch path (module doc): fp32 reduction order alone in fp32; in bf16 two
    rounding steps of the output, relative, plus 2e-2 absolute for outputs the weighted sum cancels."""
    return dict(rtol=0, atol=1e-5) if dtype == torch.float32 else dict(rtol=8e-3, atol=2e-2)


def _attention_layer(group: int, head_size: int, window: int | None, softcap: float | None):
    """What the attention kernels read of a layer: 2 KV heads, ``group`` query heads each, its cache attached
    by the caller."""
    return SimpleNamespace(num_kv_heads=2, num_heads=2 * group, head_size=head_size, scale=head_size**-0.5,
                           sliding_window=window, logits_soft_cap=softcap)  # fmt: skip


def _tk():
    from reference.ops import triton_kernels

    return triton_kernels


def _assert_rotated_close(actual, expected, rotated, head_size, dtype, tol):
    """RoPE outputs [T, H * D] against the torch path's, given ``rotated``, the pairs (x1, x2) both rotated.

    ``x1 cos - x2 sin`` may cancel, so a relative tolerance on the output does not hold in bf16. The error
    is bounded by S = |x1| + |x2| of the pair (each bf16 rounding is at most 2**-8 of its value, one ulp
    at most 2**-7): torch rounds the two products (2**-8 S), a norm in front may round its output one ulp
    apart for another reduction order (2 * 2**-8 S), and both sides round the result (2 * 2**-8 S). So the
    error divided by S is within 5 * 2**-8. In fp32 both sides round alike and the module's rtol holds.
    """
    if dtype == torch.float32:
        torch.testing.assert_close(actual, expected, **tol)
        return
    pairs = rotated.float().unflatten(-1, (-1, head_size)).abs()  # [T, H, D]
    x1, x2 = pairs.chunk(2, dim=-1)
    scale = torch.cat([x1 + x2, x1 + x2], dim=-1).flatten(-2).clamp_min(2**-24)  # S per output element
    error = (actual.float() - expected.float()) / scale
    torch.testing.assert_close(error, torch.zeros_like(error), rtol=0, atol=5 * 2**-8)


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["llama_norm", "gemma_norm"])
@pytest.mark.parametrize("hidden", [64, 4096, 5120 + 3])
def test_rms_norm_kernel_matches_torch(dtype_tol, offset, hidden):
    from reference.ops.layernorm import rms_norm_reference

    dtype, tol = dtype_tol
    x = torch.randn(13, hidden, device="cuda", dtype=dtype)
    res = torch.randn(13, hidden, device="cuda", dtype=dtype)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    torch.testing.assert_close(_tk().rms_norm(x, w, 1e-6, offset), rms_norm_reference(x, w, 1e-6, offset), **tol)
    out, res_out = _tk().rms_norm(x, w, 1e-6, offset, residual=res)
    torch.testing.assert_close(res_out, x + res, rtol=0, atol=0)  # the add rounds exactly like torch
    torch.testing.assert_close(out, rms_norm_reference(x + res, w, 1e-6, offset), **tol)


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["qwen3_qk_norm", "gemma_qk_norm"])
def test_per_head_rms_norm_reads_a_strided_view_in_place(dtype_tol, offset):
    """q of a fused qkv output as [T, heads, D] (Qwen3's and Gemma 3's q/k norms): the same values, bitwise,
    as the norm of a contiguous copy of its rows, which the model made before."""
    dtype, tol = dtype_tol
    qkv = torch.randn(7, 48 * 128, device="cuda", dtype=dtype)
    q = qkv[:, : 32 * 128].view(7, 32, 128)  # strides (48 * 128, 128, 1)
    weight = torch.randn(128, device="cuda", dtype=dtype)
    heads = _tk().rms_norm(q, weight, 1e-6, offset)
    assert heads.shape == (7, 32, 128) and heads.is_contiguous()
    torch.testing.assert_close(
        heads.view(-1, 128), _tk().rms_norm(q.reshape(-1, 128), weight, 1e-6, offset), rtol=0, atol=0
    )
    torch.testing.assert_close(heads, rms_norm_reference(q, weight, 1e-6, offset), **tol)


@pytest.mark.parametrize("gelu", [False, True], ids=["silu", "gelu_tanh"])
def test_gated_activation_kernel_matches_torch(dtype_tol, gelu):
    dtype, tol = dtype_tol
    x = torch.randn(7, 2 * 1400, device="cuda", dtype=dtype)
    gate, up = x.chunk(2, -1)
    act = F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)
    torch.testing.assert_close(_tk().gated_activation(x, gelu), act * up, **tol)


def test_rotary_kernel_matches_torch_on_strided_views(dtype_tol):
    from reference.ops.rotary import cos_sin_table, rotate_reference

    dtype, tol = dtype_tol
    d, heads = 128, 32
    cache = cos_sin_table(1.0 / (500000 ** (torch.arange(0, d, 2).float() / d)), 4096).cuda()
    qkv = torch.randn(9, (heads + 16) * d, device="cuda", dtype=dtype)
    q, k = qkv[:, : heads * d], qkv[:, heads * d : (heads + 8) * d]  # strided views, as the model passes them
    positions = torch.randint(0, 4096, (9,), device="cuda")
    rotated_q, rotated_k = _tk().rotary(positions, q, k, cache, d)  # q and k in one launch
    _assert_rotated_close(rotated_q, rotate_reference(positions, q, cache, d), q, d, dtype, tol)
    _assert_rotated_close(rotated_k, rotate_reference(positions, k, cache, d), k, d, dtype, tol)


@pytest.mark.parametrize("offset", [0.0, 1.0], ids=["qwen3_qk_norm", "gemma_qk_norm"])
def test_rotary_kernel_with_per_head_norms_matches_torch_and_the_two_kernels(dtype_tol, offset):
    """The q/k norms in front of RoPE, one launch: against the torch functions, and against the
    per-head RMSNorm kernel followed by the RoPE kernel (the launches it replaces)."""
    from reference.ops.rotary import cos_sin_table, qk_norm_rope_reference

    dtype, tol = dtype_tol
    d, heads, kv_heads = 128, 32, 8
    cache = cos_sin_table(1.0 / (1000000 ** (torch.arange(0, d, 2).float() / d)), 4096).cuda()
    qkv = torch.randn(9, (heads + 2 * kv_heads) * d, device="cuda", dtype=dtype)
    q, k = qkv[:, : heads * d], qkv[:, heads * d : (heads + kv_heads) * d]  # strided views
    q_w, k_w = (torch.randn(d, device="cuda", dtype=dtype) for _ in range(2))
    positions = torch.randint(0, 4096, (9,), device="cuda")
    fused_q, fused_k = _tk().rotary(positions, q, k, cache, d, (q_w, k_w, 1e-6, offset))
    want_q, want_k = qk_norm_rope_reference(positions, q, k, q_w, k_w, 1e-6, offset, cache, d)
    normed_q = _tk().rms_norm(q.view(9, heads, d), q_w, 1e-6, offset).view(9, -1)  # what RoPE rotates
    normed_k = _tk().rms_norm(k.view(9, kv_heads, d), k_w, 1e-6, offset).view(9, -1)
    _assert_rotated_close(fused_q, want_q, normed_q, d, dtype, tol)
    _assert_rotated_close(fused_k, want_k, normed_k, d, dtype, tol)
    two_q, two_k = _tk().rotary(positions, normed_q, normed_k, cache, d)
    _assert_rotated_close(fused_q, two_q, normed_q, d, dtype, tol)  # the norm's sum is taken in another order
    _assert_rotated_close(fused_k, two_k, normed_k, d, dtype, tol)


@pytest.mark.parametrize(
    "window,softcap", [(None, None), (7, None), (None, 30.0)], ids=["full", "sliding_window", "softcap"]
)
@pytest.mark.parametrize("group", [1, 4, 5])
@pytest.mark.parametrize("head_size", [64, 256])
def test_decode_attention_kernel_matches_torch_path(dtype_tol, window, softcap, group, head_size):
    """Cache write and attention, with padding rows, non-consecutive cache rows and ragged lengths; head size
    256 is Gemma 3's (its float32 tiles are four times bf16's at 64)."""

    dtype, _ = dtype_tol
    layer, d = _attention_layer(group, head_size, window, softcap), head_size
    rows, seq_lens, max_len = [3, 0, 5], [1, 37, 150], 160
    cache = torch.randn(2, 6, max_len, 2, d, device="cuda", dtype=dtype)
    qkv = torch.randn(8, (layer.num_heads + 4) * d, device="cuda", dtype=dtype)  # 3 real tokens + 5 padding rows
    q, k, v = qkv.split([layer.num_heads * d, 2 * d, 2 * d], dim=-1)
    md = AttentionMetadata.build([1, 1, 1], seq_lens, rows, max_len, "cuda")
    outs, caches = [], []
    for path in ("triton", "torch"):
        layer.kv_cache = cache.clone()
        out = torch.full((8, layer.num_heads * d), float("nan"), device="cuda", dtype=dtype)
        if path == "triton":
            _tk().decode_attention(
                q, k, v, layer.kv_cache, md.rows_tensor, md.seq_lens_tensor, out, layer.scale, window, softcap
            )
        else:
            attention_torch(layer, md, q, k, v, out)
        outs.append(out)
        caches.append(layer.kv_cache)
    torch.testing.assert_close(caches[0], caches[1], rtol=0, atol=0)
    assert outs[0][3:].isnan().all(), "padding rows must not be written"
    torch.testing.assert_close(outs[0][:3], outs[1][:3], **_attention_tolerance(dtype))


@pytest.mark.parametrize(
    "window,softcap",
    [(None, None), (7, None), (None, 30.0), (20, 30.0)],
    ids=["full", "sliding_window", "softcap", "window_and_softcap"],
)
@pytest.mark.parametrize("group", [1, 4, 5])
@pytest.mark.parametrize("head_size", [64, 256])
@pytest.mark.parametrize(
    "layout",
    [
        # a prompt from an empty cache longer than a query block, a chunk after cached context, a one-token
        # (decode) sequence and a short prompt: one variable-length launch
        ([70, 9, 1, 3], [0, 40, 100, 0], [3, 0, 5, 1]),
        # continuous batching's mixed step: two decodes first (the decode kernel), then prompt chunks
        ([1, 1, 70, 9, 3], [100, 20, 0, 40, 0], [5, 2, 3, 0, 1]),
    ],
    ids=["prefills", "decodes_first"],
)
def test_prefill_attention_kernel_matches_torch_path(dtype_tol, window, softcap, group, head_size, layout):
    """Attention of a step that is not a uniform decode, against the torch path; non-consecutive cache
    rows; three padding rows, which must not be written."""
    dtype, _ = dtype_tol
    layer, d = _attention_layer(group, head_size, window, softcap), head_size
    (query_lens, context, rows), max_len = layout, 160
    seq_lens = [c + q for c, q in zip(context, query_lens)]
    n = sum(query_lens)
    cache = torch.randn(2, 6, max_len, 2, d, device="cuda", dtype=dtype)
    qkv = torch.randn(n + 3, (layer.num_heads + 4) * d, device="cuda", dtype=dtype)
    q, k, v = qkv.split([layer.num_heads * d, 2 * d, 2 * d], dim=-1)
    md = AttentionMetadata.build(query_lens, seq_lens, rows, max_len, "cuda")
    _assert_kernels_match_torch_path(layer, cache, q, k, v, md, md, n)


@pytest.mark.parametrize(
    "window,softcap", [(None, None), (7, None), (20, 30.0)], ids=["full", "sliding_window", "window_and_softcap"]
)
@pytest.mark.parametrize("group", [1, 4, 5])
@pytest.mark.parametrize("head_size", [64, 256])
@pytest.mark.parametrize(
    "layout",
    [
        # a mixed step: decodes first, a prompt longer than a query block, a chunk after cached context, a
        # one-token sequence between prompts, a short prompt
        ([1, 1, 70, 9, 1, 3], [100, 20, 0, 40, 7, 0], [5, 2, 3, 0, 7, 1]),
        ([1, 1, 1], [100, 0, 33], [4, 6, 0]),  # a uniform decode step, which 'full' also serves
    ],
    ids=["mixed", "decodes"],
)
def test_graph_attention_kernels_match_torch_path(dtype_tol, window, softcap, group, head_size, layout):
    """What a full graph of any step runs (``cudagraph_mode='full'``): the cache write and the attention that
    read the static ``GraphTables``, padded past the step's tokens and sequences as a graph's key pads them
    (here 5 padding rows and 3 padding entries), against the torch path; padding rows must not be written."""
    from reference.ops.attention_metadata import GraphTables

    dtype, _ = dtype_tol
    layer, d = _attention_layer(group, head_size, window, softcap), head_size
    (query_lens, context, rows), max_len = layout, 160
    seq_lens = [c + q for c, q in zip(context, query_lens)]
    n, padded, capacity = sum(query_lens), sum(query_lens) + 5, len(rows) + 3
    cache = torch.randn(2, 8, max_len, 2, d, device="cuda", dtype=dtype)
    qkv = torch.randn(padded, (layer.num_heads + 4) * d, device="cuda", dtype=dtype)
    q, k, v = qkv.split([layer.num_heads * d, 2 * d, 2 * d], dim=-1)
    plain = AttentionMetadata.build(query_lens, seq_lens, rows, max_len, "cuda")
    flat = GraphTables.host_list(query_lens, seq_lens, rows, plain.slot_mapping.tolist(), padded, capacity)
    tables = GraphTables.from_flat(torch.tensor(flat, device="cuda"), padded, capacity)
    graph_md = AttentionMetadata.build(query_lens, seq_lens, rows, max_len, "cuda")
    graph_md.graph_tables = tables
    _assert_kernels_match_torch_path(layer, cache, q, k, v, graph_md, plain, n)


def _assert_kernels_match_torch_path(layer, cache, q, k, v, kernels_md, torch_md, n):
    """Attention through ``attention.attention_impl`` (looked up here, where a planted fault replaces it) with
    ``kernels_md`` and through the torch path with ``torch_md``, each on a copy of ``cache`` and into an output
    of NaNs as long as q: the caches equal, the first ``n`` rows close, the padding rows after them unwritten."""
    outs, caches = [], []
    for impl, md in ((attention.attention_impl, kernels_md), (attention_torch, torch_md)):
        layer.kv_cache = cache.clone()
        out = torch.full(q.shape, float("nan"), device=q.device, dtype=q.dtype)
        impl(layer, md, q, k, v, out)
        outs.append(out)
        caches.append(layer.kv_cache)
    torch.testing.assert_close(caches[0], caches[1], rtol=0, atol=0)
    assert outs[0][n:].isnan().all(), "padding rows must not be written"
    torch.testing.assert_close(outs[0][:n], outs[1][:n], **_attention_tolerance(q.dtype))
