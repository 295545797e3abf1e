"""Launch a custom op's Triton kernel, or, on a thread inside :func:`compile_only`, compile it without launching.

Triton compiles a kernel at its first launch, on the launching thread, one kernel after another. Most of a
compile runs outside the interpreter's lock (MLIR's passes, LLVM, ``ptxas``), so compiles on several threads
overlap: v35 in perf/NOTES.md measured the eight compiles of a cold 8B start at 2.25 s on one thread and 0.77 s
on sixteen. :func:`compile_only` turns every launch a thread makes through :func:`launcher` into Triton's
``warmup`` (the launch's specialisation compiled, nothing launched) inside Triton's ``AsyncCompileMode``, which
hands each compile to a pool of threads and each specialisation to it once; leaving the block waits for them
all and puts every compiled kernel into its kernel's cache. The runner's kernel warm-up runs one eager step of
the model this way, then the same step again with real launches, which find every kernel compiled
(:mod:`reference.engine.kernel_warm_up`).

The switch is per thread: another thread's launches launch as usual meanwhile. Importing this module needs no
Triton; :func:`compile_only` imports it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

_thread = threading.local()  # .compiling: whether this thread is inside compile_only()

# Triton's own parallel compile (a module private to Triton, present since 3.4: the releases this project runs)
_ASYNC_COMPILE = "triton.runtime._async_compile"
WORKER_PREFIX = "triton-compile"  # the pool's thread names


def launcher(kernel: Any, grid: tuple[int, ...]) -> Callable[..., Any]:
    """``kernel[grid]``, the launch every kernel of :mod:`reference.ops` goes through: call it with the kernel's
    arguments. On a thread inside :func:`compile_only` the call compiles the specialisation those arguments
    select and launches nothing (Triton's ``kernel.warmup(*args, grid=grid, **kwargs)``).

    Args:
        kernel: a ``triton.JITFunction``.
        grid: the launch grid, one to three program counts.
    """
    if getattr(_thread, "compiling", False):
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def compiling_only() -> bool:
    """Whether this thread is inside :func:`compile_only`."""
    return getattr(_thread, "compiling", False)


def supported() -> bool:
    """Whether the installed Triton has ``AsyncCompileMode`` (3.4 and newer), which :func:`compile_only` needs."""
    try:
        return hasattr(importlib.import_module(_ASYNC_COMPILE), "AsyncCompileMode")
    except ImportError:
        return False


@contextlib.contextmanager
def compile_only(workers: int) -> Iterator[None]:
    """On this thread, every launch through :func:`launcher` compiles on one of ``workers`` threads (named
    ``WORKER_PREFIX-N``) and returns at once, launching nothing; tensors a kernel would have written keep what
    they held. Leaving the block waits for every compile and puts each compiled kernel into its kernel's cache,
    so the same launches afterwards compile nothing.

    Raises:
        ValueError: ``workers`` below 1.
        RuntimeError: nested on one thread, or Triton has no ``AsyncCompileMode`` (:func:`supported`).
        Exception: the first compile that failed, when the block is left (Triton's own error).
    """
    if workers < 1:
        raise ValueError(f"workers: expected at least 1, got {workers}")
    if compiling_only():
        raise RuntimeError("compile_only: already inside compile_only on this thread")
    if not supported():
        raise RuntimeError(f"compile_only: this Triton has no {_ASYNC_COMPILE}.AsyncCompileMode (Triton 3.4+)")
    mode = importlib.import_module(_ASYNC_COMPILE).AsyncCompileMode
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix=WORKER_PREFIX) as pool:
        _thread.compiling = True
        try:
            with mode(pool):  # its exit waits for every compile, then fills the kernels' caches
                yield
        finally:
            _thread.compiling = False
