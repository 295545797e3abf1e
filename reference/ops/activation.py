"""Gated MLP activations: ``act(x[:, :I]) * x[:, I:]`` on the fused gate/up projection output.

SiLU gating (SwiGLU) is from Shazeer, "GLU Variants Improve Transformer", 2020 (Llama, Qwen); the
tanh-approximated GELU variant (GeGLU) is Gemma's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference.ops.custom_op import HAS_TRITON, CustomOp


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] -> [T, I], same dtype: silu(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_tanh_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """x: [T, 2I] -> [T, I], same dtype: gelu_tanh(gate) * up."""
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def _gated_fake(x):
    return x.new_empty(x.shape[:-1] + (x.shape[-1] // 2,))


@torch.library.custom_op("reference::silu_and_mul", mutates_args=())
def silu_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    """Opaque SiLU-and-mul. x: [T, 2I] -> [T, I]."""
    return silu_and_mul_reference(x)


@torch.library.custom_op("reference::gelu_tanh_and_mul", mutates_args=())
def gelu_tanh_and_mul_op(x: torch.Tensor) -> torch.Tensor:
    """Opaque GELU(tanh)-and-mul. x: [T, 2I] -> [T, I]."""
    return gelu_tanh_and_mul_reference(x)


silu_and_mul_op.register_fake(_gated_fake)
gelu_tanh_and_mul_op.register_fake(_gated_fake)

if HAS_TRITON:
    from reference.ops import triton_kernels

    silu_and_mul_op.register_kernel("cuda")(lambda x: triton_kernels.gated_activation(x, gelu=False))
    gelu_tanh_and_mul_op.register_kernel("cuda")(lambda x: triton_kernels.gated_activation(x, gelu=True))


class SiluAndMul(CustomOp):
    """``silu(x[:, :I]) * x[:, I:]``. x: [T, 2I] -> [T, I]."""

    name = "silu_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return silu_and_mul_reference(x)

    def forward_custom(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.reference.silu_and_mul(x)


class GeluTanhAndMul(CustomOp):
    """``gelu_tanh(x[:, :I]) * x[:, I:]``. x: [T, 2I] -> [T, I]."""

    name = "gelu_tanh_and_mul"

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_tanh_and_mul_reference(x)

    def forward_custom(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.reference.gelu_tanh_and_mul(x)
