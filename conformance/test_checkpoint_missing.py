"""A checkpoint that lacks tensors: the one line that says how many and which, and the file it names.

From ./run mutate models.checkpoint: the count of names shown (ten, then "and N more") and the file named (the
single file, or the directory of several unindexed ones) were matched by no test.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference.config import CompilationConfig
from reference.models.loader import CheckpointError
from reference.models.registry import build_model
from reference.ops import CustomOpSelection

pytestmark = pytest.mark.requires("components")

TINY_LLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama"


def _without(tmp_path: Path, count: int) -> tuple[Path, list[str]]:
    """A copy of tiny-llama whose model.safetensors lacks its last ``count`` tensors (by name)."""
    directory = Path(shutil.copytree(TINY_LLAMA, tmp_path / "tiny-llama"))
    path = directory / "model.safetensors"
    tensors = load_file(path)
    dropped = sorted(name for name in tensors if name != "model.embed_tokens.weight")[-count:]
    save_file({k: v for k, v in tensors.items() if k not in dropped}, path, metadata={"format": "pt"})
    return directory, dropped


def _refused(directory: Path) -> str:
    with pytest.raises(CheckpointError) as err:
        build_model(directory, CustomOpSelection(CompilationConfig(level=0)), dtype=torch.float32, device="cpu")
    return str(err.value)


@pytest.mark.parametrize("count, more", [(10, ""), (11, " and 1 more")])
def test_ten_missing_names_are_shown_and_the_rest_counted(tmp_path, count, more):
    directory, dropped = _without(tmp_path, count)
    prefix = f"{directory / 'model.safetensors'}: missing {count} tensor(s): "
    message = _refused(directory)
    assert message.startswith(prefix) and message.endswith(more), message
    shown = message[len(prefix) : len(message) - len(more)].split(", ")
    assert len(shown) == 10 and set(shown) <= set(dropped)


def test_several_unindexed_files_are_named_by_their_directory(tmp_path):
    directory, dropped = _without(tmp_path, 1)
    tensors = load_file(directory / "model.safetensors")
    names = sorted(tensors)
    (directory / "model.safetensors").unlink()
    for part, chunk in (("a", names[::2]), ("b", names[1::2])):
        save_file({n: tensors[n] for n in chunk}, directory / f"{part}.safetensors", metadata={"format": "pt"})
    assert _refused(directory) == f"{directory}: missing 1 tensor(s): {dropped[0]}"
