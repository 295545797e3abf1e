"""RMSNorm, optionally fused with the residual add that precedes it in a pre-norm decoder.

Semantics follow transformers (the oracle): the mean of squares is taken in fp32. With
``weight_offset=0`` (Llama, Qwen3) the normalised activations are cast back to the input dtype and then
multiplied by ``weight``; with ``weight_offset=1`` (Gemma) the scale ``1 + weight`` is applied in fp32
before the cast. RMSNorm: Zhang & Sennrich, "Root Mean Square Layer Normalization", 2019.
"""

from __future__ import annotations

import torch
from torch import nn

from reference.ops.custom_op import CustomOp, CustomOpSelection
from reference.ops.library import HAS_TRITON, define_op

if HAS_TRITON:
    from reference.ops import triton_kernels


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    """RMSNorm over the last dimension. x: [T, H] or [T, heads, H], any float dtype; weight: [H]; returns
    x's shape in x.dtype."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if weight_offset == 0.0:
        return weight * x32.to(x.dtype)
    return (x32 * (weight.float() + weight_offset)).to(x.dtype)


def fused_add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``residual = x + residual; (rms_norm(residual), residual)``. All activations [T, H]."""
    residual = x + residual
    return rms_norm_reference(residual, weight, eps, weight_offset), residual


rms_norm_op = define_op(
    "rms_norm",
    rms_norm_reference,
    fake=lambda x, weight, eps, weight_offset: x.new_empty(x.shape),
    cuda=lambda *args: triton_kernels.rms_norm(*args),
)
fused_add_rms_norm_op = define_op(
    "fused_add_rms_norm",
    fused_add_rms_norm_reference,
    fake=lambda x, residual, weight, eps, weight_offset: (x.new_empty(x.shape), x.new_empty(x.shape)),
    cuda=lambda x, residual, weight, eps, offset: triton_kernels.rms_norm(x, weight, eps, offset, residual=residual),
)


class RMSNorm(CustomOp):
    """RMSNorm with an optional fused residual add.

    ``forward(x)`` returns ``norm(x)``; ``forward(x, residual)`` returns ``(norm(x + residual),
    x + residual)``, the pre-norm decoder's pattern. Shapes [T, H], or for ``forward(x)`` also
    [T, heads, H] (per-head norms; x may be a strided view whose last dimension is contiguous, read in
    place); outputs contiguous, in the dtype of ``x``.

    Args:
        ops: custom-op selection (decides native vs custom).
        hidden_size: H.
        eps: added to the mean of squares.
        weight_offset: 0 for Llama/Qwen (``weight * norm``), 1 for Gemma (``(1 + weight) * norm``).
    """

    name = "rms_norm"

    def __init__(self, ops: CustomOpSelection, hidden_size: int, eps: float = 1e-6, weight_offset: float = 0.0):
        super().__init__(ops)
        self.weight = nn.Parameter(torch.ones(hidden_size) if weight_offset == 0 else torch.zeros(hidden_size))
        self.eps = float(eps)
        self.weight_offset = float(weight_offset)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return rms_norm_reference(x, self.weight, self.eps, self.weight_offset)
        return fused_add_rms_norm_reference(x, residual, self.weight, self.eps, self.weight_offset)

    def forward_custom(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return rms_norm_op(x, self.weight, self.eps, self.weight_offset)
        return fused_add_rms_norm_op(x, residual, self.weight, self.eps, self.weight_offset)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}, offset={self.weight_offset}, {super().extra_repr()}"
