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

Checkpoint directories (which files, their headers, their tensors) are read by
:mod:`reference.models.safetensors_files`; :func:`load_checkpoint` checks every file's header against the
model before it reads any tensor data, so a wrong shape in the last shard fails at once, naming the file.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from reference.models.safetensors_files import (
    INDEX_FILE,
    CheckpointError,
    check_index,
    checkpoint_files,
    read_header,
    read_safetensors,
)
from reference.parallel import full_shape, shard, split_of

__all__ = [  # CheckpointError and checkpoint_files are re-exported from safetensors_files
    "CheckpointError",
    "LOADABLE_DTYPES",
    "checkpoint_files",
    "copy_from_hf",
    "hf_shapes",
    "hf_state_dict",
    "load_checkpoint",
    "load_weights",
]


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

    for name, param in model.state_dict(keep_vars=True).items():
        tensor = torch.empty(full_shape(param), device="meta")  # a shard counts with its whole shape
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


# Weights are cast to the model's dtype when loaded, from these dtypes only (safetensors' names and torch's):
# integer and float8 tensors hold quantized values, whose scales this loader does not apply.
LOADABLE_DTYPES = frozenset({"F16", "BF16", "F32", "F64", torch.float16, torch.bfloat16, torch.float32, torch.float64})


class _Matcher:
    """Checks checkpoint tensors one at a time against a model (known name, given once, transformers' shape,
    a loadable dtype) and remembers which of the model's tensors they fill. ``where`` (a file, or ``""``)
    prefixes every error message."""

    def __init__(self, model: nn.Module):
        self.model, self.plan = model, _plan(model)
        self.targets = model.state_dict(keep_vars=True)
        self.given: dict[str, str] = {}  # transformers name -> where it came from
        self.filled_by: dict[tuple[int, int], str] = {}  # (tensor id, first row) -> checkpoint name; tied share

    def key(self, slot: _Slot) -> tuple[int, int]:
        return id(self.targets[slot.name]), 0 if slot.rows is None else slot.rows.start

    def admit(self, checkpoint_name: str, shape, dtype, where: str = "") -> tuple[_Slot, str] | None:
        """``(slot, first checkpoint name filling it)`` for one tensor; None if the model ignores the name.

        Raises:
            CheckpointError: an unexpected name, a name given twice, a dtype not in ``LOADABLE_DTYPES``, or a
                shape other than transformers' for the model's config.
        """
        name = _model_name(self.model, checkpoint_name)
        if name is None:
            return None
        prefix, slot = f"{where}: " if where else "", self.plan.get(name)
        if slot is None:
            raise CheckpointError(
                f"{prefix}unexpected tensor {checkpoint_name!r}: {type(self.model).__name__} for this config has no "
                f"such parameter (it expects {len(self.plan)} tensors such as {next(iter(self.plan))!r})"
            )
        if name in self.given:
            also = f" (also in {self.given[name]})" if self.given[name] else ""
            raise CheckpointError(f"{prefix}tensor {checkpoint_name!r} is given twice{also}")
        if dtype not in LOADABLE_DTYPES:
            raise CheckpointError(
                f"{prefix}tensor {checkpoint_name!r}: dtype {dtype} is not one of the floating-point dtypes loaded "
                "(F16, BF16, F32, F64); quantized checkpoints are not supported"
            )
        if tuple(shape) != tuple(slot.shape):
            raise CheckpointError(
                f"{prefix}tensor {checkpoint_name!r}: expected shape {tuple(slot.shape)}, got {tuple(shape)}"
            )
        self.given[name] = where
        return slot, self.filled_by.setdefault(self.key(slot), checkpoint_name)

    def check_complete(self, where: str = "") -> None:
        """Raises CheckpointError naming the model's tensors no admitted name filled (of tied names, one is
        enough)."""
        missing = [n for n, slot in self.plan.items() if self.key(slot) not in self.filled_by]
        if missing:
            shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise CheckpointError(f"{f'{where}: ' if where else ''}missing {len(missing)} tensor(s): {shown}")


@torch.no_grad()
def load_weights(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy transformers-named tensors into ``model``'s existing parameters and buffers.

    Args:
        model: one of our models; has ``config`` (a transformers config) and optionally
            ``stacked_params``, ``hf_prefix_map``, ``hf_ignored_prefixes`` (see the module docstring).
        named_tensors: ``(transformers name, tensor)`` pairs, any floating dtype and device; each is cast and
            moved into place (``Tensor.copy_``), so a stream of tensors read one at a time never needs the
            whole checkpoint in memory.
            A tensor-parallel model (built inside ``parallel.use``) takes the whole transformers tensors and
            keeps its rank's shard of each (:func:`reference.parallel.shard`).

    Raises:
        CheckpointError: naming the tensor: an unexpected name, a name given twice, a shape different
            from transformers' for this config (expected and got shapes), a dtype that is not floating-point
            (``LOADABLE_DTYPES``), two different values for tied names, or, after the last tensor, the names
            that were never given (of tied names, one is enough).
        RuntimeError: the model's structure does not match transformers' (see :func:`_plan`).
    """
    match = _Matcher(model)
    for checkpoint_name, tensor in named_tensors:
        admitted = match.admit(checkpoint_name, tensor.shape, tensor.dtype)
        if admitted is None:
            continue
        slot, first = admitted
        target, piece = shard(match.targets[slot.name], tensor, slot.rows)  # this rank's part of the tensor
        if first == checkpoint_name:
            target.copy_(piece)
        elif not torch.equal(target, piece.to(target.device, target.dtype)):
            raise CheckpointError(
                f"tensor {checkpoint_name!r} differs from {first!r}, but the model ties them into one parameter "
                "(config.tie_word_embeddings); if the checkpoint's weights are really separate, set "
                "tie_word_embeddings to false in its config.json"
            )
    match.check_complete()


def hf_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """``model``'s weights under transformers' names and shapes (the inverse of :func:`load_weights`).

    Fused parameters are split into row views (no copies), so the result shares memory with ``model``.
    Tied aliases appear under every name, like ``nn.Module.state_dict``, so
    ``hf_model.load_state_dict(hf_state_dict(ours))`` works with ``strict=True``.

    Returns:
        transformers name -> tensor (our dtype and device), in transformers' state-dict order.

    Raises:
        ValueError: ``model`` is a tensor-parallel shard (it holds only part of each tensor).
    """
    sharded = [n for n, p in model.named_parameters() if split_of(p) is not None]
    if sharded:
        raise ValueError(
            f"hf_state_dict: the model is one rank's shard of a tensor_parallel_size > 1 model ({sharded[0]} and "
            "others); build it with tensor_parallel_size=1"
        )
    ours = model.state_dict()
    return {hf: ours[s.name] if s.rows is None else ours[s.name][s.rows] for hf, s in _plan(model).items()}


def copy_from_hf(model: nn.Module, hf_model: nn.Module) -> None:
    """Copy a transformers model's weights into ``model`` (same config). Raises as :func:`load_weights`."""
    load_weights(model, hf_model.state_dict().items())


def load_checkpoint(model: nn.Module, directory: str | Path) -> None:
    """Load a transformers-format checkpoint directory (``*.safetensors``, single or sharded) into
    ``model``. The model must already be built for the directory's ``config.json``.

    First every file's header is read and checked against the model (names, dtypes, shapes, nothing
    missing, the index's ``weight_map`` true to the shards); only then are the tensors read and copied.

    Raises:
        CheckpointError: one line naming the file (the index or the directory for a missing tensor) and
            the tensor; see :func:`~reference.models.safetensors_files.checkpoint_files`,
            :func:`~reference.models.safetensors_files.read_header` and :func:`load_weights`.
    """
    directory = Path(directory)
    files = checkpoint_files(directory)
    headers = {path: read_header(path) for path in files}
    check_index(directory, headers)
    match = _Matcher(model)
    for path, header in headers.items():
        for name, info in header.items():
            match.admit(name, info.shape, info.dtype, where=str(path))
    index = directory / INDEX_FILE
    match.check_complete(where=str(index if index.exists() else files[0] if len(files) == 1 else directory))
    current = [directory]  # the file being read, for the one error left (tied tensors that differ)

    def tensors():
        for path, name, tensor in read_safetensors(files):
            current[0] = path
            yield name, tensor

    try:
        load_weights(model, tensors())
    except CheckpointError as err:
        raise CheckpointError(f"{current[0]}: {err}") from None
