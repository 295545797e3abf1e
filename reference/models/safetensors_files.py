"""The safetensors files of a transformers-format checkpoint directory: which files, their headers, their tensors.

A directory holds ``model.safetensors``, or shards named by ``model.safetensors.index.json`` (its
``weight_map``: tensor name -> shard file). A safetensors file is an 8-byte little-endian header length N,
N bytes of JSON (tensor name -> ``{"dtype", "shape", "data_offsets": [begin, end]}``, plus an optional
``"__metadata__"``), then the tensors' bytes, back to back. :func:`read_header` checks all of that against
the file before anything is loaded, so a truncated download or a hand-edited header is reported as one
line naming the file (and the tensor), not as a traceback from the safetensors library.

Only safetensors files are read: pickle-based checkpoints (``*.bin``, ``*.pt``) can run code when loaded.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
# bytes per element of each safetensors dtype (the format's names; sub-byte F4/F6 types are not read here)
DTYPE_BYTES = {
    **dict.fromkeys(["BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ"], 1),
    **dict.fromkeys(["I16", "U16", "F16", "BF16"], 2),
    **dict.fromkeys(["I32", "U32", "F32"], 4),
    **dict.fromkeys(["I64", "U64", "F64", "C64"], 8),
}


class CheckpointError(ValueError):
    """A checkpoint does not fit the model (a tensor is missing, unexpected, repeated or of the wrong
    shape or dtype), a checkpoint file is damaged, or a checkpoint directory lacks the files it needs. The
    message is one line; for a checkpoint directory it names the file (or the directory) and the tensor."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as a safetensors header describes it: ``dtype`` in the format's names (``'BF16'``)."""

    dtype: str
    shape: torch.Size


def weight_map(directory: Path) -> dict[str, str] | None:
    """The index's ``weight_map`` (tensor name -> shard file name), or None without an index.

    Raises:
        CheckpointError: the index is not JSON with a ``weight_map`` object of strings.
    """
    index = directory / INDEX_FILE
    if not index.exists():
        return None
    try:
        mapping = json.loads(index.read_text())["weight_map"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise CheckpointError(f"{index}: not a safetensors index with a 'weight_map' ({err!r})") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise CheckpointError(f"{index}: 'weight_map' must map each tensor name to a shard file name")
    return mapping


def checkpoint_files(directory: str | Path) -> list[Path]:
    """The safetensors files of a checkpoint directory, in load order.

    ``model.safetensors.index.json`` (sharded: the files its ``weight_map`` names, sorted by name) wins over
    ``model.safetensors``; without either, every ``*.safetensors`` file, sorted by name.

    Raises:
        CheckpointError: not a directory, an index naming files that do not exist, or no safetensors
            file (the message says so if only pickle-based ``*.bin``/``*.pt`` files are there).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint: {directory} is not a directory")
    mapping = weight_map(directory)
    if mapping is not None:
        files = [directory / f for f in sorted(set(mapping.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise CheckpointError(f"{directory / INDEX_FILE} names shard(s) that do not exist: {absent}")
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


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors a safetensors file holds (name -> dtype and shape), after checking its header against the
    file: reads the header only, not the tensor data.

    Raises:
        CheckpointError: naming the file (and the tensor): unreadable, truncated (shorter than its header
            says), a header that is not JSON, an entry without dtype/shape/data_offsets, an unknown dtype,
            a dtype and shape whose size differs from the bytes the offsets give, offsets with gaps or
            overlaps, or bytes after the last tensor.
    """
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            prefix = f.read(8)
            length = int.from_bytes(prefix, "little")
            text = f.read(length) if len(prefix) == 8 and 0 < length <= min(size - 8, MAX_HEADER_BYTES) else b""
    except OSError as err:
        raise CheckpointError(f"{path}: cannot be read ({err.strerror or err})") from None
    if len(prefix) < 8:
        raise CheckpointError(f"{path}: truncated: {size} bytes, fewer than the 8 of a safetensors header length")
    if not text:
        raise CheckpointError(
            f"{path}: truncated or not a safetensors file: its first 8 bytes give a header of {length} bytes, "
            f"and {size - 8} follow"
        )
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: not a safetensors file: its header is not JSON ({err})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: not a safetensors file: its header is not a JSON object")
    tensors, spans = {}, []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        where = f"{path}: tensor {name!r}"
        entry = entry if isinstance(entry, dict) else {}
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (isinstance(shape, list) and all(map(_is_count, shape))):
            raise CheckpointError(f"{where}: the header's shape {shape!r} is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_count, offsets))):
            raise CheckpointError(f"{where}: the header's data_offsets {offsets!r} are not [begin, end]")
        if dtype not in DTYPE_BYTES:
            raise CheckpointError(f"{where}: the header's dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}")
        nbytes, (begin, end) = math.prod(shape) * DTYPE_BYTES[dtype], offsets
        if end - begin != nbytes:
            raise CheckpointError(
                f"{where}: the header's dtype {dtype} and shape {shape} make {nbytes} bytes, but its data_offsets "
                f"[{begin}, {end}] hold {end - begin}"
            )
        tensors[name] = TensorInfo(dtype, torch.Size(shape))
        spans.append((begin, end, name))
    covered = 0
    for begin, end, name in sorted(spans):
        if begin != covered:
            raise CheckpointError(
                f"{path}: tensor {name!r}: its data_offsets start at {begin}, but the tensors before it end at "
                f"{covered} (overlapping or with a gap)"
            )
        covered = end
    data = size - 8 - length
    if covered > data:
        raise CheckpointError(
            f"{path}: truncated: its header describes {covered} bytes of tensor data, but the file holds {data} "
            "(an interrupted download or copy?)"
        )
    if covered < data:
        raise CheckpointError(f"{path}: not a valid safetensors file: {data - covered} bytes after the last tensor")
    return tensors


def check_index(directory: Path, headers: dict[Path, dict[str, TensorInfo]]) -> None:
    """Check that each tensor the index names is in the shard it names (``headers``: :func:`read_header` of
    every shard).

    Raises:
        CheckpointError: naming the index, the tensor and the shard.
    """
    for name, file in (weight_map(directory) or {}).items():
        if name not in headers[directory / file]:
            raise CheckpointError(
                f"{directory / INDEX_FILE}: its weight_map puts tensor {name!r} in {file}, which does not hold it"
            )


def read_safetensors(files: list[Path]) -> Iterator[tuple[Path, str, torch.Tensor]]:
    """Yield ``(file, name, tensor)`` from each file in turn (CPU tensors, one at a time); a progress bar
    is shown when there are several files.

    Raises:
        CheckpointError: naming the file, if the safetensors library cannot read it.
    """
    for path in tqdm(files, desc="loading checkpoint shards", unit="shard", disable=True if len(files) < 2 else None):
        try:
            with safe_open(path, framework="pt") as f:
                for name in f.keys():
                    yield path, name, f.get_tensor(name)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{path}: cannot be read: {' '.join(str(err).split())}") from None
