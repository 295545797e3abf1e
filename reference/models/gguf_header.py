"""Check a GGUF file's header before transformers spends a minute reading it.

A GGUF file (llama.cpp's format, version 2 or 3) is: the magic ``GGUF``, a uint32 version, uint64 counts of
tensors and of key-value pairs, the key-value pairs (a string key, a uint32 value type, the value), one
info per tensor (name, dimensions, ggml type, offset into the data), then the tensor data, starting at the
next multiple of ``general.alignment`` (32 by default). All integers are little-endian.

:func:`read_gguf_header` walks that header without reading tensor data (arrays such as the 262k-token
vocabulary are skipped, not decoded), so it takes a fraction of a second where ``gguf.GGUFReader`` takes
about 13 s on Gemma 3 270M, and it finds what would otherwise be a traceback deep inside transformers:
a file that is not GGUF, a header cut short, tensor data that ends before the last tensor does.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
# GGUF value types: scalar type id -> struct format (string 8 and array 9 are read apart)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
MAX_DIMS = 4  # ggml tensors have at most four dimensions


class GGUFError(ValueError):
    """A GGUF file that cannot be read; the message is one line naming the file and the problem."""


@dataclass(frozen=True)
class GGUFHeader:
    """What a GGUF header says.

    Attributes:
        fields: scalar and string key-value pairs (``general.architecture`` -> ``'gemma3'``); arrays are
            recorded as their element count (``tokenizer.ggml.tokens`` -> 262144).
        tensors: tensor name -> (dimensions, ggml type id, offset of its data from the data start, bytes).
        data_start: file offset of the tensor data, in bytes.
    """

    fields: dict
    tensors: dict[str, tuple[tuple[int, ...], int, int, int]]
    data_start: int

    @property
    def data_end(self) -> int:
        """The file size, in bytes, that holds every tensor's data."""
        return self.data_start + max((offset + size for _, _, offset, size in self.tensors.values()), default=0)


class _Reader:
    """Little-endian reads from a binary file; a field longer than the bytes left raises ``EOFError`` naming
    the offset, before anything is read (a corrupt length would otherwise ask for up to 2**64 bytes)."""

    def __init__(self, file: BinaryIO):
        self.file = file
        self.size = file.seek(0, 2)
        file.seek(0)

    def take(self, size: int) -> bytes:
        if size > self.size - self.file.tell():
            raise EOFError(f"the header ends at byte {self.size}, inside a {size}-byte field")
        return self.file.read(size)

    def scalar(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar("<Q")).decode("utf-8", errors="replace")

    def value(self, kind: int):
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("<I"), self.scalar("<Q")
            if item in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item]))
            else:
                for _ in range(count):
                    self.value(item)
            return count
        raise ValueError(f"unknown value type {kind} at byte {self.file.tell() - 4}")

    def skip(self, size: int) -> None:
        target = self.file.tell() + size
        end = self.file.seek(0, 2)
        if target > end:
            raise EOFError(f"the header ends at byte {end}, inside an array of {size} bytes")
        self.file.seek(target)


def _tensor_bytes(path: Path, name: str, dims: tuple[int, ...], ggml_type: int) -> int:
    import gguf  # the `real` extra; only its table of block sizes is used

    try:
        block, block_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise GGUFError(f"{path}: tensor {name!r} has unknown ggml type {ggml_type}") from None
    elements = 1
    for dim in dims:
        elements *= dim
    if elements % block:
        raise GGUFError(f"{path}: tensor {name!r}: {elements} elements are not whole blocks of {block}")
    return elements // block * block_bytes


def read_gguf_header(path: str | Path) -> GGUFHeader:
    """Read and check the header of the GGUF file at ``path`` (no tensor data is read).

    Raises:
        GGUFError: one line naming the file: it cannot be opened, is not GGUF (magic), has an unsupported
            version, a header cut short or malformed, or is shorter than its tensors' data needs (truncated).
        ModuleNotFoundError: the ``gguf`` package (its ggml block sizes) is not installed.
    """
    path = Path(path)
    try:
        with path.open("rb") as file:
            reader = _Reader(file)
            magic = file.read(4)
            if magic != MAGIC:
                raise GGUFError(f"{path} is not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
            try:
                header = _read_after_magic(path, reader)
            except (EOFError, ValueError, struct.error) as err:
                if isinstance(err, GGUFError):
                    raise
                raise GGUFError(f"{path}: truncated or corrupt GGUF header: {err}") from None
            size = file.seek(0, 2)
    except OSError as err:
        raise GGUFError(f"{path} cannot be read ({err.strerror or err})") from None
    if size < header.data_end:
        raise GGUFError(f"{path} is truncated: {size} bytes, but its tensors' data needs {header.data_end}")
    return header


def _read_after_magic(path: Path, reader: _Reader) -> GGUFHeader:
    version = reader.scalar("<I")
    if version not in VERSIONS:
        raise GGUFError(f"{path}: GGUF version {version} is not supported; supported: {list(VERSIONS)}")
    tensor_count, field_count = reader.scalar("<Q"), reader.scalar("<Q")
    fields = {}
    for _ in range(field_count):
        key = reader.string()
        fields[key] = reader.value(reader.scalar("<I"))
    tensors = {}
    for _ in range(tensor_count):
        name = reader.string()
        ndims = reader.scalar("<I")
        if not 1 <= ndims <= MAX_DIMS:
            raise GGUFError(f"{path}: tensor {name!r} has {ndims} dimensions; GGUF allows 1 to {MAX_DIMS}")
        dims = tuple(reader.scalar("<Q") for _ in range(ndims))
        ggml_type, offset = reader.scalar("<I"), reader.scalar("<Q")
        tensors[name] = (dims, ggml_type, offset, _tensor_bytes(path, name, dims, ggml_type))
    alignment = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1:
        raise GGUFError(f"{path}: general.alignment: expected a positive integer, got {alignment!r}")
    position = reader.file.tell()
    return GGUFHeader(fields, tensors, -(-position // alignment) * alignment)
