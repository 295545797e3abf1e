"""The compilers' installation hashes (Triton's ``triton_key``, Inductor's ``torch_key``) are computed on a
thread started before the weights load, into the compilers' own caches, once a process; the runner's compile
phase waits for that thread; a failure on it is the compiler's to report (``reference.compilation.key_prefetch``).
Fake compilers stand in for the real ones: the CPU here has no Triton, and the real hashes take seconds."""

from __future__ import annotations

import functools
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
from reference.engine import llm as llm_module
from reference.models import registry

pytestmark = pytest.mark.requires("components")

CUDA, CPU = torch.device("cuda"), torch.device("cpu")  # a device object only: nothing runs on it


class _Stop(Exception):
    """Ends a construction at the prefetch, once its arguments are recorded."""


@pytest.fixture
def compilers(monkeypatch):
    """Fake ``triton.runtime.cache.triton_key`` and ``torch._inductor.codecache.torch_key`` (each cached as the
    real ones are, counting its computations), and a fresh prefetch state; yields the count per key."""
    counts = {"triton_key": 0, "torch_key": 0}

    def fake(name, seconds=0.0, error=None, then=lambda: None):
        @functools.lru_cache
        def key():
            time.sleep(seconds)
            counts[name] += 1
            then()
            if error:
                raise error
            return f"{name}-hash"

        return key

    triton_cache = types.ModuleType("triton.runtime.cache")
    triton_cache.triton_key = fake("triton_key")
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", triton_cache)
    import torch._inductor.codecache as codecache

    monkeypatch.setattr(codecache, "torch_key", fake("torch_key"))
    monkeypatch.setattr(key_prefetch, "_requested", set())
    monkeypatch.setattr(key_prefetch, "_threads", [])
    counts["fake"] = fake
    yield counts
    key_prefetch.wait()


@pytest.mark.parametrize(
    "device, use_inductor, keys",
    [(CUDA, False, ("triton_key",)), (CUDA, True, ("triton_key", "torch_key")), (CPU, True, ("torch_key",)),
     (CPU, False, ())],
    ids=["cuda", "cuda-inductor", "cpu-inductor", "cpu"],
)  # fmt: skip
def test_each_start_hashes_what_its_compilers_will_ask_for_once_into_their_own_caches(
    compilers, device, use_inductor, keys
):
    assert key_prefetch.keys_needed(device, use_inductor) == keys
    key_prefetch.start(device, use_inductor)
    key_prefetch.wait()
    assert {name: compilers[name] for name in ("triton_key", "torch_key")} == {
        name: int(name in keys) for name in ("triton_key", "torch_key")
    }
    import torch._inductor.codecache as codecache

    cached = {"triton_key": sys.modules["triton.runtime.cache"].triton_key, "torch_key": codecache.torch_key}
    for name in keys:
        assert cached[name].cache_info().currsize == 1, f"{name} was computed but not into its own cache"
        cached[name]()  # the compiler's own call is served by the cache
        assert compilers[name] == 1
    key_prefetch.start(device, use_inductor)  # a second start in the process starts nothing
    assert key_prefetch._threads == []


def test_a_later_start_hashes_only_the_keys_not_asked_for_yet(compilers):
    key_prefetch.start(CUDA, use_inductor=False)
    key_prefetch.wait()
    key_prefetch.start(CUDA, use_inductor=True)
    key_prefetch.wait()
    assert (compilers["triton_key"], compilers["torch_key"]) == (1, 1)


def test_the_two_hashes_run_side_by_side(compilers, monkeypatch):
    """Each fake hash waits at a barrier for the other: run one after the other, the first breaks the
    barrier after 5 s."""
    import torch._inductor.codecache as codecache

    barrier = threading.Barrier(2, timeout=5)
    triton_cache = sys.modules["triton.runtime.cache"]
    monkeypatch.setattr(triton_cache, "triton_key", compilers["fake"]("triton_key", then=barrier.wait))
    monkeypatch.setattr(codecache, "torch_key", compilers["fake"]("torch_key", then=barrier.wait))
    key_prefetch.start(CUDA, use_inductor=True)
    key_prefetch.wait()
    assert (compilers["triton_key"], compilers["torch_key"]) == (1, 1) and not barrier.broken


def test_start_returns_at_once_and_wait_blocks_until_the_hash_is_done(compilers, monkeypatch):
    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", compilers["fake"]("triton_key", 0.5))
    began = time.perf_counter()
    key_prefetch.start(CUDA, use_inductor=False)
    assert time.perf_counter() - began < 0.25, "start waited for the hash"
    key_prefetch.wait()
    assert compilers["triton_key"] == 1 and time.perf_counter() - began >= 0.5
    assert not any(thread.name == "compiler-key-prefetch" for thread in threading.enumerate())


def test_a_hash_that_fails_on_the_thread_is_left_to_the_compiler_and_the_others_are_still_computed(
    compilers, monkeypatch
):
    failing = compilers["fake"]("triton_key", error=OSError("libtriton.so: unreadable"))
    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", failing)
    key_prefetch.start(CUDA, use_inductor=True)
    key_prefetch.wait()  # raises nothing here
    assert compilers["torch_key"] == 1
    with pytest.raises(OSError, match="libtriton.so: unreadable"):
        failing()  # the compiler's own call reports it (an exception is not cached)


def test_a_triton_without_the_key_where_it_is_looked_for_gets_no_thread(compilers, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)  # importing it raises ImportError
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", types.ModuleType("triton.compiler.compiler"))
    key_prefetch.start(CUDA, use_inductor=False)
    assert key_prefetch._threads == []


def test_an_older_triton_keeps_its_key_in_the_compiler_module(compilers, monkeypatch):
    monkeypatch.setitem(sys.modules, "triton.runtime.cache", None)
    older = types.ModuleType("triton.compiler.compiler")
    older.triton_key = compilers["fake"]("triton_key")
    monkeypatch.setitem(sys.modules, "triton.compiler.compiler", older)
    key_prefetch.start(CUDA, use_inductor=False)
    key_prefetch.wait()
    assert compilers["triton_key"] == 1


@pytest.mark.no_inductor
def test_the_runners_compile_phase_begins_after_the_hash_and_counts_the_wait(compilers, monkeypatch):
    """The hash moves the runner's clock on by 100 s when it ends: a compile phase timed around the wait
    takes at least that long, one that waited before its clock started does not."""
    from reference.engine import runner as runner_module

    clock = {"offset": 0.0}
    moved_clock = types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + clock["offset"])
    monkeypatch.setattr(runner_module, "time", moved_clock)
    slow = compilers["fake"]("triton_key", 0.3, then=lambda: clock.update(offset=100.0))
    monkeypatch.setattr(sys.modules["triton.runtime.cache"], "triton_key", slow)
    config = mode_config("no_inductor", cudagraph_capture_sizes=[1, 2])
    runner = ModelRunner(build_llama(small_llama_config(), config), config, max_num_seqs=2, max_model_len=8)
    forward, seen = runner.forward, []
    monkeypatch.setattr(runner, "forward", lambda *a: seen.append(compilers["triton_key"]) or forward(*a))
    key_prefetch.start(CUDA, use_inductor=False)  # as LLM does before the weights
    stats = runner.warm_up()
    assert seen and seen[0] == 1, "the first compile ran before the prefetched hash was done"
    assert stats.compile_s >= 100, f"the wait for the hash is outside the compile phase ({stats.compile_s:.3f} s)"


def _record_and_stop(calls):
    def start(device, use_inductor):
        calls.append((torch.device(device), use_inductor))
        raise _Stop

    return start


@pytest.mark.parametrize("mode, use_inductor", [("no_inductor", False), ("inductor", True)])
def test_llm_starts_the_prefetch_for_its_device_and_mode_before_the_weights_load(mode, use_inductor, monkeypatch):
    calls = []
    monkeypatch.setattr(key_prefetch, "start", _record_and_stop(calls))
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("the weights loaded first"))
    monkeypatch.setattr(llm_module, "check_memory_before_build", lambda *a, **k: pytest.fail("checked memory first"))
    with pytest.raises(_Stop):
        LLM("llama-tiny", device="cpu", compilation_config=mode_config(mode), use_tqdm=False)
    assert calls == [(CPU, use_inductor)]


@pytest.mark.parametrize("mode, use_inductor", [("no_inductor", False), ("inductor", True)])
def test_bench_startup_starts_the_prefetch_as_llm_does(mode, use_inductor, monkeypatch):
    calls = []
    monkeypatch.setattr(key_prefetch, "start", _record_and_stop(calls))
    monkeypatch.setattr(registry, "build_model", lambda *a, **k: pytest.fail("the weights loaded first"))
    spec = {"model": "llama-tiny", "device": "cpu", "dtype": "float32", "batch_size": 2, "input_len": 4}
    with pytest.raises(_Stop):
        startup._child({**spec, "mode": mode})
    assert calls == [(CPU, use_inductor)]


@pytest.mark.eager
def test_bench_startups_import_phase_includes_what_the_prefetch_imports(monkeypatch):
    """The prefetch's start imports the compiler modules whose keys it hashes (on the main thread); that time
    belongs to a phase, the import phase, not to the unmeasured gap before the weights."""
    monkeypatch.setattr(key_prefetch, "start", lambda device, use_inductor: time.sleep(0.5))
    monkeypatch.setattr(startup, "_STARTED", time.perf_counter())
    row = startup._child({"model": "llama-tiny", "device": "cpu", "dtype": "float32", "batch_size": 2,
                          "input_len": 4, "mode": "eager"})  # fmt: skip
    assert row["import_s"] >= 0.5
