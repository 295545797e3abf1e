"""Qwen3 dense decoder, built from a transformers ``Qwen3Config``.

Qwen3 is Llama with one change: q and k are RMS-normalised per head (over ``head_dim``, weights
``q_norm`` / ``k_norm`` of shape [D]) after the projection and before RoPE. (Projection biases follow
``config.attention_bias``, False in the released checkpoints, as in Llama.) Everything else (fused qkv and gate/up
GEMMs, fused add + RMSNorm, SwiGLU, neox RoPE with transformers' frequencies, the KV-cache attention op)
is :mod:`reference.models.llama`'s. The oracle is transformers' ``Qwen3ForCausalLM``.

Qwen3's optional sliding-window layers (``use_sliding_window=True``) are not supported: no released
Qwen3 checkpoint enables them, and building such a config raises instead of silently attending globally.
"""

from __future__ import annotations

import torch
from transformers import Qwen3Config

from reference.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM, LlamaModel
from reference.ops import Attention, CustomOpSelection, QKNormRotary, RMSNorm, RotaryEmbedding


class Qwen3Attention(LlamaAttention):
    """:class:`LlamaAttention` with per-head RMSNorm of q and k before RoPE.

    ``forward(positions [T], x [T, H]) -> [T, H]``. Also Gemma 3's attention, with ``norm_offset=1``.

    Args:
        config, ops, rotary, prefix, attention_cls, scale, sliding_window: as :class:`LlamaAttention`.
        norm_offset: RMSNorm weight offset of ``q_norm`` and ``k_norm``: 0 for Qwen3 (``w * norm(x)``),
            1 for Gemma 3 (``(1 + w) * norm(x)``).
    """

    def __init__(
        self,
        config,
        ops: CustomOpSelection,
        rotary: RotaryEmbedding,
        prefix: str,
        attention_cls=Attention,
        *,
        norm_offset: float = 0.0,
        scale: float | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__(config, ops, rotary, prefix, attention_cls, scale=scale, sliding_window=sliding_window)
        self.q_norm = RMSNorm(ops, self.head_size, config.rms_norm_eps, norm_offset)
        self.k_norm = RMSNorm(ops, self.head_size, config.rms_norm_eps, norm_offset)
        self.qk_norm_rope = QKNormRotary(ops, self.q_norm, self.k_norm, rotary)

    def position_qk(self, positions, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q [T, Hq*D], k [T, Hkv*D] -> same shapes: each head RMS-normalised over its D values, then RoPE."""
        return self.qk_norm_rope(positions, q, k)


class Qwen3DecoderLayer(LlamaDecoderLayer):
    """Llama's pre-norm block with :class:`Qwen3Attention`."""

    self_attn_cls = Qwen3Attention


class Qwen3Model(LlamaModel):
    """Embedding, Qwen3 decoder layers, final norm. ``forward(input_ids [T], positions [T]) -> [T, H]``.

    RoPE frequencies come from ``LlamaRotaryEmbedding``, whose computation transformers' Qwen3 copies
    verbatim (both read ``config.rope_parameters``).
    """

    layer_cls = Qwen3DecoderLayer


class Qwen3ForCausalLM(LlamaForCausalLM):
    """Qwen3 decoder with its LM head (tied to the embedding when ``config.tie_word_embeddings``).

    ``forward(input_ids [T] int64, positions [T] int64) -> hidden [T, H]`` (model dtype);
    ``compute_logits(hidden [N, H]) -> [N, vocab]`` float32. Parameter names are transformers', except
    the fused ``qkv_proj`` and ``gate_up_proj`` (``stacked_params``, inherited from Llama).

    Args:
        config: a transformers ``Qwen3Config``.
        ops: custom-op selection.
        attention_cls: the attention layer class (default: the KV-cache :class:`~reference.ops.Attention`).

    Raises:
        ValueError: ``config.hidden_act`` is not ``'silu'``, or ``config.use_sliding_window`` is True.
    """

    model_cls = Qwen3Model

    def __init__(self, config: Qwen3Config, ops: CustomOpSelection, attention_cls=Attention):
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act: expected 'silu' (Qwen3's SwiGLU), got {config.hidden_act!r}")
        if getattr(config, "use_sliding_window", False):
            raise ValueError(
                "use_sliding_window: expected False, got True; sliding-window Qwen3 layers are not "
                "supported (no released Qwen3 checkpoint uses them)"
            )
        super().__init__(config, ops, attention_cls)
