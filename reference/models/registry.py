"""Model construction: a preset name or checkpoint directory -> config -> our model on a device.

The model class is chosen by the config's ``model_type`` through ``MODEL_CLASSES``; presets are in
:mod:`reference.models.presets`. Adding an architecture is one entry in each table at most.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import torch
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from reference.config import echo
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.llama import LlamaForCausalLM
from reference.models.loader import load_checkpoint
from reference.models.presets import PRESETS
from reference.models.qwen3 import Qwen3ForCausalLM
from reference.models.toy_llama import ToyLlama
from reference.models.weights import init_random_weights
from reference.ops import CustomOpSelection

# config.model_type -> our class, built as Class(config, ops).
MODEL_CLASSES: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
    "toy": ToyLlama,
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
        ValueError: the model type is not supported (the message lists the supported ones).
    """
    cls = MODEL_CLASSES.get(config.model_type)
    if cls is None:
        raise ValueError(
            f"model_type: {config.model_type!r} is not supported; supported: {sorted(MODEL_CLASSES)}"
        )
    return cls


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
