"""A broken checkpoint directory is refused with one line that names the file and the field or tensor.

Each case breaks a copy of a committed fixture the way real downloads and hand edits break: a truncated
or empty ``*.safetensors``, a ``config.json`` that is not JSON or leaves out a size (transformers would
silently use its default, another model's, and the load would fail later on a tensor shape), a safetensors
header whose dtype or shape does not fit its data or the model, an index naming a shard or tensor that is
not there. Config problems surface in ``registry.model_config`` (``ValueError``), so the CLI's ``--model``
parsing turns them into argparse's exit 2; weight problems in ``build_model`` (``CheckpointError``).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from reference.bench_latency import parse_args
from reference.config import CompilationConfig
from reference.models.loader import CheckpointError
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LLAMA, SHARDED, MULTIMODAL = "tiny-llama", "tiny-qwen3-sharded", "tiny-gemma3-multimodal"
TEXT_FIELDS = [
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
    "intermediate_size",
]


def fixture_copy(name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES / name, tmp_path / name))


def build(directory: Path):
    ops = CustomOpSelection(CompilationConfig(level=0))
    return build_model(directory, ops, dtype=torch.float32, device="cpu")


def one_line_error(error: pytest.ExceptionInfo, *named: object) -> str:
    """The error's message, checked to be one line naming each of ``named``."""
    message = str(error.value)
    assert "\n" not in message, message
    for thing in named:
        assert str(thing) in message, f"{thing} not in {message!r}"
    return message


def edit_config(directory: Path, edit) -> Path:
    path = directory / "config.json"
    fields = json.loads(path.read_text())
    edit(fields)
    path.write_text(json.dumps(fields))
    return path


def edit_header(path: Path, edit) -> None:
    """Rewrite a safetensors file's JSON header with ``edit(header)``, keeping its tensor data."""
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + length])
    edit(header)
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


# ---------------------------------------------------------------------- safetensors files
@pytest.mark.parametrize("keep", [0.5, 20, 4, 0], ids=["half", "inside-header", "inside-length", "empty"])
def test_truncated_safetensors_file_is_named(tmp_path, keep):
    directory = fixture_copy(LLAMA, tmp_path)
    path = directory / "model.safetensors"
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep) if isinstance(keep, float) else keep])

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, path)


def test_truncated_shard_is_named(tmp_path):
    directory = fixture_copy(SHARDED, tmp_path)
    path = directory / "model-00002-of-00003.safetensors"
    path.write_bytes(path.read_bytes()[:-100])

    with pytest.raises(CheckpointError) as error:
        build(directory)
    assert "truncated" in one_line_error(error, path)


def test_header_dtype_that_does_not_fit_the_data_is_named(tmp_path):
    directory = fixture_copy(LLAMA, tmp_path)
    path = directory / "model.safetensors"
    edit_header(path, lambda header: header["model.norm.weight"].update(dtype="F32"))  # the data is bf16

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, path, "'model.norm.weight'", "F32")


def test_header_shape_that_does_not_fit_the_data_is_named(tmp_path):
    directory = fixture_copy(LLAMA, tmp_path)
    path = directory / "model.safetensors"
    edit_header(path, lambda header: header["model.norm.weight"].update(shape=[65]))

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, path, "'model.norm.weight'", "[65]")


def test_header_dtype_that_is_not_floating_point_is_named(tmp_path):
    directory = fixture_copy(LLAMA, tmp_path)
    path = directory / "model.safetensors"
    edit_header(path, lambda header: header["model.norm.weight"].update(dtype="I16"))  # same size as bf16

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, path, "'model.norm.weight'", "I16")


def test_header_shape_that_does_not_fit_the_model_names_the_file(tmp_path):
    directory = fixture_copy(LLAMA, tmp_path)
    path = directory / "model.safetensors"
    name = "model.layers.0.mlp.down_proj.weight"  # (64, 128) for this config.json
    edit_header(path, lambda header: header[name].update(shape=[128, 64]))  # same bytes, transposed

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, path, repr(name), "expected shape (64, 128)", "got (128, 64)")


# ---------------------------------------------------------------------- shards and the index
def test_index_naming_a_missing_shard_is_named(tmp_path):
    directory = fixture_copy(SHARDED, tmp_path)
    (directory / "model-00002-of-00003.safetensors").unlink()

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, directory / "model.safetensors.index.json", "model-00002-of-00003.safetensors")


def test_tensor_missing_from_its_shard_is_named(tmp_path):
    """The index still lists the tensor, its shard no longer has it."""
    directory = fixture_copy(SHARDED, tmp_path)
    shard = directory / "model-00002-of-00003.safetensors"
    tensors = load_file(shard)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, shard, metadata={"format": "pt"})

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, "model.safetensors.index.json", shard.name, "'model.layers.1.mlp.up_proj.weight'")


def test_tensor_missing_from_every_shard_is_named(tmp_path):
    directory = fixture_copy(SHARDED, tmp_path)
    shard = directory / "model-00003-of-00003.safetensors"
    tensors = load_file(shard)
    del tensors["lm_head.weight"]  # untied in this config: required
    save_file(tensors, shard, metadata={"format": "pt"})
    index = directory / "model.safetensors.index.json"
    fields = json.loads(index.read_text())
    del fields["weight_map"]["lm_head.weight"]
    index.write_text(json.dumps(fields))

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, index, "missing 1 tensor(s): lm_head.weight")


def test_tensor_in_two_shards_names_both(tmp_path):
    directory = fixture_copy(SHARDED, tmp_path)
    first, last = directory / "model-00001-of-00003.safetensors", directory / "model-00003-of-00003.safetensors"
    tensors = load_file(last)
    tensors["model.embed_tokens.weight"] = load_file(first)["model.embed_tokens.weight"]
    save_file(tensors, last, metadata={"format": "pt"})

    with pytest.raises(CheckpointError) as error:
        build(directory)
    one_line_error(error, first.name, last.name, "'model.embed_tokens.weight'")


# ---------------------------------------------------------------------- config.json
@pytest.mark.parametrize("field", TEXT_FIELDS)
def test_config_without_a_size_field_is_named(tmp_path, field):
    directory = fixture_copy(LLAMA, tmp_path)
    path = edit_config(directory, lambda fields: fields.pop(field))

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, path, field)


def test_config_names_every_missing_field(tmp_path):
    directory = fixture_copy(LLAMA, tmp_path)
    path = edit_config(directory, lambda fields: [fields.pop(f) for f in ("hidden_size", "vocab_size")])

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, path, "hidden_size", "vocab_size")


@pytest.mark.parametrize("field", ["model_type", "hidden_size", "num_hidden_layers", "intermediate_size"])
def test_multimodal_config_without_a_text_size_field_is_named(tmp_path, field):
    directory = fixture_copy(MULTIMODAL, tmp_path)
    path = edit_config(directory, lambda fields: fields["text_config"].pop(field))

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, path, f"text_config.{field}")


@pytest.mark.parametrize(
    "field, value, named",
    [
        ("hidden_size", "64", "hidden_size"),
        ("num_hidden_layers", 0, "num_hidden_layers"),
        ("model_type", "not-a-model", "'not-a-model'"),
        ("model_type", "mistral", "'mistral'"),  # transformers knows it, we do not
    ],
)
def test_config_field_with_a_bad_value_is_named(tmp_path, field, value, named):
    directory = fixture_copy(LLAMA, tmp_path)
    path = edit_config(directory, lambda fields: fields.update({field: value}))

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, path, named)


def test_multimodal_config_our_decoder_cannot_run_is_named(tmp_path):
    directory = fixture_copy(MULTIMODAL, tmp_path)
    path = edit_config(directory, lambda fields: fields["text_config"].update(hidden_activation="gelu"))

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, path, "text_config.hidden_activation")


@pytest.mark.parametrize("text", ['{"model_type": "llama",, }', "[1, 2]", ""], ids=["syntax", "list", "empty"])
def test_config_that_is_not_a_json_object_is_named(tmp_path, text):
    directory = fixture_copy(LLAMA, tmp_path)
    (directory / "config.json").write_text(text)

    with pytest.raises(ValueError) as error:
        model_config(directory)
    one_line_error(error, directory / "config.json")


def test_cli_exits_2_with_one_line_naming_the_config_field(tmp_path, capsys):
    directory = fixture_copy(LLAMA, tmp_path)
    path = edit_config(directory, lambda fields: fields.pop("hidden_size"))

    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--model", str(directory)])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--model" in last and str(path) in last and "hidden_size" in last, last


@pytest.mark.parametrize(
    "text",
    ['{"version": "1.0", "model": ', '{"version": "1.0", "model": {"type": "BPE", "vocab": 5}}'],
    ids=["cut_off", "json_of_another_shape"],  # a JSONDecodeError; a KeyError from deep inside transformers
)
def test_a_corrupt_tokenizer_is_one_line_naming_the_directory(tmp_path, text):
    from reference.engine import LLM

    directory = fixture_copy(LLAMA, tmp_path)
    (directory / "tokenizer.json").write_text(text)
    with pytest.raises(ValueError, match=r"^tokenizer: cannot load a tokenizer from ") as error:
        LLM(str(directory), enforce_eager=True, device="cpu", max_model_len=16, use_tqdm=False)
    one_line_error(error, directory)


@pytest.mark.eager
def test_the_benchmark_never_reads_the_tokenizer(tmp_path, capsys):
    """Its prompts are token ids and it ignores EOS, so a corrupt tokenizer must not stop it (it was a
    23-line traceback): vLLM's skip_tokenizer_init."""
    from reference.bench_latency import main

    directory = fixture_copy(LLAMA, tmp_path)
    (directory / "tokenizer.json").write_text("not json")
    main(["--model", str(directory), "--device", "cpu", "--modes", "eager", "--batch-size", "2", "--input-len", "4",
          "--output-len", "2", "--num-iters-warmup", "0", "--num-iters", "1"])  # fmt: skip
    assert "| eager |" in capsys.readouterr().out
