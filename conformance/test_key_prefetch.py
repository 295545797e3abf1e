"""Triton's installation hash (``triton_key``) is computed on a thread started after the start's checks and
before the weights load, into Triton's own cache, once a process, on CUDA only; the runner's compile phase,
in every mode, waits for that thread; a fork waits for it too; a failure on it is Triton's to report
(``reference.compilation.key_prefetch``). A fake Triton stands in for the real one: the CPU here has none,
and the real hash takes half a second."""

from __future__ import annotations

import functools
import logging
import os
import sys
import threading
import time
import types

import pytest
import torch

from conformance.helpers import build_llama, small_llama_config
from reference.benchmark import startup
from reference.compilation import key_prefetch
from reference.config import mode_config
from reference.engine import LLM, ModelRunner
from reference.engine import arguments, memory_check
from reference.engine import llm as llm_module
from reference.engine import runner as runner_module
from reference.models import registry

pytestmark = pytest.mark.requires("components")

CUDA, CPU = torch.device("cuda"), torch.device("cpu")  # device objects only: nothing runs on them


class _Stop(Exception):
    """Ends a construction at the prefetch, once its argument is recorded."""


@pytest.fixture
def triton(monkeypatch):
    """A fake ``triton.runtime.cache`` whose ``triton_key`` is cached as the real one is; a fresh prefetch
    state. Yields a namespace: ``count`` (computations so far), ``fake(seconds, error, then)`` (a new key
    function, installed), ``module``."""
    state = types.SimpleNamespace(count=0, module=types.ModuleType("triton.runtime.cache"))

    def fake(seconds=0.0, error=None, then=lambda: None):
        @functools.lru_cache
        def triton_key():
            time.sleep(seconds)
            state.count += 1
            then()
            if error:
                raise error
            return "triton-hash"

        state.module.triton_key = triton_key
        return triton_key

    state.fake = fake
    fake()
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", state.module)
    monkeypatch.setattr(key_prefetch, "_started", False)
    monkeypatch.setattr(key_prefetch, "_threads", [])
    yield state
    key_prefetch.wait()


@pytest.mark.parametrize("device", [CUDA, torch.device("cuda", 1)], ids=["cuda", "cuda:1"])
def test_a_cuda_start_hashes_once_a_process_into_tritons_own_cache(triton, device):
    key_prefetch.start(device)
    key_prefetch.wait()
    assert triton.count == 1
    assert triton.module.triton_key.cache_info().currsize == 1, "computed, but not into Triton's cache"
    triton.module.triton_key()  # Triton's own call is served by its cache
    key_prefetch.start(device)  # a second start in the process starts nothing
    assert key_prefetch._threads == [] and triton.count == 1


def test_a_cpu_start_hashes_nothing(triton):
    key_prefetch.start(CPU)
    key_prefetch.wait()
    assert triton.count == 0
    key_prefetch.start(CUDA)  # a CPU start does not use up the process's one prefetch
    key_prefetch.wait()
    assert triton.count == 1


def test_start_returns_at_once_and_wait_blocks_until_the_hash_is_done(triton):
    triton.fake(seconds=0.5)
    began = time.perf_counter()
    key_prefetch.start(CUDA)
    assert time.perf_counter() - began < 0.25, "start waited for the hash"
    key_prefetch.wait()
    assert triton.count == 1 and time.perf_counter() - began >= 0.5


def test_two_threads_waiting_at_once_both_return_only_once_the_hash_is_done(triton):
    """The runner's main thread and its kernel warm-up's thread both wait; neither may return (and let Triton
    compute the hash again beside the prefetch) while it runs."""
    done, returned = threading.Event(), []
    triton.fake(seconds=0.3, then=done.set)
    key_prefetch.start(CUDA)
    waiters = [threading.Thread(target=lambda: (key_prefetch.wait(), returned.append(done.is_set()))) for _ in "ab"]
    for waiter in waiters:
        waiter.start()
    for waiter in waiters:
        waiter.join(timeout=30)
    assert returned == [True, True] and triton.count == 1


def test_the_hash_runs_on_a_named_daemon_thread_so_it_never_holds_up_the_interpreters_exit(triton):
    running, release = threading.Event(), threading.Event()
    triton.fake(then=lambda: running.set() or release.wait(5))
    key_prefetch.start(CUDA)
    try:
        assert running.wait(5)
        [thread] = [t for t in threading.enumerate() if t.name == "triton-key-prefetch"]
        assert thread.daemon
    finally:
        release.set()
        key_prefetch.wait()


def test_a_hash_that_fails_on_the_thread_is_logged_and_left_to_triton(triton, caplog):
    failing = triton.fake(error=OSError("libtriton.so: unreadable"))
    with caplog.at_level(logging.DEBUG, logger=key_prefetch.__name__):
        key_prefetch.start(CUDA)
        key_prefetch.wait()  # raises nothing here
    [record] = [r for r in caplog.records if r.name == key_prefetch.__name__]
    assert record.levelno == logging.DEBUG
    assert record.getMessage() == f"prefetching {failing} failed"
    assert record.exc_info[0] is OSError
    with pytest.raises(OSError, match="libtriton.so: unreadable"):
        failing()  # Triton's own call reports it (an exception is not cached)


def test_a_triton_without_the_key_where_it_is_looked_for_gets_no_thread_and_a_debug_line(
    triton, monkeypatch, caplog
):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", types.ModuleType("triton.compiler.compiler"))
    with caplog.at_level(logging.DEBUG, logger=key_prefetch.__name__):
        key_prefetch.start(CUDA)
    assert key_prefetch._threads == []
    [record] = [r for r in caplog.records if r.name == key_prefetch.__name__]
    assert record.getMessage().startswith("no triton_key in (('triton.runtime.cache', 'triton_key'), ")


def test_an_older_triton_keeps_its_key_in_the_compiler_module(triton, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)
    older = types.ModuleType("triton.compiler.compiler")
    older.triton_key = triton.fake()
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", older)
    key_prefetch.start(CUDA)
    key_prefetch.wait()
    assert triton.count == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_fork_waits_for_the_hash_so_the_child_never_starts_with_it_half_done(triton):
    """The fake hash holds a lock while it runs, as torch's cached keys do: a child forked mid-hash would
    inherit it held by a thread it does not have."""
    lock = threading.Lock()
    started = threading.Event()

    @functools.lru_cache
    def locked_key():
        with lock:
            started.set()
            time.sleep(0.5)
        return "triton-hash"

    triton.module.triton_key = locked_key
    key_prefetch.start(CUDA)
    assert started.wait(5)
    pid = os.fork()
    if pid == 0:  # the child: only the lock, then out, whatever happens
        os._exit(0 if lock.acquire(timeout=2) else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child was forked while the hash held its lock"


@pytest.mark.parametrize("mode", ["eager", "breakable", "no_inductor"])
def test_the_runners_compile_phase_begins_after_the_hash_and_counts_the_wait(triton, monkeypatch, mode):
    """Every mode's first forward loads Triton kernels on CUDA. The hash moves the runner's clock on by
    100 s when it ends: a compile phase timed around the wait takes at least that long, one that waited
    before its clock started does not."""
    clock = {"offset": 0.0}
    moved_clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + clock["offset"])
    monkeypatch.setattr(runner_module, "time", moved_clock)
    triton.fake(seconds=0.3, then=lambda: clock.update(offset=100.0))
    config = mode_config(mode, cudagraph_capture_sizes=[1, 2])
    runner = ModelRunner(build_llama(small_llama_config(), config), config, max_num_seqs=2, max_model_len=8)
    forward, seen = runner.forward, []
    monkeypatch.setattr(runner, "forward", lambda *a: seen.append(triton.count) or forward(*a))
    key_prefetch.start(CUDA)  # as LLM does before the weights
    stats = runner.warm_up()
    assert seen and seen[0] == 1, "the first forward ran before the prefetched hash was done"
    assert stats.compile_s >= 100, f"the wait for the hash is outside the compile phase ({stats.compile_s:.3f} s)"


def _record_and_stop(calls):
    def start(device):
        calls.append(device)
        raise _Stop

    return start


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_llm_starts_the_prefetch_for_its_device_after_its_checks_and_before_the_weights(device, monkeypatch):
    """On a CUDA device too (resolved here without one: the construction stops at the prefetch)."""
    calls, checked = [], []
    monkeypatch.setattr(arguments, "resolve_device", lambda d: torch.device(device))
    monkeypatch.setattr(llm_module.parallel, "init_tensor_parallel", lambda size, d: (None, torch.device(device)))
    monkeypatch.setattr(llm_module, "check_memory_before_build", lambda *a, **k: checked.append(True))
    monkeypatch.setattr(key_prefetch, "start", _record_and_stop(calls))
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("the weights loaded first"))
    with pytest.raises(_Stop):
        LLM("llama-tiny", device=device, compilation_config=mode_config("no_inductor"), use_tqdm=False)
    assert calls == [torch.device(device)] and checked == [True]


def test_an_unknown_custom_op_is_refused_before_any_prefetch(monkeypatch):
    """The custom-op names are checked just before the memory; a refused start leaves no thread behind."""
    monkeypatch.setattr(key_prefetch, "start", lambda device: pytest.fail("prefetched before the checks"))
    with pytest.raises(ValueError, match="no_such_op"):
        LLM("llama-tiny", device="cpu", compilation_config={"custom_ops": ["+no_such_op"]}, use_tqdm=False)


@pytest.mark.parametrize("mode", ["no_inductor", "inductor"])
def test_bench_startup_starts_the_prefetch_as_llm_does(mode, monkeypatch):
    calls, checked = [], []
    monkeypatch.setattr(memory_check, "check_memory_before_build", lambda *a, **k: checked.append(True))
    monkeypatch.setattr(key_prefetch, "start", _record_and_stop(calls))
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("the weights loaded first"))
    spec = {"model": "llama-tiny", "device": "cpu", "dtype": "float32", "batch_size": 2, "input_len": 4}
    with pytest.raises(_Stop):
        startup._child({**spec, "mode": mode})
    assert calls == [CPU] and checked == [True]
