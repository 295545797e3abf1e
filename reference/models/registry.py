"""Model construction: a preset name or checkpoint directory -> config -> our model on a device.

The model class is chosen by the config's ``model_type`` through ``MODEL_CLASSES``; presets are in
:mod:`reference.models.presets`. Adding an architecture is one entry in each table at most.

A checkpoint directory's ``config.json`` is checked before transformers reads it (JSON, the fields of
``REQUIRED_FIELDS``, a supported ``model_type``), and the config transformers makes of it is checked by the
model class (``check_config``), so a config problem is one line naming the file and the field when the
config is read, not a shape error when the weights load. A multimodal config (``MULTIMODAL``: Gemma 3's
``gemma3``) gives its language model's config: we run the text decoder and ignore the vision tower.
"""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Iterator

import torch
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import AutoConfig, PretrainedConfig

from reference import parallel
from reference.config import echo
from reference.models import pretrained
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.llama import LlamaForCausalLM
from reference.models.loader import load_checkpoint
from reference.models.presets import PRESETS
from reference.models.qwen3 import Qwen3ForCausalLM
from reference.models.toy_llama import ToyLlama
from reference.models.weights import ConstructionInitSkipped, init_random_weights
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

# Fields a checkpoint's config.json must set itself: transformers' defaults for them are some other model's
# sizes, so a file that left one out would build a model of the wrong shape and fail later, on a tensor.
REQUIRED_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
)
# multimodal model_type -> (its text_config's model_type, the fields its text_config must set). Gemma 3's
# published text_configs (google/gemma-3-4b-it's) set neither vocab_size nor num_attention_heads: they rely
# on Gemma3TextConfig's defaults (262208, the vocabulary of every Gemma 3, and the 4B's 8 heads).
MULTIMODAL = {"gemma3": ("gemma3_text", ("model_type", "hidden_size", "num_hidden_layers", "intermediate_size"))}


def model_config(model: str | Path) -> PretrainedConfig:
    """The transformers config of a preset name, a pretrained model (``gemma-3-270m``, a ``.gguf`` file) or a
    local checkpoint directory.

    A pretrained model is its conversion's directory (:func:`reference.models.pretrained.resolve`). A
    directory's ``config.json`` is checked (:func:`check_config_json`), then read with
    ``AutoConfig.from_pretrained(directory, local_files_only=True)`` (offline), then checked by the model
    class (its ``check_config``, if it has one). For a multimodal config (``MULTIMODAL``) the result is its
    language model's config (:func:`language_model_config`).

    Raises:
        ValueError: one line: ``model`` is neither a preset nor a directory with ``config.json`` (the
            message lists the presets), a pretrained model that cannot be found or converted, or, naming
            the file and the field, the ``config.json`` is not a JSON object, leaves out a required field,
            gives one a wrong value, has an unsupported ``model_type``, or is refused by transformers or by the
            model class.
    """
    if str(model) in PRESETS:
        return PRESETS[str(model)]()
    path = Path(pretrained.resolve(model))
    file = path / "config.json"
    if not file.is_file():
        if not str(model).strip():  # Path('') is '.', a directory
            what = "empty"
        else:
            what = "a directory without config.json" if path.is_dir() else "neither a preset nor a directory"
        raise ValueError(
            f"model: {echo(str(model))} is {what}; expected a preset ({', '.join(PRESETS)}), a pretrained "
            f"model ({', '.join(pretrained.PACKAGED)}), a .gguf file or a transformers checkpoint directory "
            "containing config.json and *.safetensors"
        )
    fields = check_config_json(file)
    try:
        config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (ValueError, KeyError, OSError, TypeError, StrictDataclassError) as err:
        raise ValueError(f"model: transformers could not read {file}: {' '.join(str(err).split())}") from None
    prefix = ""
    if config.model_type in MULTIMODAL:
        config, prefix = language_model_config(config, fields), "text_config."
    check = getattr(model_class(config), "check_config", None)
    try:
        if check is not None:
            check(config)
    except ValueError as err:
        raise ValueError(f"model: {file}: {prefix}{err}") from None
    return config


def check_config_json(file: Path) -> dict:
    """The fields of a checkpoint's ``config.json``, checked: a JSON object with a supported ``model_type``
    that sets ``REQUIRED_FIELDS`` (a multimodal config: its ``text_config`` sets ``MULTIMODAL``'s fields),
    the sizes positive integers.

    Raises:
        ValueError: one line naming ``file`` and the field(s).
    """
    try:
        fields = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"model: {file} cannot be read ({err})") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"model: {file} is not valid JSON ({err})") from None
    if not isinstance(fields, dict):
        raise ValueError(f"model: {file} must hold a JSON object (a transformers config), not {type(fields).__name__}")
    model_type = fields.get("model_type")
    supported = sorted(set(MODEL_CLASSES) - CLOSED_FORM_MODEL_TYPES | set(MULTIMODAL))
    if model_type is not None and model_type not in supported:
        raise ValueError(f"model: {file}: model_type {echo(model_type)} is not supported; supported: {supported}")
    if model_type not in MULTIMODAL:
        _check_fields(file, fields, REQUIRED_FIELDS, "")
        return fields
    text_type, required = MULTIMODAL[model_type]
    text = fields.get("text_config")
    if not isinstance(text, dict):
        raise ValueError(f"model: {file}: text_config: expected a JSON object (the language model), got {echo(text)}")
    _check_fields(file, text, required, "text_config.")
    if text["model_type"] != text_type:
        raise ValueError(
            f"model: {file}: text_config.model_type: expected {text_type!r}, got {echo(text['model_type'])}"
        )
    return fields


def _check_fields(file: Path, fields: dict, required: tuple[str, ...], prefix: str) -> None:
    missing = [prefix + name for name in required if name not in fields]
    if missing:
        raise ValueError(
            f"model: {file} does not set {', '.join(missing)} (transformers would use its default, another "
            "model's size)"
        )
    for name in required:
        value = fields[name]
        if name != "model_type" and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"model: {file}: {prefix}{name}: expected a positive integer, got {echo(value)}")


def language_model_config(config: PretrainedConfig, fields: dict) -> PretrainedConfig:
    """A multimodal config's ``text_config`` (a copy), with what transformers' multimodal model takes from
    the top level: ``tie_word_embeddings`` (it ties the language model's head by the top-level config),
    ``eos_token_id`` where the file sets it there (Gemma 3's: ``[1, 106]``, ``<eos>`` and ``<end_of_turn>``),
    and ``dtype`` where the text config has none. ``fields``: the raw ``config.json``."""
    text = copy.deepcopy(config.get_text_config())
    text.tie_word_embeddings = config.tie_word_embeddings
    if "eos_token_id" in fields:
        text.eos_token_id = copy.deepcopy(config.eos_token_id)
    if getattr(text, "dtype", None) is None:
        text.dtype = config.dtype
    return text


def model_class(config: PretrainedConfig) -> type[nn.Module]:
    """Our model class for ``config.model_type`` (see ``MODEL_CLASSES``).

    Raises:
        ValueError: the model type is not supported (the message lists the supported ones).
    """
    cls = MODEL_CLASSES.get(config.model_type)
    if cls is None:
        raise ValueError(f"model_type: {config.model_type!r} is not supported; supported: {sorted(MODEL_CLASSES)}")
    return cls


def check_tensor_parallel(config: PretrainedConfig, size) -> None:
    """``size`` processes can shard this model: an int >= 1, and above 1 a model class with tensor-parallel
    layers whose heads, KV heads, MLP width and vocabulary it divides.

    Raises:
        ValueError: one line naming ``tensor_parallel_size`` (and the config field it does not divide).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"tensor_parallel_size: expected an int >= 1, got {echo(size)}")
    if size == 1:
        return
    if not getattr(model_class(config), "supports_tensor_parallel", False):
        raise ValueError(
            f"tensor_parallel_size={size}: model_type {config.model_type!r} has no tensor-parallel layers; use 1"
        )
    parallel.check_divisible(config, size)


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
    tensor_parallel: parallel.TensorParallel = parallel.SINGLE,
) -> nn.Module:
    """Build a model from a preset name or a checkpoint directory, directly on ``device`` in ``dtype``.

    Parameters are created on the device in ``dtype`` (no CPU copy, no later ``.to``); tables computed
    at construction in float32 on purpose (the rotary cos/sin table) stay float32. The layers' own
    construction-time init is skipped where every parameter is written next (``ConstructionInitSkipped``).
    Weights:

    * checkpoint directory: loaded from its safetensors files (:func:`~reference.models.loader.load_checkpoint`);
    * pretrained model (``gemma-3-270m``, a ``.gguf`` file): its converted checkpoint directory, likewise;
    * ``toy-llama``: its closed-form values;
    * other presets: :func:`init_random_weights` with ``seed``;
    * on the meta device, none of these: shapes only, nothing drawn or read.

    Args:
        model: preset name (``PRESETS``), pretrained model name or ``.gguf`` path
            (:mod:`reference.models.pretrained`) or path of a transformers checkpoint directory.
        ops: custom-op selection the layers are built with (decides native vs custom per op).
        dtype: parameter dtype, e.g. ``torch.bfloat16``.
        device: e.g. ``"cuda"``, ``"cpu"``, or ``"meta"`` (shapes only, no memory).
        seed: random-init seed (presets only).
        share_weights_with: a model built from the same ``model`` to take parameters and buffers from
            (the very same tensors, no copy), e.g. to run several compilation modes over one set of
            weights. The new model is built on the meta device first, so nothing is allocated.
        tensor_parallel: the group to shard the model over (this process holds rank ``tensor_parallel.rank``'s
            shard); checkpoints and random weights give every group size the same model.

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
        with _default_dtype(dtype), torch.device("meta"), parallel.use(tensor_parallel):
            net = cls(config, ops)
        _share_tensors(net, share_weights_with, dtype, device)
        return net.eval()
    written_after = device.type != "meta" and config.model_type not in CLOSED_FORM_MODEL_TYPES
    skip_init = ConstructionInitSkipped() if written_after else contextlib.nullcontext()
    with _default_dtype(dtype), device, parallel.use(tensor_parallel), skip_init:
        net = cls(config, ops)
    if device.type == "meta":
        return net.eval()  # shapes only: no weight is drawn or read
    if str(model) not in PRESETS:
        load_checkpoint(net, pretrained.resolve(model))
    elif config.model_type not in CLOSED_FORM_MODEL_TYPES:
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
