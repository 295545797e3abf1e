"""A tiny Llama whose output is known in closed form, for structure and equivalence tests.

It is :class:`~reference.models.llama.LlamaForCausalLM` (same layers, same custom ops) with two changes:

* Attention is ``reference::toy_attention``: causal softmax attention over the whole token batch as one
  sequence, with no KV cache and no forward context. It is pure tensor code, so it is correct inside a
  CUDA graph too, which lets the tests compare split and unsplit (whole-graph) capture.
* Weights are set so every hidden row is a constant vector: token ``t`` carries one scalar per layer.
  Query weights are zero, so attention weights are uniform and attention is the running mean of the
  values. ``rms_norm_eps = 1`` keeps the norms informative (``c -> c / sqrt(c^2 + 1)``) instead of
  collapsing every scalar to its sign. :func:`expected_hidden` computes the result in float64 from
  these rules alone.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig

from reference.models.llama import LlamaForCausalLM
from reference.ops import CustomOpSelection
from reference.ops.library import define_op

TOY_SPLITTING_OPS = ("reference::toy_attention",)


def toy_attention_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, num_heads: int, num_kv_heads: int
) -> None:
    """Causal attention of all T tokens as one sequence. q, out: [T, Hq*D]; k, v: [T, Hkv*D]."""
    t = q.shape[0]
    q, k, v = (x.view(t, h, -1).transpose(0, 1) for x, h in ((q, num_heads), (k, num_kv_heads), (v, num_kv_heads)))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # [Hq, T, D]
    out.copy_(o.transpose(0, 1).reshape(t, -1))


# Not tagged cudagraph_unsafe: it is pure tensor code, correct inside a graph (so split and unsplit capture
# can be compared); tests name it in splitting_ops.
toy_attention = define_op(
    "toy_attention", toy_attention_impl, mutates_args=("out",), fake=lambda q, k, v, out, h, kv: None
)


class ToyAttention(nn.Module):
    """Drop-in for :class:`~reference.ops.Attention` (same constructor) without a KV cache."""

    def __init__(self, num_heads, num_kv_heads, head_size, scale, layer_name, **_):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.layer_name = layer_name

    def forward(self, q, k, v):
        out = q.new_empty(q.shape)
        toy_attention(q, k, v, out, self.num_heads, self.num_kv_heads)
        return out


def toy_llama_config(num_layers: int = 2, **overrides) -> LlamaConfig:
    """A tiny ``LlamaConfig`` (H=32, 4 heads of 8, 2 KV heads, I=64, vocab 64) with ``rms_norm_eps=1``."""
    fields = dict(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_hidden_layers=num_layers,
        rms_norm_eps=1.0,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    fields.update(overrides)
    return LlamaConfig(**fields)


def _embedding_value(token: int, vocab_size: int) -> float:
    return (token + 1) / vocab_size


class ToyLlama(LlamaForCausalLM):
    """:class:`LlamaForCausalLM` with toy attention and the closed-form initialisation.

    ``forward(input_ids [T], positions [T]) -> [T, H]``; every row is constant; see :func:`expected_hidden`.
    """

    supports_tensor_parallel = False  # the closed form writes whole tensors into every layer

    def __init__(self, config: LlamaConfig, ops: CustomOpSelection):
        super().__init__(config, ops, attention_cls=ToyAttention)
        self._closed_form_init()

    @torch.no_grad()
    def _closed_form_init(self) -> None:
        c = self.config
        h, i = c.hidden_size, c.intermediate_size
        q_size = c.num_attention_heads * c.head_dim
        emb = torch.tensor([_embedding_value(t, c.vocab_size) for t in range(c.vocab_size)])
        self.model.embed_tokens.weight.copy_(emb[:, None].expand(-1, h))
        for layer in self.model.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = attn.qkv_proj.weight  # [q | k | v, H]
            qkv.zero_()  # q = 0: uniform attention
            qkv[q_size : q_size + attn.kv_size] = 0.5 / h  # k: any value, rotated but irrelevant
            qkv[q_size + attn.kv_size :] = 1.0 / h  # v = h (the normed scalar)
            attn.o_proj.weight.fill_(1.0 / q_size)  # o = mean of v
            mlp.gate_up_proj.weight.fill_(1.0 / h)  # gate = up = normed scalar
            mlp.down_proj.weight.fill_(1.0 / i)  # down = silu(x) * x
            for norm in (layer.input_layernorm, layer.post_attention_layernorm):
                norm.weight.fill_(1.0)
        self.model.norm.weight.fill_(1.0)


def expected_hidden(input_ids: list[int], config: LlamaConfig) -> torch.Tensor:
    """The toy model's output for one batch (treated as one causal sequence), in float64: [T, H]."""

    def norm(x):
        return x / math.sqrt(x * x + config.rms_norm_eps)

    def silu(x):
        return x / (1 + math.exp(-x))

    residual = [_embedding_value(t, config.vocab_size) for t in input_ids]
    for _ in range(config.num_hidden_layers):
        values = [norm(x) for x in residual]
        attn = [sum(values[: t + 1]) / (t + 1) for t in range(len(values))]
        residual = [r + a for r, a in zip(residual, attn)]
        residual = [r + silu(norm(r)) * norm(r) for r in residual]
    out = torch.tensor([norm(r) for r in residual], dtype=torch.float64)
    return out[:, None].expand(-1, config.hidden_size)
