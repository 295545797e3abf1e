"""Layers with a native and a custom implementation, and the attention op (importing registers them)."""

from reference.ops.activation import GatedActivation, GeluTanhAndMul, SiluAndMul
from reference.ops.attention import ATTENTION_OP, Attention
from reference.ops.attention_metadata import AttentionMetadata
from reference.ops.custom_op import CustomOp, CustomOpSelection, registered_custom_ops
from reference.ops.fused_linear import LinearActivation, LinearResidualAdd, RMSNormLinear
from reference.ops.layernorm import RMSNorm
from reference.ops.library import HAS_TRITON, kernel_backend
from reference.ops.rotary import QKNormRotary, RotaryEmbedding

__all__ = [
    "ATTENTION_OP",
    "HAS_TRITON",
    "Attention",
    "AttentionMetadata",
    "CustomOp",
    "CustomOpSelection",
    "GatedActivation",
    "GeluTanhAndMul",
    "LinearActivation",
    "LinearResidualAdd",
    "QKNormRotary",
    "RMSNorm",
    "RMSNormLinear",
    "RotaryEmbedding",
    "SiluAndMul",
    "kernel_backend",
    "registered_custom_ops",
]
