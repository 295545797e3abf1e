"""The compilers' installation hashes, computed on background threads while the weights load.

Triton names every kernel in its disk cache with a hash of its own installation (``triton_key()``: its compiler
sources and ``libtriton.so``), and Inductor every FX-graph cache entry with a hash of torch's Python sources
(``torch_key()``). Each is computed once per process, behind a cache of its own, the first time a kernel is
loaded or a graph is looked up: inside a warm start's compile phase, where little else is left to do (perf/
NOTES.md v29: ``triton_key()`` was 0.52 s of a warm ``no_inductor`` start's 0.61 s compile phase on an H100
host). Both are file reads and SHA-256 over large buffers, which release the GIL, so threads started before
the weights load take them off the start's critical path; :func:`wait`, called by the runner before its first
compile, joins them, so a hash still running is waited for inside the compile phase and never computed twice.

The keys are torch's and Triton's internals, looked up by name: where a version has neither (older Triton
releases keep ``triton_key`` in ``triton.compiler.compiler``, also looked at), nothing is prefetched and the
compilers compute their keys when they need them, as they would without this module. Results and errors are
the compilers' own: a hash that fails on a thread is logged at debug level and fails again, visibly, where
the compiler calls it.
"""

from __future__ import annotations

import importlib
import logging
import threading
from typing import Callable

import torch

logger = logging.getLogger(__name__)

# (module, function) per key, the newest home first
_HOMES = {
    "triton_key": (("triton.runtime.cache", "triton_key"), ("triton.compiler.compiler", "triton_key")),
    "torch_key": (("torch._inductor.codecache", "torch_key"),),
}
_requested: set[str] = set()  # keys some thread of this process has been started for
_threads: list[threading.Thread] = []


def keys_needed(device: torch.device, use_inductor: bool) -> tuple[str, ...]:
    """The keys a start on ``device`` computes: ``triton_key`` where kernels are Triton's (CUDA), ``torch_key``
    where Inductor compiles (any device)."""
    return (("triton_key",) if device.type == "cuda" else ()) + (("torch_key",) if use_inductor else ())


def _find(key: str) -> Callable[[], object] | None:
    for module_name, name in _HOMES[key]:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    return None


def _compute(function: Callable[[], object]) -> None:
    try:
        function()  # fills the function's own cache; the value is not needed here
    except Exception:  # the compiler's own call raises it again, where it is reported
        logger.debug("prefetching %s failed", function, exc_info=True)


def start(device: torch.device, use_inductor: bool) -> None:
    """Start a daemon thread per key a start on ``device`` needs (:func:`keys_needed`) and this process has not
    asked for yet, side by side (each is mostly I/O and hashing outside the GIL); returns at once.
    ``device``: where the model runs; ``use_inductor``: whether a piece is compiled by Inductor."""
    wanted = [key for key in keys_needed(torch.device(device), use_inductor) if key not in _requested]
    _requested.update(wanted)
    for function in filter(None, map(_find, wanted)):
        thread = threading.Thread(target=_compute, args=(function,), name="compiler-key-prefetch", daemon=True)
        thread.start()
        _threads.append(thread)


def wait() -> None:
    """Block until every thread :func:`start` began has finished (at once where none did)."""
    while _threads:
        _threads.pop().join()
