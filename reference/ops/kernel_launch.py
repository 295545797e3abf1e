"""Launch a custom op's Triton kernel, or, on a thread inside :func:`compile_only`, compile it without launching.

Triton compiles a kernel at its first launch, on the launching thread, one kernel after another, and then
readies it for that launch: it builds the kernel's launcher (a C extension per argument signature, built with
the host's C compiler, about 0.15 s a kernel on the H100 host: perf/NOTES.md v45) and loads its binary onto
the device. Most of both runs outside the interpreter's lock (MLIR's passes, LLVM, ``ptxas``, the C compiler),
so they overlap on several threads: v35 in perf/NOTES.md measured the eight compiles of a cold 8B start at
2.25 s on one thread and 0.77 s on sixteen. :func:`compile_only` turns every launch a thread makes through
:func:`launcher` into Triton's ``warmup`` (the launch's specialisation compiled, nothing launched) inside
Triton's ``AsyncCompileMode``, which hands each compile to a :class:`CompilePool` and each specialisation to it
once; the pool readies each kernel it compiled, and leaving the block waits for them all and puts every kernel
into its kernel's cache. The runner's kernel warm-up runs one eager step of the model this way, then the same
step again with real launches, which find every kernel compiled and ready
(:mod:`reference.engine.kernel_warm_up`).

The switch is per thread: another thread's launches launch as usual meanwhile. ``AsyncCompileMode`` and a
compiled kernel's ``_init_handles`` (its launcher and binary) are Triton's own, not its public API: where a
compiled kernel has no ``_init_handles`` it is readied at its first launch, as without this module. Importing
this module needs no Triton; :func:`compile_only` imports it.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import torch


class _Switch(threading.local):
    """Per thread: whether the thread is inside :func:`compile_only`. The class default answers for a thread that
    never entered it without an attribute miss, which ``getattr`` with a default paid at every launch of such a
    thread, attention's between the piecewise graphs among them (perf/NOTES.md v45)."""

    compiling = False


_thread = _Switch()

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

    Returns:
        The call: outside :func:`compile_only` Triton's launch (returning the compiled kernel), inside it
        Triton's ``warmup`` (returning a future of the compiled kernel, or None).
    """
    if _thread.compiling:
        return functools.partial(kernel.warmup, grid=grid)
    return kernel[grid]


def compiling_only() -> bool:
    """Whether this thread is inside :func:`compile_only`."""
    return _thread.compiling


def supported() -> bool:
    """Whether the installed Triton has ``AsyncCompileMode`` (3.4 and newer), which :func:`compile_only` needs."""
    try:
        return hasattr(importlib.import_module(_ASYNC_COMPILE), "AsyncCompileMode")
    except ImportError:
        return False


class CompilePool(ThreadPoolExecutor):
    """The threads Triton's ``AsyncCompileMode`` hands its compiles to (named ``WORKER_PREFIX_N``). Each job, once
    its compile returns a kernel, readies it for its first launch on ``device`` (its ``_init_handles``, where it
    has one: the launcher built, the binary loaded), so no launching thread pays for that after the compile.

    Args:
        workers: threads at most, at least 1.
        device: where the kernels will launch (the compiling thread's current device).
    """

    def __init__(self, workers: int, device: torch.device):
        super().__init__(max_workers=workers, thread_name_prefix=WORKER_PREFIX)
        self.device = device

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        return super().submit(_compiled_and_ready, fn, self.device, *args, **kwargs)


def _compiled_and_ready(compile_kernel: Callable[..., Any], device: torch.device, *args: Any, **kwargs: Any) -> Any:
    kernel = compile_kernel(*args, **kwargs)
    ready = getattr(kernel, "_init_handles", None)
    if ready is not None:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():
            ready()
    return kernel


@contextlib.contextmanager
def compile_only(workers: int, device: torch.device | str) -> Iterator[None]:
    """On this thread, every launch through :func:`launcher` compiles on a :class:`CompilePool` of ``workers``
    threads, which readies each kernel for ``device`` (``'cuda'`` alone: this thread's current device), and returns
    at once, launching nothing; tensors a kernel would have written keep what they held. Leaving the block waits
    for every compile and, when all succeeded, puts each compiled kernel into its kernel's cache, so the same
    launches afterwards compile nothing.

    Args:
        workers: pool threads, at least 1.
        device: where the kernels will launch: the calling thread's current device (Triton compiles for, and
            caches under, that device).

    Raises:
        ValueError: ``workers`` below 1.
        RuntimeError: nested on one thread, Triton has no ``AsyncCompileMode`` (:func:`supported`), or
            Triton's mode is already active on this thread (Triton's own message).
        Exception: a compile or readying that failed (the first to finish failing), when the block is left
            (Triton's own error, e.g. its ``OutOfResources`` for a kernel that needs more shared memory than the
            device has). Kernels not yet stored by then stay uncached; Triton's mode and the switch are left
            either way, so a later block on this thread starts afresh.
    """
    if workers < 1:
        raise ValueError(f"workers: expected at least 1, got {workers}")
    if compiling_only():
        raise RuntimeError("compile_only: already inside compile_only on this thread")
    if not supported():
        raise RuntimeError(f"compile_only: this Triton has no {_ASYNC_COMPILE}.AsyncCompileMode (Triton 3.4+)")
    triton_async = importlib.import_module(_ASYNC_COMPILE)
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # this thread's, not the pool threads' current device
        device = torch.device("cuda", torch.cuda.current_device())
    with CompilePool(workers, device) as pool:
        mode = triton_async.AsyncCompileMode(pool)
        _thread.compiling = True
        try:
            with mode:  # its exit waits for every compile, then fills the kernels' caches
                yield
        finally:
            _thread.compiling = False
            _leave(triton_async, mode)


def _leave(triton_async: Any, mode: Any) -> None:
    """Clear Triton's active mode where it is still ``mode``: Triton 3.6's exit clears it only after storing every
    kernel, so a failed compile leaves it set on this thread, and any later launch there would hand its compile
    to the shut pool. (Newer Triton clears it first; a module without ``active_mode`` has nothing to clear.)"""
    active = getattr(triton_async, "active_mode", None)
    if active is not None and active.get() is mode:
        active.set(None)
