"""A checkpoint's files, checked before any model is built: what ./run mutate models.checkpoint found unguarded.

Each damaged directory, index or safetensors header below is refused with one whole line naming the file (and
the tensor), compared in full; the edges of the header checks (a header that fills the file exactly, a header of
0 bytes) are held apart.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch

from reference.models.safetensors_files import CheckpointError, checkpoint_files, read_header, weight_map

pytestmark = pytest.mark.requires("components")

F32_PAIR = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}


def _safetensors(path: Path, header: dict, data: bytes = b"", length: int | None = None) -> Path:
    """A file of a little-endian u64 header length (``length`` overrides it), the JSON header, then ``data``."""
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded) if length is None else length) + encoded + data)
    return path


def _refused(call, *args) -> str:
    with pytest.raises(CheckpointError) as err:
        call(*args)
    return str(err.value)


# ---------------------------------------------------------------------- the directory and its index
def test_a_path_that_is_not_a_directory_is_refused(tmp_path):
    assert _refused(checkpoint_files, tmp_path / "nope") == f"checkpoint: {tmp_path / 'nope'} is not a directory"


def test_a_directory_of_pickles_only_names_them_and_says_they_are_never_loaded(tmp_path):
    for name in ("a.bin", "b.pt", "c.pth", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert _refused(checkpoint_files, tmp_path) == (
        f"checkpoint: no *.safetensors file in {tmp_path}; found only pickle-based files ['a.bin', 'b.pt', 'c.pth'], "
        "which are never loaded (they can run code): convert them to safetensors"
    )


def test_an_empty_directory_says_only_that_no_safetensors_file_is_there(tmp_path):
    assert _refused(checkpoint_files, tmp_path) == f"checkpoint: no *.safetensors file in {tmp_path}"


def test_without_an_index_or_model_safetensors_every_safetensors_file_loads_in_name_order(tmp_path):
    for name in ("b.safetensors", "a.safetensors", "c.txt"):
        (tmp_path / name).write_text("x")
    assert checkpoint_files(tmp_path) == [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]


@pytest.mark.parametrize(
    "text, line",
    [
        ("{", "{index}: not a safetensors index with a 'weight_map' (JSONDecodeError("),
        ('{"weight_map": {"w": 1}}', "{index}: 'weight_map' must map each tensor name to a shard file name"),
        ('{"weight_map": ["w"]}', "{index}: 'weight_map' must map each tensor name to a shard file name"),
    ],
    ids=["not_json", "not_file_names", "not_an_object"],
)
def test_a_broken_index_is_refused_naming_it(tmp_path, text, line):
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(text)
    message = _refused(weight_map, tmp_path)
    assert message.startswith(line.format(index=index)) and "\n" not in message
    if not line.endswith("("):
        assert message == line.format(index=index)


# ---------------------------------------------------------------------- safetensors headers
def test_a_header_that_fills_the_file_exactly_is_a_file_without_tensors(tmp_path):
    assert read_header(_safetensors(tmp_path / "m.safetensors", {})) == {}


def test_a_file_shorter_than_the_header_length_is_refused(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(b"\x01\x02\x03\x04")
    assert _refused(read_header, path) == f"{path}: truncated: 4 bytes, fewer than the 8 of a safetensors header length"


@pytest.mark.parametrize("length", [0, 3], ids=["empty_header", "longer_than_the_file"])
def test_a_header_length_of_0_or_past_the_end_is_refused(tmp_path, length):
    path = _safetensors(tmp_path / "m.safetensors", {}, length=length)  # the header "{}" is 2 bytes
    assert _refused(read_header, path) == (
        f"{path}: truncated or not a safetensors file: its first 8 bytes give a header of {length} bytes, and 2 follow"
    )


@pytest.mark.parametrize(
    "entry, problem",
    [
        ({**F32_PAIR, "shape": [True]}, "the header's shape [True] is not a list of sizes"),
        ({**F32_PAIR, "shape": [-2]}, "the header's shape [-2] is not a list of sizes"),
        ({**F32_PAIR, "shape": "2"}, "the header's shape '2' is not a list of sizes"),
        ({**F32_PAIR, "data_offsets": [0, 8, 8]}, "the header's data_offsets [0, 8, 8] are not [begin, end]"),
        ({**F32_PAIR, "data_offsets": "0,8"}, "the header's data_offsets '0,8' are not [begin, end]"),
        ({**F32_PAIR, "dtype": "Q4"}, "the header's dtype 'Q4' is not one of ['BF16', "),
        ({**F32_PAIR, "data_offsets": [0, 12]}, "the header's dtype F32 and shape [2] make 8 bytes, but its "
         "data_offsets [0, 12] hold 12"),
        ("not an entry", "the header's shape None is not a list of sizes"),
    ],
    ids=["bool_size", "negative_size", "string_shape", "three_offsets", "string_offsets", "unknown_dtype",
         "offsets_past_the_size", "entry_not_an_object"],
)  # fmt: skip
def test_a_header_entry_that_does_not_describe_a_tensor_is_refused_naming_it(tmp_path, entry, problem):
    path = _safetensors(tmp_path / "m.safetensors", {"w": entry}, data=bytes(8))
    message = _refused(read_header, path)
    assert message.startswith(f"{path}: tensor 'w': {problem}") and "\n" not in message


def test_tensor_data_shorter_than_the_header_says_is_refused_as_truncated(tmp_path):
    path = _safetensors(tmp_path / "m.safetensors", {"w": F32_PAIR}, data=bytes(6))
    assert _refused(read_header, path) == (
        f"{path}: truncated: its header describes 8 bytes of tensor data, but the file holds 6 "
        "(an interrupted download or copy?)"
    )


def test_bytes_after_the_last_tensor_are_refused(tmp_path):
    path = _safetensors(tmp_path / "m.safetensors", {"w": F32_PAIR}, data=bytes(11))
    assert _refused(read_header, path) == f"{path}: not a valid safetensors file: 3 bytes after the last tensor"


def test_a_header_that_is_not_json_or_not_an_object_is_refused(tmp_path):
    """A header of one byte is read (not taken for an empty one) and is no JSON; a JSON list is no header."""
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", 1) + b"{")
    assert _refused(read_header, path).startswith(f"{path}: not a safetensors file: its header is not JSON (")
    _safetensors(path, [1])
    assert _refused(read_header, path) == f"{path}: not a safetensors file: its header is not a JSON object"


def test_a_path_that_cannot_be_opened_says_why_in_words(tmp_path):
    folder = tmp_path / "m.safetensors"
    folder.mkdir()
    assert _refused(read_header, folder) == f"{folder}: cannot be read (Is a directory)"


def test_the_size_a_later_tensors_offsets_hold_is_their_difference(tmp_path):
    second = {"dtype": "F32", "shape": [2], "data_offsets": [8, 20]}
    path = _safetensors(tmp_path / "m.safetensors", {"a": F32_PAIR, "b": second}, data=bytes(20))
    assert _refused(read_header, path) == (
        f"{path}: tensor 'b': the header's dtype F32 and shape [2] make 8 bytes, but its data_offsets [8, 20] hold 12"
    )


def test_overlapping_tensors_are_refused_naming_where_each_starts(tmp_path):
    overlapping = {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}
    path = _safetensors(tmp_path / "m.safetensors", {"a": F32_PAIR, "b": overlapping}, data=bytes(12))
    assert _refused(read_header, path) == (
        f"{path}: tensor 'b': its data_offsets start at 4, but the tensors before it end at 8 (overlapping or with a gap)"
    )


def test_a_file_the_safetensors_library_cannot_read_is_one_line_naming_it(tmp_path):
    from safetensors import safe_open

    from reference.models.safetensors_files import read_safetensors

    gone = tmp_path / "gone.safetensors"
    with pytest.raises(Exception) as library:  # the library's own words, on one line
        safe_open(gone, framework="pt")
    words = " ".join(str(library.value).split())
    with pytest.raises(CheckpointError) as err:
        list(read_safetensors([gone]))
    assert str(err.value) == f"{gone}: cannot be read: {words}" and words


@pytest.mark.parametrize("files, disable", [(1, True), (2, None), (3, None)])
def test_a_progress_bar_counts_the_shards_of_a_checkpoint_of_several(tmp_path, monkeypatch, files, disable):
    """Named as transformers names it; one file gets none, several one (shown where stderr is a terminal:
    tqdm's ``disable=None``)."""
    from safetensors.torch import save_file

    from reference.models import safetensors_files

    bars = []
    monkeypatch.setattr(safetensors_files, "tqdm", lambda iterable, **kwargs: bars.append(kwargs) or iterable)
    paths = []
    for i in range(files):
        paths.append(tmp_path / f"m{i}.safetensors")
        save_file({f"w{i}": torch.ones(2)}, paths[-1])
    assert [name for _, name, _ in safetensors_files.read_safetensors(paths)] == [f"w{i}" for i in range(files)]
    assert bars == [{"desc": "loading checkpoint shards", "unit": "shard", "disable": disable}]
