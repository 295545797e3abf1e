"""Gemma 3 text decoder (``model_type='gemma3_text'``), built from a transformers ``Gemma3TextConfig``.

Same computation as transformers' ``Gemma3ForCausalLM`` (the oracle). What differs from Llama:

* RMSNorm scales by ``1 + weight``, in fp32 (``RMSNorm(weight_offset=1)``), and there are four norms per
  layer: the attention and MLP outputs are normalised again (``post_attention_layernorm``,
  ``post_feedforward_layernorm``) *before* they join the residual stream.
* q and k are RMS-normalised per head before RoPE (Qwen3's :class:`~reference.models.qwen3.Qwen3Attention`
  with the Gemma offset), and attention scores are scaled by ``query_pre_attn_scalar ** -0.5``.
* Layers are local (``'sliding_attention'``: a query sees the last ``sliding_window`` keys, itself included)
  or global (``'full_attention'``), per ``config.layer_types``; each kind has its own RoPE (local: plain
  RoPE with base ``rope_local_base_freq``; global: ``rope_theta`` with the config's scaling, e.g. linear
  x8 in Gemma 3 4B). Frequencies are transformers' (:mod:`reference.models.rope`).
* Token embeddings are multiplied by ``sqrt(hidden_size)``, rounded to the activation dtype first (as
  transformers does), and the MLP is GELU(tanh)-gated.
* Logits may be soft-capped: ``cap * tanh(logits / cap)`` when ``final_logit_softcapping`` is set.

Gemma 3 has no attention-logit soft-capping: transformers' Gemma 3 ignores ``attn_logit_softcapping``, so a
config that sets it is rejected rather than run with a meaning the checkpoint never had.
Reference: Gemma Team, "Gemma 3 Technical Report", 2025.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Gemma3TextConfig

from reference.models.llama import LlamaForCausalLM, LlamaMLP, head_dim
from reference.models.qwen3 import Qwen3Attention
from reference.models.rope import rope_frequencies
from reference.ops import Attention, CustomOpSelection, GeluTanhAndMul, RMSNorm, RotaryEmbedding
from reference.ops.fused_linear import LinearActivation, RMSNormLinear, norm_gate_up
from reference.parallel import VocabParallelEmbedding

LAYER_TYPES = ("sliding_attention", "full_attention")
GEMMA_NORM_OFFSET = 1.0  # Gemma's RMSNorm multiplies by (1 + weight)


def gemma3_rotary(config: Gemma3TextConfig, ops: CustomOpSelection) -> dict[str, RotaryEmbedding]:
    """One RoPE per layer type in ``config.layer_types``, with transformers' frequencies and scaling.

    Raises:
        ValueError: ``config.rope_parameters`` has no RoPE settings for a layer type, or names an unknown kind
            (:func:`rope_frequencies`).
    """
    tables = {}
    for layer_type in sorted(set(config.layer_types)):
        inv_freq, scaling = rope_frequencies(config, head_dim(config), layer_type)
        tables[layer_type] = RotaryEmbedding(ops, head_dim(config), config.max_position_embeddings, inv_freq, scaling)
    return tables


class Gemma3DecoderLayer(nn.Module):
    """Gemma 3 block: pre- and post-norms around attention and around the MLP.

    ``forward(positions [T], hidden [T, H], residual [T, H] | None) -> (hidden, residual)``.

    transformers computes ``x = x + post_attn_norm(attn(input_norm(x)))`` and then
    ``x = x + post_ff_norm(mlp(pre_ff_norm(x)))``. Here the residual stream is carried as
    ``hidden + residual`` with the add deferred: each residual add is fused into the norm that reads its
    sum (``input_layernorm``, ``pre_feedforward_layernorm``, or the next layer's / the final norm),
    while the post-norms stay plain norms of the sublayer output. Same additions, same order. The pre-norms
    and the activation may be fused into the GEMMs beside them (``rms_norm_linear``, ``linear_activation``:
    :mod:`reference.ops.fused_linear`); a post-norm sits between each output projection and its residual
    add, so ``linear_residual_add`` has nothing to fuse here.

    Args:
        sliding_window: this layer's window (a local layer) or None (a global layer).
    """

    def __init__(
        self,
        config: Gemma3TextConfig,
        ops: CustomOpSelection,
        rotary: RotaryEmbedding,
        prefix: str,
        attention_cls=Attention,
        *,
        sliding_window: int | None,
    ):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(ops, h, eps, GEMMA_NORM_OFFSET)
        self.self_attn = Qwen3Attention(
            config,
            ops,
            rotary,
            f"{prefix}.self_attn",
            attention_cls,
            norm_offset=GEMMA_NORM_OFFSET,
            scale=config.query_pre_attn_scalar**-0.5,
            sliding_window=sliding_window,
        )
        self.post_attention_layernorm = RMSNorm(ops, h, eps, GEMMA_NORM_OFFSET)
        self.pre_feedforward_layernorm = RMSNorm(ops, h, eps, GEMMA_NORM_OFFSET)
        self.mlp = LlamaMLP(config, ops, GeluTanhAndMul)
        self.post_feedforward_layernorm = RMSNorm(ops, h, eps, GEMMA_NORM_OFFSET)
        self.norm_linear, self.linear_activation = RMSNormLinear(ops), LinearActivation(ops)

    def forward(self, positions, hidden, residual):
        # on entry the residual stream is hidden + residual (hidden alone before the first layer)
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = self.norm_linear(hidden, residual, self.input_layernorm, attn.qkv_proj)
        hidden = self.post_attention_layernorm(attn.o_proj(attn(positions, qkv)))
        gated, residual = norm_gate_up(  # residual += attention branch
            self.norm_linear, self.linear_activation, hidden, residual, self.pre_feedforward_layernorm, mlp
        )
        hidden = self.post_feedforward_layernorm(mlp.down_proj(gated))
        return hidden, residual  # the MLP branch joins the stream in the next norm


class Gemma3Model(nn.Module):
    """Scaled embedding, decoder layers, final norm. ``forward(input_ids [T], positions [T]) -> [T, H]``."""

    def __init__(self, config: Gemma3TextConfig, ops: CustomOpSelection, attention_cls=Attention):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # fp32 here; transformers rounds it to the activation dtype before multiplying, so do we (forward)
        self.register_buffer("embed_scale", torch.tensor(config.hidden_size**0.5), persistent=False)
        rotary = gemma3_rotary(config, ops)
        self.layers = nn.ModuleList(
            Gemma3DecoderLayer(
                config,
                ops,
                rotary[layer_type],
                f"model.layers.{i}",
                attention_cls,
                sliding_window=config.sliding_window if layer_type == "sliding_attention" else None,
            )
            for i, layer_type in enumerate(config.layer_types)
        )
        self.norm = RMSNorm(ops, config.hidden_size, config.rms_norm_eps, GEMMA_NORM_OFFSET)
        self.layer_kinds = tuple(config.layer_types)  # a local and a global layer run different code

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden = self.embed_tokens(input_ids)  # [T, H]
        hidden, residual = hidden * self.embed_scale.to(hidden.dtype), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class Gemma3ForCausalLM(LlamaForCausalLM):
    """Gemma 3 text decoder with its LM head (tied to the embedding when ``config.tie_word_embeddings``).

    ``forward(input_ids [T] int64, positions [T] int64) -> hidden [T, H]`` (model dtype);
    ``compute_logits(hidden [N, H]) -> [N, vocab]`` float32, soft-capped in the model dtype first when
    ``config.final_logit_softcapping`` is set (as transformers does). Parameter names are transformers',
    except the fused ``qkv_proj`` and ``gate_up_proj`` (``stacked_params``, inherited from Llama).

    Args:
        config: a transformers ``Gemma3TextConfig`` (the ``text_config`` of a multimodal Gemma 3 config).
        ops: custom-op selection.
        attention_cls: the attention layer class (default: the KV-cache :class:`~reference.ops.Attention`).

    Checkpoints: a text-only one (``Gemma3ForCausalLM``'s names) or the language model of a multimodal one
    (``hf_prefix_map``, ``hf_ignored_prefixes``; see :mod:`reference.models.loader`).

    Raises:
        ValueError: a config field this decoder cannot honour; the message names the field and the
            allowed values.
    """

    model_cls = Gemma3Model
    # A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration, e.g. google/gemma-3-4b-it) holds this
    # decoder as its language model: in its files (the Hub's, and what transformers' save_pretrained writes)
    # under ``language_model.model.`` (a head, if untied, ``language_model.lm_head.``), in transformers 5.x's
    # state_dict() under ``model.language_model.``; its vision tower and projector are not ours to run.
    hf_prefix_map = {
        "language_model.model.": "model.",
        "language_model.lm_head.": "lm_head.",
        "model.language_model.": "model.",
    }
    hf_ignored_prefixes = (
        "vision_tower.",
        "multi_modal_projector.",
        "model.vision_tower.",
        "model.multi_modal_projector.",
    )

    def __init__(self, config: Gemma3TextConfig, ops: CustomOpSelection, attention_cls=Attention):
        check_config(config)
        super().__init__(config, ops, attention_cls)

    @staticmethod
    def check_config(config: Gemma3TextConfig) -> None:
        """The module's :func:`check_config`, for ``registry.model_config`` to call when it reads a config."""
        check_config(config)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden)  # [N, V], model dtype
        cap = self.config.final_logit_softcapping
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()


def check_config(config: Gemma3TextConfig) -> None:
    """Reject ``Gemma3TextConfig`` settings that :class:`Gemma3ForCausalLM` does not implement.

    Raises:
        ValueError: naming the field and the allowed values.
    """
    if config.hidden_activation != "gelu_pytorch_tanh":
        raise ValueError(f"hidden_activation: expected 'gelu_pytorch_tanh', got {config.hidden_activation!r}")
    if config.attn_logit_softcapping is not None:
        raise ValueError(
            "attn_logit_softcapping: expected None; Gemma 3 does not soft-cap attention logits "
            f"(transformers' Gemma 3 ignores the field), got {config.attn_logit_softcapping!r}"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention: expected False (a causal decoder), got True")
    types = list(config.layer_types)
    if len(types) != config.num_hidden_layers or not set(types) <= set(LAYER_TYPES):
        raise ValueError(
            f"layer_types: expected {config.num_hidden_layers} entries (num_hidden_layers), each one of "
            f"{list(LAYER_TYPES)}, got {types}"
        )
    for layer_type in sorted(set(types)):
        rope_frequencies(config, head_dim(config), layer_type)  # its RoPE settings can be built
    window = config.sliding_window
    if "sliding_attention" in types and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"sliding_window: expected an int >= 1 for 'sliding_attention' layers, got {window!r}")
