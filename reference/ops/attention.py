"""Attention over a KV cache, as one opaque op: the default splitting op.

``reference::attention(q, k, v, out, layer_name)`` writes this step's keys and values into the layer's
KV cache and the attention result into ``out``, a buffer the caller allocated. Writing into a
preallocated output (instead of returning a tensor) is what lets the piece *before* attention allocate
the buffer inside its CUDA graph's memory pool and the piece *after* read it at a fixed address.

Everything that varies per step and is not a tensor of the graph (which rows are padding, each
sequence's length, where its keys go) comes from the :class:`~reference.forward_context.ForwardContext`,
so the traced graph never sees it and the op may be fully dynamic: it runs eagerly between graphs.

The op is tagged ``torch.Tag.cudagraph_unsafe`` (a default splitting op, see :mod:`reference.ops.library`).
The KV-cache layout and the per-step metadata are in :mod:`reference.ops.attention_metadata`.
"""

from __future__ import annotations

import enum

import torch
import torch.nn.functional as F
from torch import nn

from reference.forward_context import get_forward_context
from reference.ops.attention_metadata import AttentionMetadata, GraphTables
from reference.ops.library import HAS_TRITON, TRITON_DTYPES, define_op, register_direct_call

if HAS_TRITON:
    from reference.ops import graph_attention_kernels, triton_kernels

ATTENTION_OP = "reference::attention"


class AttentionCGSupport(enum.IntEnum):
    """Which steps this attention can serve inside a full CUDA graph (vLLM's levels of the same name, in
    the same order: a higher level serves everything a lower one does).

    * ``NEVER``: none; it reads host values per step (the torch path).
    * ``UNIFORM_SINGLE_TOKEN_DECODE``: steps where every sequence adds one token.
    * ``UNIFORM_BATCH``: steps where every sequence adds the same number of tokens (vLLM's speculative
      decoding); no kernel of this project declares it.
    * ``ALWAYS``: any step, prefill and mixed included.
    """

    NEVER = 0
    UNIFORM_SINGLE_TOKEN_DECODE = 1
    UNIFORM_BATCH = 2
    ALWAYS = 3


def cudagraph_support(device: torch.device, dtype: torch.dtype) -> AttentionCGSupport:
    """The level this attention declares for activations of ``dtype`` on ``device``.

    On CUDA with Triton, in a Triton dtype: ``ALWAYS`` (a full graph of a decode step runs the decode
    kernel; of any other step, the kernels of :mod:`reference.ops.graph_attention_kernels`, which read
    every per-step value from the static :class:`~reference.ops.attention_metadata.GraphTables`). Other
    dtypes on CUDA run the torch path, which reads host lengths: ``NEVER``. On a CPU nothing is captured
    and it declares ``ALWAYS`` in every dtype, so that a CPU run dispatches steps as CUDA does in the Triton
    dtypes.
    """
    if device.type != "cuda":
        return AttentionCGSupport.ALWAYS
    return AttentionCGSupport.ALWAYS if HAS_TRITON and dtype in TRITON_DTYPES else AttentionCGSupport.NEVER


def _causal_mask(query_len: int, seq_len: int, sliding_window: int | None, device) -> torch.Tensor:
    """[query_len, seq_len] bool: query i (at position seq_len - query_len + i) may see key j."""
    qpos = torch.arange(seq_len - query_len, seq_len, device=device)[:, None]
    kpos = torch.arange(seq_len, device=device)[None, :]
    mask = kpos <= qpos
    if sliding_window is not None:
        mask &= kpos > qpos - sliding_window
    return mask


def _attend(q, k, v, mask, scale: float, softcap: float | None) -> torch.Tensor:
    """softmax(q k^T * scale [softcapped] + mask) v. q: [B, Hkv, M, D]; k, v: [B, Hkv, L, D] -> [B, Hkv, M, D].

    Grouped-query heads are folded into M by the caller, so keys are never repeated per query head.
    """
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(scores.softmax(-1).to(v.dtype), v)


def attention_impl(layer: "Attention", md: AttentionMetadata, q, k, v, out) -> None:
    """Write k, v into ``layer.kv_cache`` and ``attention(q, k, v)`` into ``out`` for the real tokens.

    On CUDA in fp16, bf16 or fp32 a step with ``graph_tables`` (a full graph of any step kind) takes three
    launches sized by the graph's key (:func:`attention_in_full_graph`), and a decode step takes one Triton
    launch (cache write + attention). Any
    other step (prefill, mixed) writes the cache, then runs its leading one-token sequences (a
    continuous-batching step's decodes) through the decode kernel and the rest through one
    variable-length Triton launch: the prefill kernel gives each query head a program and blocks of 64
    queries, so a decode row there would read its kv head's cache once per query head of the group and
    fill 1 of 64 rows. Everything else (float64 references included) runs the torch path below, which is
    also the reference the Triton kernels are tested against.
    """
    if HAS_TRITON and q.is_cuda and q.dtype in TRITON_DTYPES:
        if md.graph_tables is not None:  # a full graph of any step: launches sized by the graph's key alone
            attention_in_full_graph(layer, md.graph_tables, q, k, v, out)
            return
        decodes = md.num_leading_single_tokens
        if not md.is_decode:
            _write_cache(layer, md, k, v)  # the decode kernel rewrites its tokens' slots with the same values
        if decodes:
            rows, seq_lens = md.rows_tensor, md.seq_lens_tensor
            if not md.is_decode:
                rows, seq_lens = rows[:decodes], seq_lens[:decodes]
            triton_kernels.decode_attention(
                q, k, v, layer.kv_cache, rows, seq_lens, out,
                layer.scale, layer.sliding_window, layer.logits_soft_cap,
            )  # fmt: skip
        if not md.is_decode:
            triton_kernels.prefill_attention(
                q, layer.kv_cache, md.varlen_tensor(q.device, first=decodes), max(md.query_lens[decodes:]), out,
                layer.scale, layer.sliding_window, layer.logits_soft_cap,
            )  # fmt: skip
        return
    attention_torch(layer, md, q, k, v, out)


def attention_in_full_graph(layer: "Attention", tables: GraphTables, q, k, v, out) -> None:
    """:func:`attention_impl` inside a full graph of any step (Triton on CUDA, fp16, bf16 or fp32): every
    launch's grid and arguments depend only on the graph's key, every per-step value is read from
    ``tables``. The cache write of every real token, the decode kernel over the step's leading decodes (its
    padding rows left alone: they are other sequences' tokens), the variable-length kernel over the other
    sequences. q, out: [T, Hq * D] with T the graph's token count (``tables.num_tokens``); k, v: [T, Hkv *
    D]; mutates ``out`` and ``layer.kv_cache``."""
    kernels = graph_attention_kernels
    kernels.write_kv_cache(k, v, layer.kv_cache, tables.slots)
    triton_kernels.decode_attention(
        q, k, v, layer.kv_cache, tables.decode_rows, tables.decode_seq_lens, out,
        layer.scale, layer.sliding_window, layer.logits_soft_cap, zero_padding=False,
    )  # fmt: skip
    kernels.varlen_attention(
        q, layer.kv_cache, tables.cu_query_lens, tables.seq_lens, tables.rows, tables.num_tokens, out,
        layer.scale, layer.sliding_window, layer.logits_soft_cap,
    )  # fmt: skip


def _write_cache(layer: "Attention", md: AttentionMetadata, k, v) -> None:
    """Keys and values of the step's real tokens (k, v: [>= n, Hkv*D]) into their cache slots."""
    n, kv_heads, d = md.num_actual_tokens, layer.num_kv_heads, layer.head_size
    k_cache, v_cache = layer.kv_cache.unbind(0)  # [R, L, Hkv, D] each
    k_cache.view(-1, kv_heads, d).index_copy_(0, md.slot_mapping, k[:n].view(n, kv_heads, d))
    v_cache.view(-1, kv_heads, d).index_copy_(0, md.slot_mapping, v[:n].view(n, kv_heads, d))


def attention_torch(layer: "Attention", md: AttentionMetadata, q, k, v, out) -> None:
    """The torch implementation of :func:`attention_impl` (any device, any step)."""
    n = md.num_actual_tokens
    heads, kv_heads, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    group = heads // kv_heads
    _write_cache(layer, md, k, v)
    k_cache, v_cache = layer.kv_cache.unbind(0)  # [R, L, Hkv, D] each
    q = q[:n].view(n, kv_heads, group, d)  # query heads of one kv head are adjacent (transformers' repeat_kv)
    out = out[:n].view(n, kv_heads, group, d)

    if md.is_decode:
        # One query per sequence: its `group` heads act as `group` query rows against one kv head.
        max_len = max(md.seq_lens)
        keys = k_cache[md.rows_index, :max_len].transpose(1, 2)  # [B, Hkv, L, D]
        values = v_cache[md.rows_index, :max_len].transpose(1, 2)
        mask = md.decode_mask(layer.sliding_window, q.device)
        out.copy_(_attend(q, keys, values, mask, layer.scale, layer.logits_soft_cap))
        return

    start = 0
    for ql, sl, row in zip(md.query_lens, md.seq_lens, md.rows):
        # [ql, Hkv, G, D] -> [1, Hkv, ql * G, D]: query rows ordered (token, head-in-group)
        qi = q[start : start + ql].permute(1, 0, 2, 3).reshape(1, kv_heads, ql * group, d)
        keys = k_cache[row, :sl].transpose(0, 1)[None]  # [1, Hkv, L, D]
        values = v_cache[row, :sl].transpose(0, 1)[None]
        mask = _causal_mask(ql, sl, layer.sliding_window, q.device).repeat_interleave(group, dim=0)
        oi = _attend(qi, keys, values, mask, layer.scale, layer.logits_soft_cap)  # [1, Hkv, ql * G, D]
        out[start : start + ql] = oi[0].view(kv_heads, ql, group, d).permute(1, 0, 2, 3)
        start += ql


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, layer_name: str) -> None:
    """Attention of layer ``layer_name``. q, out: [T, Hq*D]; k, v: [T, Hkv*D]. Mutates ``out``."""
    ctx = get_forward_context()
    attention_impl(ctx.attention_layers[layer_name], ctx.attn_metadata, q, k, v, out)


attention_op = define_op(
    "attention", attention_forward, mutates_args=("out",), fake=lambda q, k, v, out, layer_name: None, splitting=True
)
# Between CUDA graphs the split module may call the Python function itself: same code, minus the
# dispatcher's per-call cost (measured in perf/NOTES.md).
register_direct_call(ATTENTION_OP, attention_forward)


class Attention(nn.Module):
    """The attention of one layer; its KV cache is attached by the runner.

    ``forward(q [T, Hq*D], k [T, Hkv*D], v [T, Hkv*D]) -> [T, Hq*D]`` in the activations' dtype.

    Args:
        num_heads: Hq. num_kv_heads: Hkv (must divide Hq). head_size: D.
        scale: multiplies q k^T (usually D ** -0.5).
        layer_name: unique key; the op finds this layer (and its cache) under it in the forward context.
        sliding_window: if set, a query at position p sees keys in (p - sliding_window, p].
        logits_soft_cap: if set, scores become ``cap * tanh(scores / cap)`` (Gemma 2 style).

    Attributes:
        kv_cache: [2, rows, max_model_len, Hkv, D] or None until the runner allocates it.
    """

    def __init__(
        self,
        num_heads: int,
        num_kv_heads: int,
        head_size: int,
        scale: float,
        layer_name: str,
        sliding_window: int | None = None,
        logits_soft_cap: float | None = None,
    ):
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads})")
        self.num_heads, self.num_kv_heads, self.head_size = num_heads, num_kv_heads, head_size
        self.scale = float(scale)
        self.layer_name = layer_name
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.kv_cache: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = q.new_empty(q.shape)  # allocated here, so inside the preceding piece's graph pool
        attention_op(q, k, v, out, self.layer_name)
        return out

    def extra_repr(self) -> str:
        return (
            f"{self.layer_name}: heads={self.num_heads}, kv_heads={self.num_kv_heads}, head_size={self.head_size}, "
            f"window={self.sliding_window}"
        )
