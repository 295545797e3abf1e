"""Model presets and construction: a preset name or checkpoint directory -> config -> model on a device.

``PRESETS`` maps a name to a function returning a transformers config; the model class is chosen by the
config's ``model_type`` through ``MODEL_CLASSES`` (imported lazily, so a model module that fails to
import only breaks its own presets). Adding a preset is one entry in each table at most.

Preset dimensions are those of the public ``config.json`` files of the Hugging Face repositories
``meta-llama/Llama-3.2-1B``, ``meta-llama/Llama-3.1-8B`` and ``meta-llama/Llama-3.1-70B`` (base models:
``eos_token_id`` 128001; the instruct variants differ only in their end-of-turn tokens). The tests check
the parameter counts these dimensions imply against the published ones: 1,235,814,400 (Llama 3.2 1B's
model page), and half the bf16 ``total_size`` of the ``model.safetensors.index.json`` files:
16,060,522,496 bytes (3.1 8B) and 141,107,412,992 bytes (3.1 70B).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch import nn
from transformers import AutoConfig, Gemma3TextConfig, LlamaConfig, PretrainedConfig, Qwen3Config

from reference.config import echo
from reference.models.loader import load_checkpoint
from reference.ops import CustomOpSelection, RMSNorm


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
    from reference.models.toy_llama import toy_llama_config

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

# config.model_type -> "module:Class"; the class is built as Class(config, ops).
MODEL_CLASSES: dict[str, str] = {
    "llama": "reference.models.llama:LlamaForCausalLM",
    "qwen3": "reference.models.qwen3:Qwen3ForCausalLM",
    "gemma3_text": "reference.models.gemma3:Gemma3ForCausalLM",
    "toy": "reference.models.toy_llama:ToyLlama",
}

# model types whose weights are not drawn at random for presets (their constructor sets them)
CLOSED_FORM_MODEL_TYPES = frozenset({"toy"})


def model_config(model: str | Path) -> PretrainedConfig:
    """The transformers config of a preset name or a local checkpoint directory.

    A directory is read with ``AutoConfig.from_pretrained(directory, local_files_only=True)`` (offline).

    Raises:
        ValueError: ``model`` is neither a preset nor a directory with ``config.json`` (the message lists
            the presets), or transformers cannot read the ``config.json``.
    """
    if str(model) in PRESETS:
        return PRESETS[str(model)]()
    path = Path(model)
    if not (path / "config.json").is_file():
        what = "a directory without config.json" if path.is_dir() else "neither a preset nor a directory"
        raise ValueError(
            f"model: {echo(str(model))} is {what}; expected a preset ({', '.join(PRESETS)}) or a "
            "transformers checkpoint directory containing config.json and *.safetensors"
        )
    try:
        return AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, KeyError, OSError) as err:
        raise ValueError(f"model: transformers could not read {path / 'config.json'}: {err}") from None


def model_class(config: PretrainedConfig) -> type[nn.Module]:
    """Our model class for ``config.model_type`` (see ``MODEL_CLASSES``).

    Raises:
        ValueError: the model type is not supported (the message lists the supported ones), or its
            module cannot be imported.
    """
    target = MODEL_CLASSES.get(config.model_type)
    if target is None:
        raise ValueError(
            f"model_type: {config.model_type!r} is not supported; supported: {sorted(MODEL_CLASSES)}"
        )
    module_name, class_name = target.split(":")
    try:
        return getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model_type {config.model_type!r}: cannot import {target} ({err})") from None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: expected a floating-point torch.dtype (e.g. torch.bfloat16), got {dtype!r}")
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(
    model: str | Path,
    ops: CustomOpSelection,
    *,
    dtype: torch.dtype,
    device: str | torch.device,
    seed: int = 0,
    share_weights_with: nn.Module | None = None,
) -> nn.Module:
    """Build a model from a preset name or a checkpoint directory, directly on ``device`` in ``dtype``.

    Parameters are created on the device in ``dtype`` (no CPU copy, no later ``.to``); tables computed
    at construction in float32 on purpose (the rotary cos/sin table) stay float32. Weights:

    * checkpoint directory: loaded from its safetensors files (:func:`~reference.models.loader.load_checkpoint`);
    * ``toy-llama``: its closed-form values;
    * other presets: :func:`init_random_weights` with ``seed``; on the meta device nothing is drawn.

    Args:
        model: preset name (``PRESETS``) or path of a transformers checkpoint directory.
        ops: custom-op selection the layers are built with (decides native vs custom per op).
        dtype: parameter dtype, e.g. ``torch.bfloat16``.
        device: e.g. ``"cuda"``, ``"cpu"``, or ``"meta"`` (shapes only, no memory).
        seed: random-init seed (presets only).
        share_weights_with: a model built from the same ``model`` to take parameters and buffers from
            (the very same tensors, no copy), e.g. to run several compilation modes over one set of
            weights. The new model is built on the meta device first, so nothing is allocated.

    Returns:
        the model, in eval mode.

    Raises:
        ValueError: unknown preset or unreadable directory (:func:`model_config`), unsupported model type,
            a non-float ``dtype``, or ``share_weights_with`` of another structure, dtype or device.
        CheckpointError: the checkpoint does not fit the config.
    """
    config = model_config(model)
    cls = model_class(config)
    device = torch.device(device)
    if share_weights_with is not None:
        with _default_dtype(dtype), torch.device("meta"):
            net = cls(config, ops)
        _share_tensors(net, share_weights_with, dtype, device)
        return net.eval()
    with _default_dtype(dtype), device:
        net = cls(config, ops)
    if str(model) not in PRESETS:
        load_checkpoint(net, model)
    elif config.model_type not in CLOSED_FORM_MODEL_TYPES and device.type != "meta":
        init_random_weights(net, seed)
    return net.eval()


@torch.no_grad()
def init_random_weights(model: nn.Module, seed: int) -> None:
    """transformers-style random init, on the parameters' device, from one seeded generator.

    Linear and Embedding weights ~ normal(0, ``config.initializer_range``), Linear biases 0, RMSNorm
    weights at the identity (1 - ``weight_offset``: 1 for Llama/Qwen, 0 for Gemma). Parameters are drawn
    in ``named_modules`` order, each shared (tied) tensor once, so a seed gives the same weights on every
    run on the same device type and dtype.

    Raises:
        TypeError: a parameter of a module type with no rule here (names the parameter).
    """
    std = model.config.initializer_range
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    seen: set[int] = set()
    for module_name, module in model.named_modules():
        for name, param in module.named_parameters(recurse=False):
            if id(param) in seen:
                continue
            seen.add(id(param))
            if isinstance(module, (nn.Linear, nn.Embedding)) and name == "weight":
                param.normal_(0.0, std, generator=generator)
            elif isinstance(module, nn.Linear) and name == "bias":
                param.zero_()
            elif isinstance(module, RMSNorm) and name == "weight":
                param.fill_(1.0 - module.weight_offset)
            else:
                raise TypeError(
                    f"init_random_weights: no rule for {module_name}.{name} of a {type(module).__name__}; "
                    "add one here"
                )


def _share_tensors(net: nn.Module, source: nn.Module, dtype: torch.dtype, device: torch.device) -> None:
    """Make ``net`` (built on meta) use ``source``'s parameter and buffer objects."""
    ours = {n: tuple(t.shape) for n, t in net.state_dict().items()}
    theirs = {n: tuple(t.shape) for n, t in source.state_dict().items()}
    if ours != theirs:
        diff = sorted(set(ours.items()) ^ set(theirs.items()))[:5]
        raise ValueError(f"share_weights_with: the models' tensors differ (name, shape): {diff}")
    param = next(source.parameters())
    if param.dtype != dtype or param.device.type != device.type:
        raise ValueError(
            f"share_weights_with: its parameters are {param.dtype} on {param.device}, "
            f"but dtype={dtype} and device={device} were asked for"
        )
    sources = dict(source.named_modules(remove_duplicate=False))
    for module_name, module in net.named_modules(remove_duplicate=False):
        other = sources[module_name]
        for name in module._parameters:
            module._parameters[name] = other._parameters[name]
        for name in module._buffers:
            module._buffers[name] = other._buffers[name]
        left = [k for k, v in vars(module).items() if isinstance(v, torch.Tensor) and v.is_meta]
        if left:
            raise ValueError(f"share_weights_with: {module_name} keeps meta tensors {left} that cannot be shared")


def weight_bytes_per_decode_step(model: nn.Module) -> int:
    """Bytes of parameters one decode step reads from memory (the bandwidth floor's numerator).

    Every parameter counts once, except a parameter used only by ``nn.Embedding`` modules: an untied
    input embedding table is gathered (one row per token), not streamed. A tied embedding is also the
    LM head's weight and counts once. Buffers (rotary tables) are gathered by position and not counted.
    Works on the meta device (shapes and dtypes only): Llama-3.1-8B in bf16 gives 15,009,849,344 bytes.
    """
    streamed: dict[int, torch.Tensor] = {}
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            continue
        for param in module.parameters(recurse=False):
            streamed[id(param)] = param
    return sum(p.numel() * p.element_size() for p in streamed.values())
