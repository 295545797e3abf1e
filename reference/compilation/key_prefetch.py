"""Triton's installation hash, computed on a background thread while the weights load.

Triton names every kernel in its disk cache with a hash of its own installation (``triton_key()``: its
compiler's Python sources and, most of the bytes, ``libtriton.so``), computed once a process, behind a
``functools.lru_cache``, the first time a kernel is loaded: inside a warm start's compile phase, where little
else is left to do (perf/NOTES.md v29: 0.52 s of a warm ``no_inductor`` start's 0.61 s compile phase on an
H100 host; v30: -0.5 s of compile for ``no_inductor`` and ``breakable`` with this module). Hashing the library
releases the GIL, so a thread started after the start's checks and before the weights load takes it off the
critical path. :func:`wait`, called by the runner before its first compile and by its kernel warm-up's thread
before its first launch (:mod:`reference.engine.kernel_warm_up`), joins the thread, so a hash still running is
waited for inside the compile phase; since nothing before the runner's warm-up runs a Triton kernel (building
the model, the runner, the KV cache), Triton never computes it a second time beside the thread. A fork waits for
the thread too (``os.register_at_fork``), so no child starts with a half-done hash.

Inductor's like hash of torch's sources (``torch_key()``) is not prefetched: it walks some 2,000 modules in
Python, holding the GIL, and v30's one warm ``inductor`` start with it prefetched was 1.2 s slower, not faster.

``triton_key`` is Triton's internal function, looked up by name (``triton.runtime.cache``; older releases keep
it in ``triton.compiler.compiler``): where neither has it, a debug line says so and Triton computes its key
when it needs it, as without this module. Its result and errors are Triton's own: a hash that fails on the
thread is logged at debug level and fails again, visibly, where Triton calls it.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
from typing import Callable

import torch

logger = logging.getLogger(__name__)

# (module, function), the newest home first
_HOMES = (("triton.runtime.cache", "triton_key"), ("triton.compiler.compiler", "triton_key"))
_started = False  # whether this process has asked for the hash
_threads: list[threading.Thread] = []


def _find() -> Callable[[], object] | None:
    for module_name, name in _HOMES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    logger.debug("no triton_key in %s: Triton's hash is computed at its first kernel load", _HOMES)
    return None


def _compute(function: Callable[[], object]) -> None:
    try:
        function()  # fills the function's own cache; the value is not needed here
    except Exception:  # Triton's own call raises it again, where it is reported
        logger.debug("prefetching %s failed", function, exc_info=True)


def start(device: torch.device) -> None:
    """On a CUDA device, where the kernels are Triton's, start a daemon thread computing Triton's hash, once a
    process; returns at once. Elsewhere, or when the hash was asked for already, nothing.

    Args:
        device: where the model runs (a ``torch.device``: the caller has resolved it).
    """
    global _started
    if device.type != "cuda" or _started:
        return
    _started = True
    function = _find()
    if function is not None:
        thread = threading.Thread(target=_compute, args=(function,), name="triton-key-prefetch", daemon=True)
        thread.start()
        _threads.append(thread)


def wait() -> None:
    """Block until the thread :func:`start` began has finished (at once where none did). Safe on several threads
    at once: each joins the thread itself, none returns while it runs."""
    for thread in list(_threads):
        thread.join()
        with contextlib.suppress(ValueError):  # another waiter removed it first
            _threads.remove(thread)


os.register_at_fork(before=wait)
