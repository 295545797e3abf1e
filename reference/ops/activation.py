"""Gated MLP activations: ``act(x[:, :I]) * x[:, I:]`` on the fused gate/up projection output.

SiLU gating (SwiGLU) is from Shazeer, "GLU Variants Improve Transformer", 2020 (Llama, Qwen); the
tanh-approximated GELU variant (GeGLU) is Gemma's.
"""

from __future__ import annotations

from typing import Callable, ClassVar

import torch
import torch.nn.functional as F

from reference.ops.custom_op import CustomOp
from reference.ops.library import HAS_TRITON, define_op

if HAS_TRITON:
    from reference.ops import triton_kernels


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] -> [T, I], same dtype: silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] -> [T, I], same dtype: gelu_tanh(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _gated_fake(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], x.shape[1] // 2))


silu_and_mul_op = define_op(
    "silu_and_mul",
    silu_and_mul_reference,
    fake=_gated_fake,
    cuda=lambda x: triton_kernels.gated_activation(x, gelu=False),
)
gelu_tanh_and_mul_op = define_op(
    "gelu_tanh_and_mul",
    gelu_tanh_and_mul_reference,
    fake=_gated_fake,
    cuda=lambda x: triton_kernels.gated_activation(x, gelu=True),
)


class GatedActivation(CustomOp):
    """``act(x[:, :I]) * x[:, I:]``. x: [T, 2I] -> [T, I]. Subclasses name the op and its two forms."""

    reference: ClassVar[Callable[[torch.Tensor], torch.Tensor]]
    op: ClassVar[Callable[[torch.Tensor], torch.Tensor]]

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return type(self).reference(x)

    def forward_custom(self, x: torch.Tensor) -> torch.Tensor:
        return type(self).op(x)


class SiluAndMul(GatedActivation):
    """SwiGLU's gate: ``silu(x[:, :I]) * x[:, I:]``."""

    name = "silu_and_mul"
    reference = staticmethod(silu_and_mul_reference)
    op = silu_and_mul_op


class GeluTanhAndMul(GatedActivation):
    """GeGLU's gate (Gemma): ``gelu_tanh(x[:, :I]) * x[:, I:]``."""

    name = "gelu_tanh_and_mul"
    reference = staticmethod(gelu_tanh_and_mul_reference)
    op = gelu_tanh_and_mul_op
