"""Every custom-op kernel launches through ``kernel_launch.launcher``, which can compile instead (issue 22).

The runner's kernel warm-up compiles a step's Triton kernels on a pool of threads by running the step once with
each launch turned into Triton's ``warmup`` inside Triton's ``AsyncCompileMode``
(:func:`reference.ops.kernel_launch.compile_only`). The rules: outside the block a launch is ``kernel[grid](...)``
with its arguments untouched; inside, on that thread only, the same call is ``kernel.warmup(..., grid=grid)``
with the same arguments (Triton picks the specialisation from them, so one dropped would compile a kernel the
real launch does not find); the block hands Triton a pool of the threads asked for and leaves Triton's mode,
then the switch, on the way out, an error too; and no kernel in :mod:`reference.ops` launches any other way.

Triton's mode is a stand-in here, so these rules run on a CPU; ``conformance/test_kernel_warm_up.py`` runs the
real one on CUDA.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

from reference.ops import kernel_launch

pytestmark = pytest.mark.requires("components")


class FakeKernel:
    """Stands for a ``triton.JITFunction``: records each launch (``kernel[grid](...)``) and each compile without a
    launch (``kernel.warmup(..., grid=...)``) as ``(what, grid, args, kwargs, thread name)``."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self._record("launch", grid, args, kwargs)

    def warmup(self, *args, grid, **kwargs):
        self._record("compile", grid, args, kwargs)

    def _record(self, what, grid, args, kwargs):
        self.calls.append((what, grid, args, kwargs, threading.current_thread().name))


class CompiledStandIn:
    """What a compile returns: a kernel whose ``_init_handles`` (Triton's: build its launcher, load its binary)
    appends the name of the thread that called it to ``readied``."""

    def __init__(self):
        self.readied: list[str] = []

    def _init_handles(self):
        self.readied.append(threading.current_thread().name)


@pytest.fixture
def triton_mode(monkeypatch) -> list:
    """Triton's ``AsyncCompileMode`` replaced by a stand-in that appends ``('made', pool's max workers)``,
    ``'enter'`` and ``'exit'`` to the returned list, and hands its pool two compiles on entry, as Triton's mode
    hands it each compile: one returning a :class:`CompiledStandIn`, one returning None (a kernel with nothing to
    ready); ``('compiled', kernel)`` is appended for each. A third job checks that the pool passes a job its
    arguments as given. Like Triton 3.6's, the mode is a context variable (``active_mode``) that its entry refuses
    to set twice and its exit clears only once every compile succeeded: a stand-in whose ``fail_on_exit`` is set
    raises :class:`PlantedCompileError` on exit before clearing it, as a failed compile does there."""
    events: list = []
    active_mode = contextvars.ContextVar("stand_in_active_mode", default=None)

    class AsyncCompileMode:
        fail_on_exit = False

        def __init__(self, executor):
            events.append(("made", executor._max_workers))
            self.executor = executor

        def __enter__(self):
            if active_mode.get() is not None:
                raise RuntimeError("Another AsyncCompileMode is already active")
            active_mode.set(self)
            events.append("enter")
            for kernel in (CompiledStandIn(), None):
                compiled = self.executor.submit(lambda k=kernel: k).result()
                assert compiled is kernel, "the pool did not return what the compile returned"
                events.append(("compiled", kernel))
            passed = self.executor.submit(lambda *args, **kwargs: (args, kwargs), 1, 2, key=3).result()
            assert passed == ((1, 2), {"key": 3}), "the pool changed a job's arguments"
            return self

        def __exit__(self, *exc_info):
            events.append("exit")
            if self.fail_on_exit:
                raise PlantedCompileError("a compile failed")
            active_mode.set(None)

    module = types.ModuleType("stand_in_async_compile")
    module.AsyncCompileMode, module.active_mode = AsyncCompileMode, active_mode
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(kernel_launch, "_ASYNC_COMPILE", module.__name__)
    return events


class PlantedCompileError(Exception):
    """What the stand-in's exit raises for a failed compile."""


ARGS, KWARGS = (1, "x", 2.5), {"BLOCK": 64, "num_warps": 4, "launch_pdl": False}


def test_outside_compile_only_a_launch_is_the_kernels_own_with_its_arguments_untouched():
    kernel = FakeKernel()
    kernel_launch.launcher(kernel, (3, 2))(*ARGS, **KWARGS)
    assert kernel.calls == [("launch", (3, 2), ARGS, KWARGS, "MainThread")]
    assert not kernel_launch.compiling_only()


def test_a_thread_that_never_entered_compile_only_launches():
    """Every step's own launches come from threads that never compile only (the runner's, the engine's)."""
    kernel = FakeKernel()
    thread = threading.Thread(target=lambda: kernel_launch.launcher(kernel, (2,))("fresh"), name="fresh")
    thread.start()
    thread.join(timeout=30)
    assert kernel.calls == [("launch", (2,), ("fresh",), {}, "fresh")]


def test_inside_compile_only_a_launch_compiles_with_the_same_arguments_and_launches_nothing(triton_mode):
    kernel = FakeKernel()
    with kernel_launch.compile_only(workers=3, device="cpu"):
        assert kernel_launch.compiling_only()
        assert triton_mode[:2] == [("made", 3), "enter"], "Triton's mode was not entered with a pool of 3 threads"
        kernel_launch.launcher(kernel, (5,))(*ARGS, **KWARGS)
        assert "exit" not in triton_mode
    assert triton_mode[-1] == "exit"
    assert not kernel_launch.compiling_only()
    kernel_launch.launcher(kernel, (5,))(*ARGS, **KWARGS)  # launches again after the block
    assert kernel.calls == [
        ("compile", (5,), ARGS, KWARGS, "MainThread"),
        ("launch", (5,), ARGS, KWARGS, "MainThread"),
    ]


def test_the_pool_readies_each_kernel_it_compiled_on_its_own_thread(triton_mode):
    """Readying a kernel (its launcher built with the C compiler, its binary loaded) at its first launch took
    0.87-0.92 s of the warm-up's launching pass for six kernels on the H100 (perf/NOTES.md v45)."""
    with kernel_launch.compile_only(workers=2, device="cpu"):
        compiled = [event for event in triton_mode if event[0] == "compiled"]
    assert len(compiled) == 2
    ready_kernel = compiled[0][1]
    assert len(ready_kernel.readied) == 1, "readied more or less than once"
    assert ready_kernel.readied[0].startswith(kernel_launch.WORKER_PREFIX), "readied outside the pool"


@pytest.mark.parametrize("device, index", [("cuda", 3), ("cuda:1", 1)])
def test_the_pool_readies_kernels_on_the_device_asked_for_and_cuda_alone_is_the_calling_threads(
    triton_mode, monkeypatch, device, index
):
    """A pool thread's current CUDA device is device 0, whatever the compiling thread's: a kernel loaded there
    would launch on no other. The calling thread's current device is 3 here."""
    readied_on = []

    @contextlib.contextmanager
    def on_device(target):
        readied_on.append((torch.device(target), threading.current_thread().name))
        yield

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "device", on_device)
    with kernel_launch.compile_only(workers=1, device=device):
        pass
    assert [d for d, _ in readied_on] == [torch.device("cuda", index)], "readied on another device, or not once"
    assert readied_on[0][1].startswith(kernel_launch.WORKER_PREFIX)


def test_compile_only_is_the_switch_of_its_own_thread_alone(triton_mode):
    kernel, inside, done = FakeKernel(), threading.Event(), threading.Event()

    def compiling_thread():
        with kernel_launch.compile_only(workers=1, device="cpu"):
            kernel_launch.launcher(kernel, (1,))("warm-up")
            inside.set()
            done.wait(timeout=30)

    thread = threading.Thread(target=compiling_thread, name="compiling")
    thread.start()
    assert inside.wait(timeout=30)
    kernel_launch.launcher(kernel, (1,))("main")  # while the other thread is inside its block
    done.set()
    thread.join(timeout=30)
    assert [(what, args, name) for what, _, args, _, name in kernel.calls] == [
        ("compile", ("warm-up",), "compiling"),
        ("launch", ("main",), "MainThread"),
    ]


def test_an_error_inside_compile_only_leaves_triton_s_mode_and_the_switch(triton_mode):
    with pytest.raises(ValueError, match="planted"):
        with kernel_launch.compile_only(workers=2, device="cpu"):
            raise ValueError("planted")
    assert triton_mode[-1] == "exit"
    assert not kernel_launch.compiling_only()
    kernel = FakeKernel()
    kernel_launch.launcher(kernel, (1,))()
    assert kernel.calls[0][0] == "launch"


def test_a_failed_compile_leaves_no_triton_mode_set_so_the_thread_can_compile_only_again(monkeypatch, triton_mode):
    """Triton 3.6's exit raises a failed compile's error before clearing its mode: left set, it would refuse the
    thread's next block ("Another AsyncCompileMode is already active") and hand the thread's launches to a shut
    pool meanwhile."""
    mode = sys.modules[kernel_launch._ASYNC_COMPILE].AsyncCompileMode
    monkeypatch.setattr(mode, "fail_on_exit", True)
    with pytest.raises(PlantedCompileError):
        with kernel_launch.compile_only(workers=2, device="cpu"):
            pass
    assert sys.modules[kernel_launch._ASYNC_COMPILE].active_mode.get() is None, "Triton's mode left set"
    assert not kernel_launch.compiling_only()
    monkeypatch.setattr(mode, "fail_on_exit", False)
    kernel = FakeKernel()
    with kernel_launch.compile_only(workers=2, device="cpu"):
        kernel_launch.launcher(kernel, (1,))()
    assert [call[0] for call in kernel.calls] == ["compile"]


def test_a_triton_without_a_mode_variable_leaves_the_block_as_well(monkeypatch, triton_mode):
    """Where Triton's module keeps its mode elsewhere (no ``active_mode``), there is nothing to clear on the way out:
    the block is left as usual, the switch off."""
    monkeypatch.delattr(sys.modules[kernel_launch._ASYNC_COMPILE], "active_mode")
    with kernel_launch.compile_only(workers=1, device="cpu"):
        assert kernel_launch.compiling_only()
    assert triton_mode[-1] == "exit" and not kernel_launch.compiling_only()


@pytest.mark.parametrize("workers", [0, -1])
def test_compile_only_refuses_a_pool_of_no_threads_in_one_line(workers):
    with pytest.raises(ValueError, match=rf"^workers: expected at least 1, got {workers}$"):
        with kernel_launch.compile_only(workers, device="cpu"):
            pass


def test_compile_only_refuses_to_nest(triton_mode):
    with kernel_launch.compile_only(workers=1, device="cpu"):
        with pytest.raises(RuntimeError, match="already inside compile_only on this thread"):
            with kernel_launch.compile_only(workers=1, device="cpu"):
                pass
        assert kernel_launch.compiling_only(), "the refused inner block switched the outer one off"
    assert not kernel_launch.compiling_only()


@pytest.mark.parametrize("module", ["no_such_module_anywhere", "types"])  # missing, or without the mode
def test_without_triton_s_parallel_compile_compile_only_says_so_in_one_line(monkeypatch, module):
    monkeypatch.setattr(kernel_launch, "_ASYNC_COMPILE", module)
    assert not kernel_launch.supported()
    with pytest.raises(RuntimeError, match=r"^compile_only: this Triton has no .*AsyncCompileMode \(Triton 3\.4\+\)$"):
        with kernel_launch.compile_only(workers=2, device="cpu"):
            pass
    assert not kernel_launch.compiling_only()


def test_supported_says_whether_the_module_has_the_mode(triton_mode):
    assert kernel_launch.supported()


KERNEL_MODULES = ("triton_kernels.py", "graph_attention_kernels.py", "linear_kernels.py")


@pytest.mark.parametrize("name", KERNEL_MODULES)
def test_every_kernel_of_reference_ops_launches_through_the_launcher(name):
    """A kernel launched as ``_kernel[grid](...)`` launches inside the warm-up's compile-only pass, one compile
    after another on the warm-up's thread, and writes its outputs while the step's others are left as allocated."""
    source = (Path(kernel_launch.__file__).parent / name).read_text()
    kernels = set(re.findall(r"@triton\.jit(?:\(.*\))?\s*\ndef (\w+)", source))
    assert kernels, f"{name}: no Triton kernel found"
    direct = sorted(k for k in kernels if re.search(rf"\b{k}\s*\[", source))  # kernel[grid], any grid
    assert not direct, f"{name}: launched without kernel_launch.launcher: {direct}"
    launched = set(re.findall(r"kernel_launch\.launcher\((\w+),", source))
    assert launched, f"{name}: no launch through kernel_launch.launcher"
    assert launched <= kernels
