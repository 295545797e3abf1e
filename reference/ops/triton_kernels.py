"""Triton kernels behind the custom ops on CUDA: one launch where the native code takes several.

Each kernel reproduces its op's native rounding points (transformers' order of casts) where that is cheap,
so the custom and native paths differ only by reduction order and fp32-vs-bf16 intermediate rounding;
the conformance suite bounds the difference. Importing this module needs Triton; the op modules import
it only when it is available (see :func:`reference.ops.library.kernel_backend`).

Triton compiles a kernel again for each class of an integer argument (1, a multiple of 16, other) and each
alignment of a pointer (``specialize_impl`` in ``triton.runtime.jit``). Counts a step's shape varies (its
sequences) and pointers a kernel reads scalars through (per-sequence metadata) are therefore left out of it
(``do_not_specialize``, ``do_not_specialize_on_alignment``), here and in the modules beside this one, so that
a cold start compiles each kernel once per model shape (conformance/test_kernel_variants.py; perf/NOTES.md v35).

Every kernel here and in the modules beside this one launches through :func:`reference.ops.kernel_launch.launcher`,
so that the runner's kernel warm-up can compile a step's kernels on a pool of threads without launching them.

With ``REFERENCE_PDL=1`` on Hopper and newer GPUs, every kernel here and in the modules beside this one launches with
programmatic dependent launch and waits for the kernel before it at its top (``_await_inputs``;
:mod:`reference.ops.dependent_launch`, off by default: it measured slower).

Kernels:
* ``rms_norm`` / ``fused_add_rms_norm``: one program per token row (H <= 16384).
* ``gated_activation``: SiLU- or GELU(tanh)-and-mul, one program per (row, block of I).
* ``rotary``: neox RoPE of q and k in one launch, one program per token, optionally after a per-head
  RMSNorm of each (Qwen3's and Gemma 3's q/k norms) in the same launch.
* ``decode_attention``: for one new token per sequence, writes its key/value into the KV cache and
  attends over the cached context, one program per (sequence, KV head) handling the KV head's whole
  query group (a sequence of length 0 is a full graph's padding: nothing is written to its cache row and
  its output is 0), with an online softmax over key blocks (Milakov & Gimelshein, "Online normalizer
  calculation for softmax", 2018; the same recurrence as FlashAttention, Dao et al. 2022).
* ``prefill_attention``: causal attention of every sequence of a prefill or mixed step over its cache row
  (keys already written), all sequences in one launch: one program per (sequence, block of queries,
  query head), the same online softmax, with sliding window and softcap.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.ops import dependent_launch, kernel_launch


def _launch_params(block: int) -> int:
    return 4 if block <= 1024 else 8 if block <= 4096 else 16


@triton.jit
def _await_inputs(PDL: tl.constexpr):
    """Under programmatic dependent launch (PDL, :mod:`reference.ops.dependent_launch`): wait until the kernel
    before this one has completed and its writes are visible, then let the kernel after this one be scheduled.
    Every kernel here calls it before its first global memory access; without PDL it is nothing."""
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()


# ---------------------------------------------------------------------------------------------- RMSNorm
@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    x_stride, x_head_stride, heads, res_stride, hidden, eps, weight_offset,
    HAS_RESIDUAL: tl.constexpr, OFFSET_STYLE: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    _await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)  # token row * heads + head
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden
    x = tl.load(x_ptr + (row // heads) * x_stride + (row % heads) * x_head_stride + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        r = tl.load(res_ptr + row * res_stride + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # the add rounds to the activation dtype
        tl.store(res_out_ptr + row * hidden + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x32 * x32, axis=0) / hidden + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if OFFSET_STYLE:  # Gemma: (1 + w) applied in fp32, one rounding at the end
        y = x32 * rstd * (w + weight_offset)
    else:  # Llama: normalise, round to the activation dtype, then multiply by w (rounds again)
        y = (x32 * rstd).to(x.dtype).to(tl.float32) * w
    tl.store(out_ptr + row * hidden + cols, y.to(x.dtype), mask=mask)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float, residual=None):
    """x, residual: [T, H] (last dim contiguous), or x alone [T, heads, H] (per-head norms of a strided view,
    e.g. q of a fused qkv output, read in place); weight [H]. Returns out, contiguous in x's shape (and
    residual_out [T, H])."""
    t, heads, h = (x.shape[0], 1, x.shape[1]) if x.dim() == 2 else x.shape
    head_stride = x.stride(1) if x.dim() == 3 else 0
    block = triton.next_power_of_2(h)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    res_out = torch.empty_like(out) if residual is not None else out
    res = residual if residual is not None else x
    if t * heads:
        pdl = dependent_launch.enabled(x.device)
        kernel_launch.launcher(_rms_norm_kernel, (t * heads,))(
            x, res, weight, out, res_out, x.stride(0), head_stride, heads, res.stride(0), h, eps, weight_offset,
            HAS_RESIDUAL=residual is not None, OFFSET_STYLE=weight_offset != 0.0, BLOCK=block, PDL=pdl,
            num_warps=_launch_params(block), launch_pdl=pdl,
        )
    return (out, res_out) if residual is not None else out


# ------------------------------------------------------------------------------------ gated activation
@triton.jit
def _gated_kernel(x_ptr, out_ptr, x_stride, inter, GELU: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    _await_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * x_stride + cols, mask=mask, other=0.0)
    up = tl.load(x_ptr + row * x_stride + inter + cols, mask=mask, other=0.0)
    g = gate.to(tl.float32)
    if GELU:  # tanh approximation; tanh(y) = 2 * sigmoid(2y) - 1
        y = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        act = 0.5 * g * (2.0 / (1.0 + tl.exp(-2.0 * y)))
    else:
        act = g / (1.0 + tl.exp(-g))
    act = act.to(gate.dtype).to(tl.float32)  # the activation rounds before the product, as in torch
    tl.store(out_ptr + row * inter + cols, (act * up.to(tl.float32)).to(gate.dtype), mask=mask)


def gated_activation(x: torch.Tensor, gelu: bool) -> torch.Tensor:
    """x: [T, 2I] -> [T, I]: act(x[:, :I]) * x[:, I:], act = SiLU or GELU(tanh)."""
    t, two_i = x.shape
    inter = two_i // 2
    out = torch.empty((t, inter), dtype=x.dtype, device=x.device)
    block = min(1024, triton.next_power_of_2(inter))
    if t:
        pdl = dependent_launch.enabled(x.device)
        kernel_launch.launcher(_gated_kernel, (t, triton.cdiv(inter, block)))(
            x, out, x.stride(0), inter, GELU=gelu, BLOCK=block, PDL=pdl, num_warps=4, launch_pdl=pdl
        )
    return out


# ---------------------------------------------------------------------------------------------- RoPE
@triton.jit
def _rotate_heads(
    x_ptr, out_ptr, w_ptr, tok, cos, sin, x_stride, heads, d, eps, weight_offset,
    HALF: tl.constexpr, BLOCK_H: tl.constexpr, NORM: tl.constexpr, OFFSET_STYLE: tl.constexpr,
):
    """Rotate one token's ``heads`` heads of x (row ``tok``, row stride ``x_stride``) into out (contiguous);
    with NORM, RMS-normalise each head first, rounding where ``_rms_norm_kernel`` does."""
    h = tl.arange(0, BLOCK_H)
    offs = h[:, None] * (2 * HALF) + d[None, :]  # [BLOCK_H, HALF]
    mask = h[:, None] < heads
    x1 = tl.load(x_ptr + tok * x_stride + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + tok * x_stride + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    if NORM:
        rstd = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF) + eps)[:, None]
        w1 = tl.load(w_ptr + d).to(tl.float32)[None, :]
        w2 = tl.load(w_ptr + HALF + d).to(tl.float32)[None, :]
        if OFFSET_STYLE:  # Gemma: (1 + w) in fp32, one rounding
            x1 = (x1 * rstd * (w1 + weight_offset)).to(dtype).to(tl.float32)
            x2 = (x2 * rstd * (w2 + weight_offset)).to(dtype).to(tl.float32)
        else:  # Qwen3: normalise, round, multiply by w, round
            x1 = ((x1 * rstd).to(dtype).to(tl.float32) * w1).to(dtype).to(tl.float32)
            x2 = ((x2 * rstd).to(dtype).to(tl.float32) * w2).to(dtype).to(tl.float32)
    out = out_ptr + tok * heads * 2 * HALF + offs
    tl.store(out, (x1 * cos[None, :] - x2 * sin[None, :]).to(dtype), mask=mask)
    tl.store(out + HALF, (x2 * cos[None, :] + x1 * sin[None, :]).to(dtype), mask=mask)


@triton.jit(do_not_specialize_on_alignment=["pos_ptr"])
def _rotary_kernel(
    pos_ptr, q_ptr, k_ptr, q_out_ptr, k_out_ptr, cache_ptr, q_w_ptr, k_w_ptr,
    q_stride, k_stride, q_heads, k_heads, cache_stride, eps, weight_offset,
    HALF: tl.constexpr, BLOCK_QH: tl.constexpr, BLOCK_KH: tl.constexpr, NORM: tl.constexpr,
    OFFSET_STYLE: tl.constexpr, PDL: tl.constexpr,
):
    _await_inputs(PDL)
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + tok)
    d = tl.arange(0, HALF)
    cos = tl.load(cache_ptr + pos * cache_stride + d).to(q_ptr.dtype.element_ty).to(tl.float32)
    sin = tl.load(cache_ptr + pos * cache_stride + HALF + d).to(q_ptr.dtype.element_ty).to(tl.float32)
    _rotate_heads(
        q_ptr, q_out_ptr, q_w_ptr, tok, cos, sin, q_stride, q_heads, d, eps, weight_offset,
        HALF, BLOCK_QH, NORM, OFFSET_STYLE,
    )
    _rotate_heads(
        k_ptr, k_out_ptr, k_w_ptr, tok, cos, sin, k_stride, k_heads, d, eps, weight_offset,
        HALF, BLOCK_KH, NORM, OFFSET_STYLE,
    )


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cache: torch.Tensor,
    head_size: int,
    norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [T, Hq * D], k: [T, Hkv * D] (last dims contiguous, rows may be strided) rotated at positions [T]
    in one launch; cache [P, D] fp32 (cos | sin). ``norm = (q_weight [D], k_weight [D], eps,
    weight_offset)`` RMS-normalises each head of q and k first (Qwen3, Gemma 3), in the same launch.
    Returns contiguous (q, k) in the inputs' dtype."""
    t = q.shape[0]
    q_heads, k_heads = q.shape[1] // head_size, k.shape[1] // head_size
    q_out = torch.empty((t, q.shape[1]), dtype=q.dtype, device=q.device)
    k_out = torch.empty((t, k.shape[1]), dtype=k.dtype, device=k.device)
    q_w, k_w, eps, offset = norm if norm is not None else (q, k, 0.0, 0.0)  # weights unread without NORM
    if t:
        pdl = dependent_launch.enabled(q.device)
        kernel_launch.launcher(_rotary_kernel, (t,))(
            positions, q, k, q_out, k_out, cache, q_w, k_w, q.stride(0), k.stride(0), q_heads, k_heads,
            cache.stride(0), eps, offset,
            HALF=head_size // 2, BLOCK_QH=triton.next_power_of_2(q_heads), BLOCK_KH=triton.next_power_of_2(k_heads),
            NORM=norm is not None, OFFSET_STYLE=offset != 0.0, PDL=pdl, num_warps=4, launch_pdl=pdl,
        )
    return q_out, k_out


# ---------------------------------------------------------------------------------- attention, shared
@triton.jit
def _scores(q, k, scale, softcap, SOFTCAP: tl.constexpr, IEEE: tl.constexpr):
    """q [M, D] . k [N, D]^T x scale, soft-capped (Gemma 2/3: softcap x tanh(s / softcap)): [M, N] fp32."""
    if IEEE:  # fp32 inputs: exact fp32 products instead of tf32
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    else:
        s = tl.dot(q, tl.trans(k)) * scale
    if SOFTCAP:
        s = softcap * (2.0 / (1.0 + tl.exp(-2.0 * s / softcap)) - 1.0)
    return s


@triton.jit
def _online_softmax_step(acc, m_i, l_i, s, v, IEEE: tl.constexpr):
    """Fold one block of keys into a running softmax(s) @ v (the online softmax of Milakov & Gimelshein,
    2018, as FlashAttention uses it): s [M, N] masked scores (-inf where not allowed), v [N, D]; acc
    [M, D], m_i (running max) and l_i (running sum) [M], fp32. A row with no allowed key so far keeps
    acc = l_i = 0 (its max is taken as 0, so exp(-inf - 0) = 0 instead of NaN)."""
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe[:, None])
    alpha = tl.exp(m_i - m_safe)
    if IEEE:
        pv = tl.dot(p, v, input_precision="ieee")
    else:
        pv = tl.dot(p.to(v.dtype), v)
    return acc * alpha[:, None] + pv, m_new, l_i * alpha + tl.sum(p, axis=1)


# ---------------------------------------------------------------------------------- decode attention
@triton.jit(do_not_specialize_on_alignment=["rows_ptr", "seq_lens_ptr"])
def _decode_attention_kernel(
    q_ptr, k_ptr, v_ptr, cache_ptr, rows_ptr, seq_lens_ptr, out_ptr,
    q_stride, k_stride, v_stride, out_stride,
    c_kv, c_row, c_pos, c_head,  # KV-cache strides: [2, R, L, Hkv, D]
    scale, softcap, window,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr, ZERO_PADDING: tl.constexpr, PDL: tl.constexpr,
):
    _await_inputs(PDL)
    seq = tl.program_id(0).to(tl.int64)
    kvh = tl.program_id(1).to(tl.int64)
    row = tl.load(rows_ptr + seq).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + seq).to(tl.int64)
    d = tl.arange(0, D)
    k_cache = cache_ptr + row * c_row + kvh * c_head
    v_cache = k_cache + c_kv

    # 1. append this step's key and value at position seq_len - 1 (none for padding, seq_len 0)
    real = (d < D) & (seq_len > 0)
    new_k = tl.load(k_ptr + seq * k_stride + kvh * D + d)
    new_v = tl.load(v_ptr + seq * v_stride + kvh * D + d)
    tl.store(k_cache + (seq_len - 1) * c_pos + d, new_k, mask=real)
    tl.store(v_cache + (seq_len - 1) * c_pos + d, new_v, mask=real)
    tl.debug_barrier()  # make the stores visible to the whole program before reading the cache

    # 2. attend: the GROUP query heads of this KV head are the rows of one tile
    g = tl.arange(0, GROUP_PAD)
    q = tl.load(q_ptr + seq * q_stride + (kvh * GROUP + g[:, None]) * D + d[None, :], mask=g[:, None] < GROUP, other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, D], tl.float32)
    start = 0
    if WINDOW:
        start = tl.maximum(seq_len - window, 0)
    for n0 in range(start, seq_len, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        valid = n < seq_len
        k = tl.load(k_cache + n[:, None] * c_pos + d[None, :], mask=valid[:, None], other=0.0)
        s = _scores(q, k, scale, softcap, SOFTCAP, IEEE)  # [GROUP_PAD, BLOCK_N]
        s = tl.where(valid[None, :], s, float("-inf"))
        v = tl.load(v_cache + n[:, None] * c_pos + d[None, :], mask=valid[:, None], other=0.0)
        acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, IEEE)
    out = tl.where(l_i[:, None] > 0, acc / l_i[:, None], 0.0)  # l_i is 0 only for padding
    keep = g[:, None] < GROUP
    if not ZERO_PADDING:  # a padding entry's row belongs to another kernel's token: leave it
        keep = keep & (seq_len > 0)
    tl.store(out_ptr + seq * out_stride + (kvh * GROUP + g[:, None]) * D + d[None, :], out.to(out_ptr.dtype.element_ty),
             mask=keep)  # fmt: skip


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kv_cache: torch.Tensor,
    rows: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
    zero_padding: bool = True,
) -> None:
    """One decode token per sequence: write k, v into the cache, attention into ``out``.

    q, out: [>= B, Hq * D]; k, v: [>= B, Hkv * D] (rows may be strided views; last dim contiguous);
    kv_cache: [2, R, L, Hkv, D]; rows, seq_lens: [B] int64 (length after this step; 0 marks a padding
    entry, whose output row is 0, or left as it is with ``zero_padding=False``: in a full graph of a mixed
    step that row is another sequence's token). Only the first B rows of q/k/v/out are used (the rest is
    CUDA-graph padding).
    """
    b = rows.shape[0]
    _, _, _, kv_heads, d = kv_cache.shape
    group = q.shape[1] // (kv_heads * d)
    pdl = dependent_launch.enabled(q.device)
    kernel_launch.launcher(_decode_attention_kernel, (b, kv_heads))(
        q, k, v, kv_cache, rows, seq_lens, out,
        q.stride(0), k.stride(0), v.stride(0), out.stride(0),
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale, softcap or 0.0, sliding_window or 0,
        GROUP=group, GROUP_PAD=max(16, triton.next_power_of_2(group)), D=d, BLOCK_N=64 if d <= 128 else 32,
        SOFTCAP=softcap is not None, WINDOW=sliding_window is not None, IEEE=q.dtype == torch.float32,
        ZERO_PADDING=zero_padding, PDL=pdl, num_warps=4 if d <= 128 else 8, launch_pdl=pdl,
    )


# --------------------------------------------------------------------------------- prefill attention
@triton.jit(do_not_specialize=["num_seqs"], do_not_specialize_on_alignment=["seqs_ptr"])
def _prefill_attention_kernel(
    q_ptr, cache_ptr, out_ptr, seqs_ptr,
    q_stride, out_stride, num_seqs,
    c_kv, c_row, c_pos, c_head,  # KV-cache strides: [2, R, L, Hkv, D]
    scale, softcap, window,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):
    _await_inputs(PDL)
    seq = tl.program_id(0).to(tl.int64)
    m0 = tl.program_id(1) * BLOCK_M
    qh = tl.program_id(2).to(tl.int64)
    # seqs: [4, num_seqs] int64 rows: first token in the batch, query length, sequence length, cache row
    q_start = tl.load(seqs_ptr + seq)
    q_len = tl.load(seqs_ptr + num_seqs + seq)
    seq_len = tl.load(seqs_ptr + 2 * num_seqs + seq)
    row = tl.load(seqs_ptr + 3 * num_seqs + seq)
    if m0 < q_len:  # blocks past this sequence's queries have nothing to do
        d = tl.arange(0, D)
        offs_m = m0 + tl.arange(0, BLOCK_M)  # query index within the sequence
        valid_m = offs_m < q_len
        q_pos = seq_len - q_len + offs_m  # the queries' positions
        tokens = q_start + offs_m
        q = tl.load(q_ptr + tokens[:, None] * q_stride + qh * D + d[None, :], mask=valid_m[:, None], other=0.0)
        k_cache = cache_ptr + row * c_row + (qh // GROUP) * c_head
        v_cache = k_cache + c_kv
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, D], tl.float32)
        hi = seq_len - q_len + tl.minimum(m0 + BLOCK_M, q_len)  # past the block's last query: causal
        lo = 0
        if WINDOW:
            lo = tl.maximum(seq_len - q_len + m0 - window + 1, 0)
        for n0 in range(lo, hi, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            k = tl.load(k_cache + n[:, None] * c_pos + d[None, :], mask=(n < hi)[:, None], other=0.0)
            s = _scores(q, k, scale, softcap, SOFTCAP, IEEE)  # [BLOCK_M, BLOCK_N]
            allowed = (n[None, :] <= q_pos[:, None]) & (n[None, :] < hi)
            if WINDOW:
                allowed = allowed & (n[None, :] > q_pos[:, None] - window)
            s = tl.where(allowed, s, float("-inf"))  # a row may have no key yet in its window
            v = tl.load(v_cache + n[:, None] * c_pos + d[None, :], mask=(n < hi)[:, None], other=0.0)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, IEEE)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # every real query sees at least itself
        tl.store(
            out_ptr + tokens[:, None] * out_stride + qh * D + d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=valid_m[:, None],
        )


def prefill_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    seqs: torch.Tensor,
    max_query_len: int,
    out: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
) -> None:
    """Causal attention of every sequence's new tokens over its cached keys, all sequences in one launch.

    The keys and values of this step must already be in the cache. q, out: [>= T, Hq * D] (rows may be
    strided views; last dim contiguous); kv_cache: [2, R, L, Hkv, D]; seqs: [4, B] int64, per sequence the
    index of its first token in q, its query length, its length after this step, and its cache row;
    ``max_query_len``: the longest query (sizes the grid). Query ``i`` of a sequence of length ``L`` and
    query length ``Q`` sits at position ``L - Q + i`` and sees keys ``j <= L - Q + i`` (and, with a sliding
    window ``W``, ``j > L - Q + i - W``). One program per (sequence, block of queries, query head), an
    online softmax over key blocks (FlashAttention's recurrence, Dao et al. 2022, for variable lengths as
    in its ``varlen`` interface). Rows of q past the sequences' tokens are not read, those of out not written.
    """
    num_seqs = seqs.shape[1]
    _, _, _, kv_heads, d = kv_cache.shape
    heads = q.shape[1] // d
    block_m = 64 if d <= 128 else 32
    block_n = 64 if d <= 64 else 32
    grid = (num_seqs, triton.cdiv(max_query_len, block_m), heads)
    pdl = dependent_launch.enabled(q.device)
    kernel_launch.launcher(_prefill_attention_kernel, grid)(
        q, kv_cache, out, seqs,
        q.stride(0), out.stride(0), num_seqs,
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale, softcap or 0.0, sliding_window or 0,
        GROUP=heads // kv_heads, D=d, BLOCK_M=block_m, BLOCK_N=block_n,
        SOFTCAP=softcap is not None, WINDOW=sliding_window is not None, IEEE=q.dtype == torch.float32, PDL=pdl,
        num_warps=4 if d <= 128 else 8, launch_pdl=pdl,
    )
