"""Rotary position embedding, neox style (rotate the two halves of each head).

RoPE: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding", 2021. The "neox"
layout (pairs are (i, i + D/2), not adjacent elements) is what Llama, Qwen and Gemma checkpoints in
transformers use. The frequencies come from transformers' rope initialisers (llama3 scaling, Gemma's
per-layer-type bases): the oracle's own numbers, so our tables match it exactly.
"""

from __future__ import annotations

import torch

from reference.ops.custom_op import CustomOp, CustomOpSelection
from reference.ops.layernorm import RMSNorm, rms_norm_reference
from reference.ops.library import HAS_TRITON, define_op

if HAS_TRITON:
    from reference.ops import triton_kernels


def cos_sin_table(inv_freq: torch.Tensor, max_position: int, attention_scaling: float = 1.0) -> torch.Tensor:
    """[max_position, D] float32: cos in the first D/2 columns, sin in the last D/2.

    inv_freq: [D/2] float32 frequencies (radians per position).
    """
    positions = torch.arange(max_position, dtype=torch.float32)
    freqs = torch.outer(positions, inv_freq.float())  # [P, D/2]
    return torch.cat([freqs.cos() * attention_scaling, freqs.sin() * attention_scaling], dim=-1)


def rotate_reference(
    positions: torch.Tensor, x: torch.Tensor, cos_sin_cache: torch.Tensor, head_size: int
) -> torch.Tensor:
    """Rotate x: [T, heads * head_size] at positions: [T] (int64). Computed in x.dtype, like transformers."""
    cos, sin = cos_sin_cache[positions].to(x.dtype).chunk(2, dim=-1)  # [T, D/2] each
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [T, 1, D/2]
    x = x.unflatten(-1, (-1, head_size))  # [T, heads, D]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)


def rotary_embedding_reference(
    positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor, head_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox RoPE of q: [T, Hq * D] and k: [T, Hkv * D] at positions [T]; returns new (q, k)."""
    return (
        rotate_reference(positions, q, cos_sin_cache, head_size),
        rotate_reference(positions, k, cos_sin_cache, head_size),
    )


def _rotary_cuda(positions, q, k, cos_sin_cache, head_size):
    return triton_kernels.rotary(positions, q, k, cos_sin_cache, head_size)


rotary_embedding_op = define_op(
    "rotary_embedding",
    rotary_embedding_reference,
    fake=lambda positions, q, k, cos_sin_cache, head_size: (q.new_empty(q.shape), k.new_empty(k.shape)),
    cuda=_rotary_cuda,
)


class RotaryEmbedding(CustomOp):
    """Neox-style RoPE. ``forward(positions [T] int64, q [T, Hq*D], k [T, Hkv*D]) -> (q, k)``.

    Args:
        ops: custom-op selection.
        head_size: D (all of it is rotated).
        max_position: rows of the cos/sin table; positions must be smaller.
        inv_freq: [D/2] frequencies, e.g. from ``transformers.modeling_rope_utils``.
        attention_scaling: multiplies cos and sin (1.0 except for some scaled rope types).

    The table is a buffer computed and kept in fp32 (build the model under the target dtype rather than
    casting it afterwards, as ``reference.models.registry.build_model`` does); each call casts the rows it reads to the
    activation dtype, which rounds exactly as transformers' per-call ``cos.to(dtype)`` does.
    """

    name = "rotary_embedding"

    def __init__(
        self,
        ops: CustomOpSelection,
        head_size: int,
        max_position: int,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
    ):
        super().__init__(ops)
        if inv_freq.shape != (head_size // 2,):
            raise ValueError(f"inv_freq: expected shape ({head_size // 2},), got {tuple(inv_freq.shape)}")
        self.head_size = head_size
        self.register_buffer(
            "cos_sin_cache", cos_sin_table(inv_freq, max_position, attention_scaling), persistent=False
        )

    def forward_native(self, positions, q, k):
        return rotary_embedding_reference(positions, q, k, self.cos_sin_cache, self.head_size)

    def forward_custom(self, positions, q, k):
        return rotary_embedding_op(positions, q, k, self.cos_sin_cache, self.head_size)


def qk_norm_rope_reference(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    weight_offset: float,
    cos_sin_cache: torch.Tensor,
    head_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of each head of q: [T, Hq * D] and k: [T, Hkv * D] over its D values (weights [D]), then neox
    RoPE at positions [T]; returns new (q, k) [T, H * D]."""
    t = q.shape[0]
    q = rms_norm_reference(q.view(t, -1, head_size), q_weight, eps, weight_offset).view(t, -1)
    k = rms_norm_reference(k.view(t, -1, head_size), k_weight, eps, weight_offset).view(t, -1)
    return rotary_embedding_reference(positions, q, k, cos_sin_cache, head_size)


def _qk_norm_rope_cuda(positions, q, k, q_weight, k_weight, eps, weight_offset, cos_sin_cache, head_size):
    return triton_kernels.rotary(positions, q, k, cos_sin_cache, head_size, (q_weight, k_weight, eps, weight_offset))


qk_norm_rope_op = define_op(
    "qk_norm_rope",
    qk_norm_rope_reference,
    fake=lambda positions, q, k, *_: (q.new_empty(q.shape), k.new_empty(k.shape)),
    cuda=_qk_norm_rope_cuda,
)


class QKNormRotary(CustomOp):
    """Per-head RMSNorm of q and k, then RoPE: Qwen3's and Gemma 3's attention prologue.

    ``forward(positions [T] int64, q [T, Hq*D], k [T, Hkv*D]) -> (q, k)``, contiguous, q's dtype. Native:
    the three layers it is given, each with its own native/custom choice (three launches with custom
    ops). Custom: one op, one launch on CUDA (the RoPE kernel with the norms in front). vLLM fuses the same
    pattern with a compiler pass (its QK-norm + RoPE fusion); here the model asks for it, so it serves
    ``use_inductor=False`` too.

    Args:
        ops: custom-op selection (``qk_norm_rope``).
        q_norm, k_norm: the per-head norms (weights [D], one eps and offset); they stay the attention's
            own submodules, so checkpoint names are unchanged.
        rotary: the RoPE layer.
    """

    name = "qk_norm_rope"

    def __init__(self, ops: CustomOpSelection, q_norm: RMSNorm, k_norm: RMSNorm, rotary: RotaryEmbedding):
        super().__init__(ops)
        if (q_norm.eps, q_norm.weight_offset) != (k_norm.eps, k_norm.weight_offset):
            raise ValueError("q_norm and k_norm: the fused op takes one eps and one weight offset for both")
        self._layers = (q_norm, k_norm, rotary)  # a tuple: not submodules, the parameters keep their names

    def forward_native(self, positions, q, k):
        q_norm, k_norm, rotary = self._layers
        t, d = q.shape[0], rotary.head_size
        q = q_norm(q.view(t, -1, d)).view(t, -1)  # [T, heads, D] views of the qkv output, read in place
        k = k_norm(k.view(t, -1, d)).view(t, -1)
        return rotary(positions, q, k)

    def forward_custom(self, positions, q, k):
        q_norm, k_norm, rotary = self._layers
        return qk_norm_rope_op(
            positions, q, k, q_norm.weight, k_norm.weight, q_norm.eps, q_norm.weight_offset,
            rotary.cos_sin_cache, rotary.head_size,
        )  # fmt: skip
