"""Layers with a native and a custom implementation, and the attention op (importing registers them)."""

from reference.ops.activation import GeluTanhAndMul, SiluAndMul
from reference.ops.attention import Attention, AttentionMetadata
from reference.ops.custom_op import CustomOp, CustomOpSelection, registered_custom_ops
from reference.ops.layernorm import RMSNorm
from reference.ops.rotary import RotaryEmbedding

__all__ = [
    "Attention",
    "AttentionMetadata",
    "CustomOp",
    "CustomOpSelection",
    "GeluTanhAndMul",
    "RMSNorm",
    "RotaryEmbedding",
    "SiluAndMul",
    "registered_custom_ops",
]
