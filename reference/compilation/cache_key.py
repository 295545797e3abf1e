"""The compile cache's key: every factor that shapes a split graph and its compiled pieces, and where entries live.

:func:`cache_factors` gathers them: the graph-shaping fields of the compilation config (``GRAPH_FIELDS``), the
model (class, transformers config, module tree with each custom op's choice, parameter and buffer names,
shapes and dtypes, the process's rank in a tensor-parallel world), the first call's argument signature, the
source of the package and of the model's class, and the Python / torch / CUDA / Triton versions and the
device. :func:`cache_key` hashes them; an entry keeps them beside it, readable (``factors.json``).

Where (:func:`cache_folder`): ``CompilationConfig.cache_dir`` when set, else ``$REFERENCE_COMPILE_CACHE``,
else ``~/.cache/piecewise-reference/torch_compile_cache`` (vLLM: ``cache_dir``, ``$VLLM_CACHE_ROOT``).
``REFERENCE_DISABLE_COMPILE_CACHE=1`` turns the cache off (vLLM: ``VLLM_DISABLE_COMPILE_CACHE``).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from reference.config import CompilationConfig, ConfigError

FOLDER_ENV = "REFERENCE_COMPILE_CACHE"
DISABLE_ENV = "REFERENCE_DISABLE_COMPILE_CACHE"
# The entry layout; a change of it must miss every older entry.
ENTRY_FORMAT = 2
# Compilation fields that shape what an entry holds. Left out, on purpose: cudagraph_num_of_warmups and the
# debug switches (they act around the pieces, rebuilt on every start) and cache_dir itself.
GRAPH_FIELDS = (
    "level",
    "use_inductor",
    "custom_ops",
    "splitting_ops",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "inductor_compile_config",
    "compile_sizes",
    "use_inductor_graph_partition",
    "stamp_layers",
)
_PACKAGE = Path(__file__).resolve().parents[1]  # reference/



def cache_folder(config: CompilationConfig) -> Path | None:
    """Where entries live (module doc), or None when ``$REFERENCE_DISABLE_COMPILE_CACHE`` is ``1``.

    Raises:
        ConfigError: ``$REFERENCE_DISABLE_COMPILE_CACHE`` is set to something other than ``0`` or ``1``.
    """
    disable = os.environ.get(DISABLE_ENV) or "0"  # set but empty (`VAR=`) reads as unset
    if disable not in ("0", "1"):
        raise ConfigError(f"{DISABLE_ENV}: expected '0' or '1', got {disable!r}")
    if disable == "1":
        return None
    if config.cache_dir:
        return Path(config.cache_dir).expanduser()
    env = os.environ.get(FOLDER_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "piecewise-reference" / "torch_compile_cache"


def uncachable(config: CompilationConfig) -> str | None:
    """Why a model compiled per ``config`` cannot be cached, or None: an ``inductor_compile_config`` value that
    is no JSON data (a pass given as a function) has no stable spelling in a key (its ``repr`` holds an
    address), and Inductor keeps nothing to save of a compile it does not cache itself (``fx_graph_cache``
    False, or a pass it cannot hash)."""
    for name, value in config.inductor_compile_config.items():
        if not is_json(value):
            return f"inductor_compile_config[{name!r}] is {type(value).__name__}, which no key can name"
        if name == "fx_graph_cache" and value is False:
            return "inductor_compile_config['fx_graph_cache'] is False: Inductor keeps no artifact to store"
    return None


def _sha256_files(paths: list[Path], root: Path) -> str:
    """SHA-256 over each file's path relative to ``root`` and its bytes."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def source_hashes(model: nn.Module) -> dict[str, str]:
    """SHA-256 of the package's Python sources (every file Dynamo may trace into), and of the file that
    defines the model's class when it lies outside the package."""
    hashes = {"reference": _sha256_files(sorted(_PACKAGE.rglob("*.py")), _PACKAGE)}
    try:
        model_file = Path(inspect.getsourcefile(type(model)) or "").resolve()
    except TypeError:  # a class defined in the interpreter
        model_file = None
    if model_file and model_file.is_file() and _PACKAGE not in model_file.parents:
        hashes[str(model_file)] = _sha256_files([model_file], model_file.parent)
    return hashes


def _environment(args) -> dict[str, Any]:
    cuda = next((a.device for a in args if isinstance(a, torch.Tensor) and a.is_cuda), None)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if cuda is not None:
        device = f"{torch.cuda.get_device_name(cuda)} sm_{''.join(map(str, torch.cuda.get_device_capability(cuda)))}"
    else:
        device = f"cpu {platform.machine()} {torch.backends.cpu.get_cpu_capability()}"
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "device": device,
    }


def _model_factors(model: nn.Module) -> dict[str, Any]:
    config = getattr(model, "config", None)
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if distributed else (0, 1)
    return {
        "class": f"{type(model).__module__}.{type(model).__qualname__}",
        "config": json.loads(config.to_json_string(use_diff=False)) if hasattr(config, "to_json_string") else None,
        "modules": repr(model),  # each CustomOp layer says impl=custom or impl=native
        "tensors": [[name, list(t.shape), str(t.dtype)] for name, t in tensors],
        "rank_of_world": list(world),
    }


def cache_factors(model: nn.Module, config: CompilationConfig, args: tuple) -> dict[str, Any]:
    """Every factor of an entry's key (module doc), JSON-serialisable; values JSON cannot hold (a callable
    in ``inductor_compile_config``) are written as their ``repr``."""
    compilation = {name: getattr(config, name) for name in GRAPH_FIELDS}
    inputs = [
        [str(a.dtype), a.device.type, list(a.shape[1:])] if isinstance(a, torch.Tensor) else type(a).__name__
        for a in args
    ]
    factors = {
        "entry_format": ENTRY_FORMAT,
        "compilation": compilation,
        "model": _model_factors(model),
        "inputs": inputs,
        "source": source_hashes(model),
        "environment": _environment(args),
    }
    return json.loads(json.dumps(factors, default=repr))  # tuples as lists: equal to what factors.json reads back


def cache_key(factors: dict[str, Any]) -> str:
    """The entry's folder name: SHA-256 of the factors as canonical JSON, 32 hex digits."""
    return hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:32]


def is_json(value) -> bool:
    """Whether ``value`` is JSON data (``json.dumps`` takes it)."""
    try:
        json.dumps(value)
        return True
    except (TypeError, ValueError):
        return False
