"""Model presets as data: a name -> the transformers config with a public model's exact dimensions.

Preset dimensions are those of the public ``config.json`` files of the Hugging Face repositories
``meta-llama/Llama-3.2-1B``, ``meta-llama/Llama-3.1-8B``, ``meta-llama/Llama-3.1-70B``, ``Qwen/Qwen3-8B``
and ``google/gemma-3-4b-it`` (its ``text_config``); the base Llama models' ``eos_token_id`` is 128001
(the instruct variants differ only in their end-of-turn tokens). The conformance tests check the
parameter counts these dimensions imply against the published ones (conformance/test_registry.py). The
tiny presets are small random models of each architecture for CPU tests.
"""

from __future__ import annotations

import copy
from typing import Callable

from transformers import Gemma3TextConfig, LlamaConfig, PretrainedConfig, Qwen3Config

from reference.models.toy_llama import toy_llama_config


def _llama3(**fields) -> dict:
    """Llama 3.x fields shared by the public 1B/8B/70B configs, updated with ``fields``."""
    base = dict(
        architectures=["LlamaForCausalLM"],
        vocab_size=128256,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rms_norm_eps=1e-5,
        initializer_range=0.02,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=128000,
        eos_token_id=128001,
        tie_word_embeddings=False,
        # llama3 scaling: Meta's long-context RoPE frequency rescaling, as in the public configs
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=8192,
        ),
    )
    base.update(fields)
    return base


LLAMA_3_2_1B = _llama3(
    hidden_size=2048,
    intermediate_size=8192,
    num_hidden_layers=16,
    num_attention_heads=32,
    head_dim=64,
    tie_word_embeddings=True,
    rope_parameters={**_llama3()["rope_parameters"], "factor": 32.0},
)
LLAMA_3_1_8B = _llama3(
    hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, head_dim=128
)
LLAMA_3_1_70B = _llama3(
    hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64, head_dim=128
)
# A tiny random Llama for CPU tests. Its rope settings put its 8 frequencies in all three llama3 bands
# (kept, smoothly interpolated, divided by `factor`) so the scaling code is exercised. Weights are drawn
# with std 0.2 instead of 0.02 so attention is far from uniform and the logits spread widely: with
# std 0.02 and H=64, q.k scores are ~0.03 and a broken mask or rotation would barely change the output.
LLAMA_TINY = _llama3(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=512,
    initializer_range=0.2,
    bos_token_id=1,
    eos_token_id=2,
    rope_parameters=dict(
        rope_type="llama3",
        rope_theta=10000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=64,
    ),
)

# Qwen/Qwen3-8B, public config.json: 8,190,735,360 parameters (6,946,075,648 non-embedding), the model
# card's "8.2B, 6.95B non-embedding". rope_theta 1e6, no rope scaling, no sliding window, untied head.
QWEN3_8B = dict(
    architectures=["Qwen3ForCausalLM"],
    vocab_size=151936,
    hidden_size=4096,
    intermediate_size=12288,
    num_hidden_layers=36,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    hidden_act="silu",
    max_position_embeddings=40960,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    attention_bias=False,
    attention_dropout=0.0,
    use_sliding_window=False,
    sliding_window=None,
    max_window_layers=36,
    tie_word_embeddings=False,
    bos_token_id=151643,
    eos_token_id=151645,
    rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
)
# A tiny random Qwen3 for CPU tests (same shape as llama-tiny; std 0.2 for the same reason). rope_theta
# 1e4 instead of 1e6 so that positions below 64 still turn the low frequencies measurably.
QWEN3_TINY = {
    **QWEN3_8B,
    **dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        max_window_layers=2,
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0),
    ),
}
# The text decoder of google/gemma-3-4b-it (and -pt): the `text_config` of its public config.json
# (hidden 2560, intermediate 10240, 34 layers, sliding window 1024, linear rope scaling x8) with the
# Gemma3TextConfig defaults of transformers 4.50, the release that shipped Gemma 3, for every field it
# leaves out. Every sixth layer is global (sliding_window_pattern 6). 3,880,263,168 parameters, of which
# 3,209,010,688 outside the (tied) embedding: the 3,209M non-embedding parameters of the technical
# report (Table 1).
GEMMA_3_4B = dict(
    architectures=["Gemma3ForCausalLM"],
    vocab_size=262208,
    hidden_size=2560,
    intermediate_size=10240,
    num_hidden_layers=34,
    num_attention_heads=8,
    num_key_value_heads=4,
    head_dim=256,
    hidden_activation="gelu_pytorch_tanh",
    max_position_embeddings=131072,
    initializer_range=0.02,
    rms_norm_eps=1e-6,
    attention_bias=False,
    attention_dropout=0.0,
    query_pre_attn_scalar=256,
    sliding_window=1024,
    layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(34)],
    final_logit_softcapping=None,
    attn_logit_softcapping=None,
    tie_word_embeddings=True,
    pad_token_id=0,
    eos_token_id=1,
    bos_token_id=2,
    rope_parameters={
        "full_attention": dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
        "sliding_attention": dict(rope_type="default", rope_theta=10000.0),
    },
)
# A tiny random Gemma 3 for CPU tests: local, global and local layers, a 4-token window (so prompts and
# decodes of a dozen tokens leave it) and the 4B's rope settings; std 0.2 as llama-tiny. Two settings
# differ from the 4B so that CPU tests can see them: query_pre_attn_scalar is 2 * head_dim (the 27B's
# is not head_dim either), so an attention scale taken from head_dim would show; and the logits are
# soft-capped (at Gemma 2's 30): they reach about 10 here, which the cap bends by about 0.4.
GEMMA_3_TINY = {
    **GEMMA_3_4B,
    **dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=32,
        max_position_embeddings=512,
        sliding_window=4,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        final_logit_softcapping=30.0,
        initializer_range=0.2,
    ),
}


def _from_fields(config_cls: type[PretrainedConfig], fields: dict) -> Callable[[], PretrainedConfig]:
    return lambda: config_cls(**copy.deepcopy(fields))


def _toy_llama_config() -> PretrainedConfig:
    config = toy_llama_config()
    config.model_type = "toy"  # selects ToyLlama in MODEL_CLASSES; transformers still sees a LlamaConfig
    return config


PRESETS: dict[str, Callable[[], PretrainedConfig]] = {
    "llama-3.2-1b": _from_fields(LlamaConfig, LLAMA_3_2_1B),
    "llama-3.1-8b": _from_fields(LlamaConfig, LLAMA_3_1_8B),
    "llama-3.1-70b": _from_fields(LlamaConfig, LLAMA_3_1_70B),
    "llama-tiny": _from_fields(LlamaConfig, LLAMA_TINY),
    "qwen3-8b": _from_fields(Qwen3Config, QWEN3_8B),
    "qwen3-tiny": _from_fields(Qwen3Config, QWEN3_TINY),
    "gemma-3-4b": _from_fields(Gemma3TextConfig, GEMMA_3_4B),
    "gemma-3-tiny": _from_fields(Gemma3TextConfig, GEMMA_3_TINY),
    "toy-llama": _toy_llama_config,
}
