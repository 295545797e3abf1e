"""Llama-architecture decoder (Llama 2/3.x), built from a transformers ``LlamaConfig``.

Same computation as transformers' ``LlamaForCausalLM`` (the oracle), written for inference: q/k/v and
gate/up projections are fused into one GEMM each, RMSNorm fuses the residual add, attention goes through
the opaque KV-cache op, and the model takes flat token batches (``input_ids [T]``, ``positions [T]``)
instead of padded ``[B, S]`` tensors. Parameter names are transformers' except the fused ones; see
``STACKED_PARAMS`` for the mapping the loader applies.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import LlamaConfig

from reference import parallel
from reference.models.rope import rope_frequencies
from reference.ops import Attention, CustomOp, CustomOpSelection, RMSNorm, RotaryEmbedding, SiluAndMul
from reference.ops.fused_linear import LinearActivation, LinearResidualAdd, RMSNormLinear, norm_gate_up
from reference.parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

# our fused parameter -> the transformers parameters stacked into it, in order (along dim 0)
STACKED_PARAMS = {
    "qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "gate_up_proj": ("gate_proj", "up_proj"),
}


def head_dim(config: LlamaConfig) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def llama_rotary(config: LlamaConfig, ops: CustomOpSelection) -> RotaryEmbedding:
    """RoPE with transformers' frequencies for ``config`` (default or llama3-scaled), one per model.

    Raises:
        ValueError: ``config.rope_parameters`` is missing or names an unknown kind (:func:`rope_frequencies`).
    """
    inv_freq, scaling = rope_frequencies(config, head_dim(config))
    return RotaryEmbedding(ops, head_dim(config), config.max_position_embeddings, inv_freq, scaling)


class LlamaAttention(nn.Module):
    """The attention sublayer's weights (qkv and output projections) and what runs between them.

    ``forward(positions [T], qkv [T, (Hq + 2 Hkv) D]) -> [T, Hq D]``: RoPE and attention of the qkv
    projection's output, before the output projection. The decoder layer applies ``qkv_proj`` (behind its
    norm) and ``o_proj`` (before the residual add), so each can be fused with its neighbour
    (:mod:`reference.ops.fused_linear`).

    Built inside ``parallel.use(tp)``, a rank holds ``1 / tp.size`` of the query and KV heads (column-
    parallel qkv, its KV cache sharded likewise) and the output projection is row-parallel (all-reduced).

    Args:
        config: the model config (heads, head_dim, attention_bias).
        ops: custom-op selection (used by subclasses that add normalisation layers).
        rotary: this layer's RoPE.
        prefix: the module path, e.g. ``model.layers.0.self_attn``; names the attention layer.
        attention_cls: the attention layer; :class:`~reference.ops.Attention` (KV cache) by default.
        scale: multiplies q k^T; default ``head_dim ** -0.5``.
        sliding_window: if set, each query sees only the last ``sliding_window`` keys (itself included).
    """

    def __init__(
        self,
        config: LlamaConfig,
        ops: CustomOpSelection,
        rotary: RotaryEmbedding,
        prefix: str,
        attention_cls=Attention,
        *,
        scale: float | None = None,
        sliding_window: int | None = None,
    ):
        super().__init__()
        size = parallel.current().size
        heads, kv_heads, d = config.num_attention_heads, config.num_key_value_heads, head_dim(config)
        qkv_sizes = [heads * d, kv_heads * d, kv_heads * d]  # full widths; this rank holds 1/size of each
        self.qkv_proj = ColumnParallelLinear(config.hidden_size, qkv_sizes, bias=config.attention_bias)
        self.o_proj = RowParallelLinear(heads * d, config.hidden_size, bias=config.attention_bias)
        heads, kv_heads = heads // size, kv_heads // size  # this rank's
        self.head_size, self.q_size, self.kv_size = d, heads * d, kv_heads * d
        self.rotary_emb = rotary
        scale = d**-0.5 if scale is None else scale
        self.attn = attention_cls(heads, kv_heads, d, scale, layer_name=f"{prefix}.attn", sliding_window=sliding_window)

    def forward(self, positions: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q, k = self.position_qk(positions, q, k)
        return self.attn(q, k, v)

    def position_qk(self, positions, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What q [T, Hq*D] and k [T, Hkv*D] go through before attention: RoPE in Llama (Qwen3 normalises
        each head first)."""
        return self.rotary_emb(positions, q, k)


class LlamaMLP(nn.Module):
    """Gated MLP's layers, SwiGLU by default: column-parallel gate/up and row-parallel down projections under
    tensor parallelism. The decoder layer runs them (``gate_up_proj`` behind its norm, ``down_proj`` before
    the residual add, each fusable with its neighbour: :mod:`reference.ops.fused_linear`).

    Args:
        act_cls: the gated activation layer; :class:`~reference.ops.SiluAndMul` (Llama, Qwen) by default,
            :class:`~reference.ops.GeluTanhAndMul` for Gemma.
    """

    def __init__(self, config: LlamaConfig, ops: CustomOpSelection, act_cls: type[CustomOp] = SiluAndMul):
        super().__init__()
        bias = getattr(config, "mlp_bias", False)
        width = config.intermediate_size
        self.gate_up_proj = ColumnParallelLinear(config.hidden_size, [width, width], bias=bias)
        self.down_proj = RowParallelLinear(width, config.hidden_size, bias=bias)
        self.act_fn = act_cls(ops)


class LlamaDecoderLayer(nn.Module):
    """Pre-norm block. ``forward(positions, hidden [T, H], residual [T, H] | None) -> (hidden, residual)``.

    The residual stream is ``hidden + residual`` (``hidden`` alone where ``residual`` is None): each residual
    add is deferred into the next RMSNorm (fused add + norm), unless ``linear_residual_add`` makes it at the
    end of o_proj or down_proj; ``rms_norm_linear`` and ``linear_activation`` fuse the norms and the
    activation into the GEMMs beside them (:mod:`reference.ops.fused_linear`). Same additions, same order.
    """

    self_attn_cls: type[LlamaAttention] = LlamaAttention  # Qwen3 swaps in q/k-normalised attention

    def __init__(self, config, ops: CustomOpSelection, rotary: RotaryEmbedding, prefix: str, attention_cls=Attention):
        super().__init__()
        self.input_layernorm = RMSNorm(ops, config.hidden_size, config.rms_norm_eps)
        self.self_attn = self.self_attn_cls(config, ops, rotary, f"{prefix}.self_attn", attention_cls)
        self.post_attention_layernorm = RMSNorm(ops, config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config, ops)
        self.norm_linear, self.linear_activation = RMSNormLinear(ops), LinearActivation(ops)
        self.linear_residual_add = LinearResidualAdd(ops)

    def forward(self, positions, hidden, residual):
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = self.norm_linear(hidden, residual, self.input_layernorm, attn.qkv_proj)
        hidden, residual = self.linear_residual_add(attn(positions, qkv), residual, attn.o_proj)
        gated, residual = norm_gate_up(
            self.norm_linear, self.linear_activation, hidden, residual, self.post_attention_layernorm, mlp
        )
        return self.linear_residual_add(gated, residual, mlp.down_proj)


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm. ``forward(input_ids [T], positions [T]) -> [T, H]``."""

    layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer

    def __init__(self, config: LlamaConfig, ops: CustomOpSelection, attention_cls=Attention):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        rotary = llama_rotary(config, ops)
        self.layers = nn.ModuleList(
            self.layer_cls(config, ops, rotary, f"model.layers.{i}", attention_cls)
            for i in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(ops, config.hidden_size, config.rms_norm_eps)
        self.layer_kinds = ("full_attention",) * config.num_hidden_layers  # one kind: every layer attends fully

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden, residual = self.embed_tokens(input_ids), None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        return self.norm(hidden) if residual is None else self.norm(hidden, residual)[0]


class LlamaForCausalLM(nn.Module):
    """Llama decoder with its LM head.

    ``forward(input_ids [T] int64, positions [T] int64) -> hidden [T, H]`` (model dtype);
    ``compute_logits(hidden [N, H]) -> [N, vocab]`` float32. Logits are computed outside the compiled
    forward, only for the tokens that need them (the last token of each sequence).

    Args:
        config: a transformers ``LlamaConfig``.
        ops: custom-op selection (which layers use custom implementations).
        attention_cls: the attention layer class (the toy model swaps in a stateless one).
    """

    stacked_params = STACKED_PARAMS
    supports_tensor_parallel = True  # built inside parallel.use(tp), it is rank tp.rank's shard
    model_cls: type[nn.Module] = LlamaModel  # the decoder stack; subclasses for other families swap it

    def __init__(self, config: LlamaConfig, ops: CustomOpSelection, attention_cls=Attention):
        super().__init__()
        self.config = config
        self.model = self.model_cls(config, ops, attention_cls)
        # vocabulary-parallel under tensor parallelism; compute_logits gathers the whole vocabulary
        self.lm_head = ColumnParallelLinear(config.hidden_size, [config.vocab_size], bias=False, gather_output=True)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @staticmethod
    def check_config(config: LlamaConfig) -> None:
        """Reject a config whose RoPE settings the model cannot build, when ``registry.model_config`` reads it.

        Raises:
            ValueError: naming the field (:func:`~reference.models.rope.rope_frequencies`).
        """
        rope_frequencies(config, head_dim(config))

    def repeated_layers(self) -> tuple[str, tuple[str, ...]]:
        """The decoder stack's module path and each layer's kind, for stamped layers
        (:mod:`reference.compilation.stamp`): layers of one kind run the same code on weights of the same
        shapes. Llama's and Qwen3's layers are all of one kind; Gemma 3's are its ``config.layer_types``."""
        return "model.layers", self.model.layer_kinds

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden).float()
