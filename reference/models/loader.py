"""Move weights between transformers (Hugging Face) names and our models.

Our models keep transformers' parameter names, except that some projections are fused: one GEMM computes
what transformers does with several. A model class declares its fusions in ``stacked_params``::

    stacked_params = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}

meaning that transformers' ``...self_attn.q_proj.weight``, ``k_proj.weight`` and ``v_proj.weight`` are
rows ``[0, q)``, ``[q, q + k)`` and ``[q + k, q + k + v)`` of our ``...self_attn.qkv_proj.weight`` (biases
likewise). The row counts come from transformers itself: :func:`hf_shapes` builds the transformers
causal-LM class of the model's config on the meta device (no memory) and reads its state-dict shapes.
That also checks our model's structure: every transformers tensor must have exactly one place in ours.

Two more optional class attributes let a model read checkpoints whose names differ from its
transformers causal-LM class (e.g. the language model inside a multimodal checkpoint):

* ``hf_prefix_map: dict[str, str]``: a checkpoint name starting with a key has that prefix replaced by
  the value before matching (first matching key wins), e.g. ``{"language_model.model.": "model."}``.
* ``hf_ignored_prefixes: tuple[str, ...]``: checkpoint names starting with one of these are skipped,
  e.g. ``("vision_tower.", "multi_modal_projector.")``.

Tied parameters (``lm_head.weight`` is ``model.embed_tokens.weight`` when ``config.tie_word_embeddings``)
are one tensor under two names. A checkpoint needs only one of them (Llama 3.2 1B files have no
``lm_head.weight``); if it has both, their values must be equal: transformers unties a model whose
checkpoint holds two different tensors for tied names, which our tied model cannot do, so that is an error.

Only safetensors files are read: pickle-based checkpoints (``*.bin``, ``*.pt``) can run code when loaded.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import torch
from safetensors import safe_open
from torch import nn
from tqdm import tqdm
from transformers import AutoModelForCausalLM

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint does not fit the model (a tensor is missing, unexpected, repeated or of the wrong
    shape), or a checkpoint directory lacks the files it needs."""


@dataclass(frozen=True)
class _Slot:
    """Where one transformers tensor lives in our model: ``rows`` of our state-dict entry ``name``
    (``None``: the whole tensor). ``shape`` is the transformers tensor's shape."""

    name: str
    rows: slice | None
    shape: torch.Size


def hf_shapes(config) -> dict[str, torch.Size]:
    """transformers' state-dict names and shapes for ``config``, in transformers' order.

    Builds ``AutoModelForCausalLM.from_config(config)`` on the meta device, so nothing is allocated
    (no memory, little time). Non-persistent buffers (rotary ``inv_freq``) are not included.
    """
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(copy.deepcopy(config))  # a copy: it may set attributes
    return {name: tensor.shape for name, tensor in hf_model.state_dict().items()}


def _plan(model: nn.Module) -> dict[str, _Slot]:
    """transformers name -> slot in ``model``, in transformers' state-dict order.

    Raises:
        RuntimeError: our model's parameters do not line up with transformers' for its config (a bug in
            the model class or its ``stacked_params``, not in any checkpoint).
    """
    hf = hf_shapes(model.config)
    stacked = getattr(model, "stacked_params", {})
    plan: dict[str, _Slot] = {}

    def structure_error(detail: str) -> RuntimeError:
        return RuntimeError(
            f"{type(model).__name__} does not match transformers' {model.config.model_type!r} model: {detail}"
        )

    for name, tensor in model.state_dict().items():
        module_path, _, leaf = name.rpartition(".")
        parent, _, module_name = module_path.rpartition(".")
        if module_name in stacked:
            start = 0
            for part in stacked[module_name]:
                hf_name = ".".join(p for p in (parent, part, leaf) if p)
                if hf_name not in hf:
                    raise structure_error(f"{name} is stacked from {hf_name}, which transformers does not have")
                rows = hf[hf_name][0]
                plan[hf_name] = _Slot(name, slice(start, start + rows), hf[hf_name])
                start += rows
            parts_shape = (start, *hf[hf_name][1:])
            if tuple(tensor.shape) != parts_shape:
                raise structure_error(
                    f"{name} has shape {tuple(tensor.shape)} but its parts {list(stacked[module_name])} stack "
                    f"to {parts_shape}"
                )
        else:
            if name not in hf:
                raise structure_error(f"our {name} has no transformers counterpart")
            if hf[name] != tensor.shape:
                raise structure_error(f"{name}: ours {tuple(tensor.shape)}, transformers {tuple(hf[name])}")
            plan[name] = _Slot(name, None, hf[name])
    absent = [n for n in hf if n not in plan]
    if absent:
        raise structure_error(f"transformers tensors with no place in our model: {absent[:10]}")
    return {n: plan[n] for n in hf}


def _model_name(model: nn.Module, checkpoint_name: str) -> str | None:
    """The transformers name for a checkpoint name after ``hf_prefix_map``; None if it is ignored."""
    if checkpoint_name.startswith(tuple(getattr(model, "hf_ignored_prefixes", ()))):
        return None
    for prefix, replacement in getattr(model, "hf_prefix_map", {}).items():
        if checkpoint_name.startswith(prefix):
            return replacement + checkpoint_name[len(prefix) :]
    return checkpoint_name


@torch.no_grad()
def load_weights(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy transformers-named tensors into ``model``'s existing parameters and buffers.

    Args:
        model: one of our models; has ``config`` (a transformers config) and optionally
            ``stacked_params``, ``hf_prefix_map``, ``hf_ignored_prefixes`` (see the module docstring).
        named_tensors: ``(transformers name, tensor)`` pairs, any dtype and device; each is cast and moved
            into place (``Tensor.copy_``), so a stream of tensors read one at a time never needs the
            whole checkpoint in memory.

    Raises:
        CheckpointError: naming the tensor: an unexpected name, a name given twice, a shape different
            from transformers' for this config (expected and got shapes), two different values for tied
            names, or, after the last tensor, the names that were never given (of tied names, one is
            enough).
        RuntimeError: the model's structure does not match transformers' (see :func:`_plan`).
    """
    plan = _plan(model)
    targets = model.state_dict(keep_vars=True)
    filled_by: dict[tuple[int, int], str] = {}  # (tensor id, first row) -> checkpoint name; tied names share one
    loaded: set[str] = set()

    def key(slot: _Slot) -> tuple[int, int]:
        return id(targets[slot.name]), 0 if slot.rows is None else slot.rows.start

    for checkpoint_name, tensor in named_tensors:
        name = _model_name(model, checkpoint_name)
        if name is None:
            continue
        slot = plan.get(name)
        if slot is None:
            raise CheckpointError(
                f"unexpected tensor {checkpoint_name!r}: {type(model).__name__} for this config has no such "
                f"parameter (it expects {len(plan)} tensors such as {next(iter(plan))!r})"
            )
        if name in loaded:
            raise CheckpointError(f"tensor {checkpoint_name!r} is given twice")
        if tensor.shape != slot.shape:
            raise CheckpointError(
                f"tensor {checkpoint_name!r}: expected shape {tuple(slot.shape)}, got {tuple(tensor.shape)}"
            )
        loaded.add(name)
        target = targets[slot.name] if slot.rows is None else targets[slot.name][slot.rows]
        first = filled_by.setdefault(key(slot), checkpoint_name)
        if first == checkpoint_name:
            target.copy_(tensor)
        elif not torch.equal(target, tensor.to(target.device, target.dtype)):
            raise CheckpointError(
                f"tensor {checkpoint_name!r} differs from {first!r}, but the model ties them into one parameter "
                "(config.tie_word_embeddings); if the checkpoint's weights are really separate, set "
                "tie_word_embeddings to false in its config.json"
            )
    missing = [n for n, slot in plan.items() if key(slot) not in filled_by]
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        raise CheckpointError(f"missing {len(missing)} tensor(s): {shown}")


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under transformers' names and shapes (the inverse of :func:`load_weights`).

    Fused parameters are split into row views (no copies), so the result shares memory with ``model``.
    Tied aliases appear under every name, like ``nn.Module.state_dict``, so
    ``hf_model.load_state_dict(hf_state_dict(ours))`` works with ``strict=True``.

    Returns:
        transformers name -> tensor (our dtype and device), in transformers' state-dict order.
    """
    ours = model.state_dict()
    return {hf: ours[s.name] if s.rows is None else ours[s.name][s.rows] for hf, s in _plan(model).items()}


def copy_from_hf(model: nn.Module, hf_model: nn.Module) -> None:
    """Copy a transformers model's weights into ``model`` (same config). Raises as :func:`load_weights`."""
    load_weights(model, hf_model.state_dict().items())


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a transformers-format checkpoint directory, in load order.

    ``model.safetensors.index.json`` (sharded: the files its ``weight_map`` names) wins over
    ``model.safetensors``; without either, every ``*.safetensors`` file, sorted by name.

    Raises:
        CheckpointError: not a directory, an index naming files that do not exist, or no safetensors
            file (the message says so if only pickle-based ``*.bin``/``*.pt`` files are there).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint: {directory} is not a directory")
    index = directory / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({err!r})") from None
        files = [directory / f for f in dict.fromkeys(weight_map.values())]
        absent = [f.name for f in files if not f.exists()]
        if absent:
            raise CheckpointError(f"{index} names shard(s) that do not exist: {absent}")
        return files
    if (directory / SINGLE_FILE).exists():
        return [directory / SINGLE_FILE]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        pickles = sorted(p.name for p in directory.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            f"; found only pickle-based files {pickles}, which are never loaded (they can run code): "
            "convert them to safetensors"
            if pickles
            else ""
        )
        raise CheckpointError(f"checkpoint: no *.safetensors file in {directory}{hint}")
    return files


def read_safetensors(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``(name, tensor)`` from each file in turn (CPU tensors, one at a time); a progress bar
    is shown when there are several files."""
    for path in tqdm(files, desc="loading checkpoint shards", unit="shard", disable=len(files) < 2):
        with safe_open(path, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def load_checkpoint(model: nn.Module, directory: str | Path) -> None:
    """Load a transformers-format checkpoint directory (``*.safetensors``, single or sharded) into
    ``model``. The model must already be built for the directory's ``config.json``.

    Raises:
        CheckpointError: see :func:`checkpoint_files` and :func:`load_weights`.
    """
    load_weights(model, read_safetensors(checkpoint_files(directory)))
