"""Triton attention for a full CUDA graph of any step: launches sized by the padded token count alone.

A CUDA graph replays its kernels with the grids and arguments they were captured with, so a kernel inside
a full graph may read a step's metadata only from device buffers whose addresses never change, and its
grid may depend only on what the graph's key fixes: the padded token count ``T`` and the most sequences a
step of ``T`` tokens can hold, ``S``. The kernels of :mod:`reference.ops.triton_kernels` size their grids
by host values of the step (``decode_attention`` by its sequence count, ``prefill_attention`` by its
longest query), which is why they serve full graphs of uniform decode steps only. These two do not:

* ``write_kv_cache``: the keys and values of ``T`` token rows into their cache slots, one program per row;
  a slot of -1 (a padding row) writes nothing.
* ``varlen_attention``: causal attention of every sequence's new tokens over its cache row, prefills,
  prompt chunks and decodes alike, in one launch of ``T // BLOCK_Q + S`` programs per KV head (an entry of
  length 0 is skipped: the attention op gives it the step's decodes, which the decode kernel serves). Program
  ``p`` serves the sequence ``s`` whose range ``[cu[s] // BLOCK_Q + s, cu[s + 1] // BLOCK_Q + s + 1)``
  holds it (a binary search over the query offsets ``cu``): a sequence of ``Q`` queries has at least
  ``ceil(Q / BLOCK_Q)`` programs there, and a padding entry (``Q = 0``) one program that returns at once.
  This is the block-to-sequence mapping of vLLM's Triton "unified attention" backend, written afresh. Each
  program takes ``BLOCK_Q`` queries of its sequence times the ``GROUP`` query heads of one KV head as the
  rows of one tile, so a KV head's keys are read once for its whole group, as in the decode kernel, with
  the online softmax of FlashAttention (Dao et al., 2022) over key blocks.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference.ops import dependent_launch, kernel_launch
from reference.ops.triton_kernels import _await_inputs, _online_softmax_step, _scores


@triton.jit(do_not_specialize_on_alignment=["slots_ptr"])
def _write_kv_cache_kernel(
    k_ptr, v_ptr, cache_ptr, slots_ptr, k_stride, v_stride, c_kv, c_pos,
    WIDTH: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _await_inputs(PDL)
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        offs = tl.arange(0, BLOCK)
        mask = offs < WIDTH
        k = tl.load(k_ptr + t * k_stride + offs, mask=mask)
        v = tl.load(v_ptr + t * v_stride + offs, mask=mask)
        tl.store(cache_ptr + slot * c_pos + offs, k, mask=mask)
        tl.store(cache_ptr + c_kv + slot * c_pos + offs, v, mask=mask)


def write_kv_cache(k: torch.Tensor, v: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor) -> None:
    """Write row ``t`` of k and v to cache slot ``slots[t]`` (flat ``row * L + position``) for every ``t``.

    k, v: [>= T, Hkv * D] (rows may be strided views; last dim contiguous); kv_cache: [2, R, L, Hkv, D], its
    R, L, Hkv and D dims contiguous; slots: [T] int64, -1 for a row that writes nothing (padding).

    Raises:
        ValueError: a cache whose (row, position) slots are not evenly strided.
    """
    _, rows, length, kv_heads, d = kv_cache.shape
    if kv_cache.stride()[1:] != (length * kv_heads * d, kv_heads * d, d, 1):
        raise ValueError(f"kv_cache: expected contiguous [R, L, Hkv, D] planes, got strides {kv_cache.stride()}")
    width = kv_heads * d
    pdl = dependent_launch.enabled(k.device)
    kernel_launch.launcher(_write_kv_cache_kernel, (slots.shape[0],))(
        k, v, kv_cache, slots, k.stride(0), v.stride(0), kv_cache.stride(0), kv_cache.stride(2),
        WIDTH=width, BLOCK=triton.next_power_of_2(width), PDL=pdl, launch_pdl=pdl,
    )  # fmt: skip


@triton.jit(do_not_specialize=["num_seqs"], do_not_specialize_on_alignment=["cu_ptr", "seq_lens_ptr", "rows_ptr"])
def _varlen_attention_kernel(
    q_ptr, cache_ptr, out_ptr, cu_ptr, seq_lens_ptr, rows_ptr,
    q_stride, out_stride, num_seqs,
    c_kv, c_row, c_pos, c_head,  # KV-cache strides: [2, R, L, Hkv, D]
    scale, softcap, window,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, D: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
    SEARCH_STEPS: tl.constexpr, SOFTCAP: tl.constexpr, WINDOW: tl.constexpr, IEEE: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    _await_inputs(PDL)
    p = tl.program_id(0)
    kvh = tl.program_id(1).to(tl.int64)
    # the sequence of program p: the last s with cu[s] // BLOCK_Q + s <= p (cu[0] = 0, so s = 0 qualifies)
    lo = p * 0
    hi = lo + num_seqs
    for _ in tl.static_range(SEARCH_STEPS):
        mid = (lo + hi) // 2
        at_or_before = tl.load(cu_ptr + mid) // BLOCK_Q + mid <= p
        lo = tl.where(at_or_before, mid, lo)
        hi = tl.where(at_or_before, hi, mid)
    seq = lo.to(tl.int64)
    q_start = tl.load(cu_ptr + seq)
    q_len = tl.load(cu_ptr + seq + 1) - q_start
    m0 = (p - (q_start // BLOCK_Q + seq)) * BLOCK_Q  # this program's first query within the sequence
    seq_len = tl.load(seq_lens_ptr + seq)
    if (m0 < q_len) & (seq_len > 0):  # length 0: padding, or rows another kernel serves
        row = tl.load(rows_ptr + seq)
        d = tl.arange(0, D)
        r = tl.arange(0, BLOCK_Q * GROUP_PAD)  # tile row: query m0 + r // GROUP_PAD, head r % GROUP_PAD
        offs_m = m0 + r // GROUP_PAD
        head = r % GROUP_PAD
        valid_m = (offs_m < q_len) & (head < GROUP)
        q_pos = seq_len - q_len + offs_m  # the queries' positions
        tokens = q_start + offs_m
        heads = kvh * GROUP + head
        q_offs = tokens[:, None] * q_stride + heads[:, None] * D + d[None, :]
        q = tl.load(q_ptr + q_offs, mask=valid_m[:, None], other=0.0)
        k_cache = cache_ptr + row * c_row + kvh * c_head
        v_cache = k_cache + c_kv
        m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
        acc = tl.zeros([BLOCK_Q * GROUP_PAD, D], tl.float32)
        hi_k = seq_len - q_len + tl.minimum(m0 + BLOCK_Q, q_len)  # past the block's last query: causal
        lo_k = seq_len * 0
        if WINDOW:
            lo_k = tl.maximum(seq_len - q_len + m0 - window + 1, 0)
        for n0 in range(lo_k, hi_k, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            k = tl.load(k_cache + n[:, None] * c_pos + d[None, :], mask=(n < hi_k)[:, None], other=0.0)
            s = _scores(q, k, scale, softcap, SOFTCAP, IEEE)  # [BLOCK_Q * GROUP_PAD, BLOCK_N]
            allowed = (n[None, :] <= q_pos[:, None]) & (n[None, :] < hi_k)
            if WINDOW:
                allowed = allowed & (n[None, :] > q_pos[:, None] - window)
            s = tl.where(allowed, s, float("-inf"))
            v = tl.load(v_cache + n[:, None] * c_pos + d[None, :], mask=(n < hi_k)[:, None], other=0.0)
            acc, m_i, l_i = _online_softmax_step(acc, m_i, l_i, s, v, IEEE)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # every real query sees at least itself
        out_offs = tokens[:, None] * out_stride + heads[:, None] * D + d[None, :]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=valid_m[:, None])


def varlen_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    cu_query_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    rows: torch.Tensor,
    num_tokens: int,
    out: torch.Tensor,
    scale: float,
    sliding_window: int | None,
    softcap: float | None,
) -> None:
    """Causal attention of every sequence's new tokens over its cache row (keys of this step already
    written), in one launch whose grid depends only on ``num_tokens`` and the number of entries ``S``.

    q, out: [>= num_tokens, Hq * D] (rows may be strided views; last dim contiguous); kv_cache: [2, R, L,
    Hkv, D]; S below is this launch's number of entries (a graph's ``GraphTables`` give it its capacity + 1:
    a gap entry first); cu_query_lens: [S + 1] int64, sequence ``s``'s queries are rows ``cu[s] .. cu[s + 1] - 1`` of q
    (non-decreasing, ``cu[0] = 0``, ``cu[S] <= num_tokens``; an entry with no queries is padding);
    seq_lens, rows: [S] int64, each sequence's length after this step (0: skipped, its rows untouched) and
    its cache row. Query ``i`` of a
    sequence of length ``L`` with ``Q`` queries sits at position ``L - Q + i`` and sees keys ``j <= L - Q +
    i`` (and, with a sliding window ``W``, ``j > L - Q + i - W``). Rows of out that no sequence's query
    covers are not written.
    """
    num_seqs = rows.shape[0]
    _, _, _, kv_heads, d = kv_cache.shape
    group = q.shape[1] // (kv_heads * d)
    group_pad = triton.next_power_of_2(group)
    block_q = max(1, (64 if d <= 128 else 32) // group_pad)
    grid = (num_tokens // block_q + num_seqs, kv_heads)
    pdl = dependent_launch.enabled(q.device)
    kernel_launch.launcher(_varlen_attention_kernel, grid)(
        q, kv_cache, out, cu_query_lens, seq_lens, rows,
        q.stride(0), out.stride(0), num_seqs,
        kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        scale, softcap or 0.0, sliding_window or 0,
        GROUP=group, GROUP_PAD=group_pad, D=d, BLOCK_Q=block_q, BLOCK_N=64 if d <= 64 else 32,
        SEARCH_STEPS=max(1, num_seqs.bit_length()),
        SOFTCAP=softcap is not None, WINDOW=sliding_window is not None, IEEE=q.dtype == torch.float32, PDL=pdl,
        num_warps=4 if d <= 128 else 8, launch_pdl=pdl,
    )  # fmt: skip
