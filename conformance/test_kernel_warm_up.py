"""The runner compiles the custom ops' Triton kernels on a thread while Dynamo traces the model (issue 22).

A cold start used to compile each kernel at the first forward that launched it, after the trace, one after
another (perf/NOTES.md v35: 1.1 s in the compile phase and 0.4 s in the capture phase of a cold 8B start on an
H100). :class:`~reference.engine.kernel_warm_up.KernelWarmUp` runs one small eager step of the model on a thread
of its own, so every kernel that step launches is compiled while the main thread traces, and the backend waits
for it before any piece runs (so no capture can meet the thread's launches).

The rules: a forward context belongs to the thread that set it (the warm-up's step and the runner's trace each
have their own); the step's shape fits any KV cache and leaves no context behind; the runner starts it before the
trace, and only for a start that traces (not one the compile cache serves) without Inductor; a failed step is one
warning, a failed trace leaves nothing holding the model; the backend calls its hook once before any piece runs;
on CUDA, every custom-op kernel a piecewise warm-up and its steps launch was compiled on the warm-up's thread,
none on the runner's; the step's first pass compiles without launching, its compiles handed to a pool at once,
and its second pass, which launches, compiles nothing. The runner's wiring runs on a CPU here with ``DEVICE_TYPES``
widened (on a CPU the step runs torch's kernels, so it compiles nothing).
"""

from __future__ import annotations

import gc
import threading
import weakref

import pytest
import torch

from conformance.helpers import build_llama, small_llama_config
from reference.compilation import cache_key, compilation_counter
from reference.config import mode_config
from reference.cpus import usable_cpus
from reference.engine import kernel_warm_up
from reference.engine.kernel_warm_up import KernelWarmUp, warm_up_step
from reference.engine.runner import ModelRunner
from reference.forward_context import ForwardContext, current_forward_context, set_forward_context
from reference.ops import attention as attention_module
from reference.ops import kernel_launch

pytestmark = [pytest.mark.requires("components"), pytest.mark.no_inductor]


def test_a_forward_context_belongs_to_the_thread_that_set_it():
    seen, entered, release = {}, threading.Event(), threading.Event()

    def other_thread():
        with set_forward_context(ForwardContext(attn_metadata="other")):  # while the main thread holds its own
            entered.set()
            release.wait(timeout=30)
            seen["inside"] = current_forward_context().attn_metadata
        seen["after"] = current_forward_context()

    with set_forward_context(ForwardContext(attn_metadata="main")):
        thread = threading.Thread(target=other_thread)
        thread.start()
        assert entered.wait(timeout=30), "the other thread could not set its context while this one held one"
        assert current_forward_context().attn_metadata == "main"
        release.set()
        thread.join(timeout=30)
    assert seen == {"inside": "other", "after": None}
    assert current_forward_context() is None


SIZES = {"max_num_seqs": 4, "max_model_len": 16}


def _runner(mode: str = "no_inductor", *, device="cpu", dtype=torch.float32, sizes=None, **overrides):
    """A runner over the 2-layer llama (its KV caches allocated); on a CPU it never starts a warm-up itself."""
    config = mode_config(mode, **{"cudagraph_capture_sizes": [1, 2, 4], **overrides})
    model = build_llama(small_llama_config(), config, device=device, dtype=dtype)
    return ModelRunner(model, config, **(sizes or SIZES))


def _spy_on_attention(monkeypatch, fail_on: str | None = None) -> list:
    """Each call of the first layer's attention (the op's implementation, which Dynamo never traces) appends
    (thread name, query lens, seq lens, rows, tokens); on the thread named ``fail_on`` it raises instead."""
    real, seen = attention_module.attention_impl, []

    def spy(layer, md, q, k, v, out):
        if layer.layer_name == "model.layers.0.self_attn.attn":
            thread = threading.current_thread().name
            seen.append((thread, md.query_lens, md.seq_lens, md.rows, q.shape[0]))
            if thread == fail_on:
                raise ValueError("planted")
        return real(layer, md, q, k, v, out)

    monkeypatch.setattr(attention_module, "attention_impl", spy)
    return seen


def test_the_warm_up_is_one_eager_step_of_a_decode_beside_a_prefill_on_its_own_thread(monkeypatch):
    runner = _runner()
    seen = _spy_on_attention(monkeypatch)
    kernels = KernelWarmUp(runner.model, **SIZES)
    kernels.start()
    kernels.wait()
    assert seen == [(KernelWarmUp.THREAD_NAME, [1, 2], [1, 2], [0, 1], 3)]
    assert kernels.error is None and kernels.step_s > 0
    assert kernels.model is None, "the warm-up still holds the model after its step"
    cache = runner.model.model.layers[0].self_attn.attn.kv_cache  # [2, R, L, Hkv, D]
    written = cache.abs().sum(dim=(0, 3, 4)) > 0  # [R, L]: the slots the step wrote
    assert written.nonzero().tolist() == [[0, 0], [1, 0], [1, 1]]
    assert current_forward_context() is None


@pytest.mark.parametrize(
    "sizes, step",
    [
        ({"max_num_seqs": 1, "max_model_len": 16}, ([2], [2], [0])),  # one cache row: a prefill alone
        ({"max_num_seqs": 4, "max_model_len": 1}, ([1], [1], [0])),  # one token per row: a decode alone
    ],
)
def test_the_warm_up_step_fits_a_cache_of_one_row_or_of_one_token_per_row(monkeypatch, sizes, step):
    assert warm_up_step(**sizes) == step
    runner = _runner(sizes=sizes)
    seen = _spy_on_attention(monkeypatch)
    kernels = KernelWarmUp(runner.model, **sizes)
    kernels.start()
    kernels.wait()
    assert kernels.error is None
    assert [s[1:4] for s in seen] == [tuple(step)]


@pytest.fixture
def warm_up_on_cpu(monkeypatch):
    """The runner warms up kernels on a CPU too, so its wiring runs here (its step then runs torch's kernels)."""
    monkeypatch.setattr(kernel_warm_up, "DEVICE_TYPES", frozenset({"cpu", "cuda"}))


def test_the_runner_starts_the_warm_up_before_the_trace_and_records_it(monkeypatch, warm_up_on_cpu):
    runner = _runner()
    seen, first_wait = _spy_on_attention(monkeypatch), []
    real_wait = KernelWarmUp.wait

    def wait(self):
        if not first_wait:  # the attention calls made by then, by thread
            first_wait.append([thread for thread, *_ in seen])
        real_wait(self)

    monkeypatch.setattr(KernelWarmUp, "wait", wait)
    stats = runner.warm_up()
    assert first_wait and "MainThread" not in first_wait[0], "the pieces ran before anything waited for the warm-up"
    assert seen[0][0] == KernelWarmUp.THREAD_NAME, "the warm-up's step was not the first attention call"
    assert all(thread != KernelWarmUp.THREAD_NAME for thread, *_ in seen[1:]), "more than one warm-up step"
    assert stats.kernel_warm_up_s > 0 and stats.kernel_warm_up_wait_s >= 0
    assert runner.compiled.backend.before_first_run is None


def test_a_failed_warm_up_step_is_one_warning_and_the_start_goes_on(monkeypatch, warm_up_on_cpu):
    """The model's own first step succeeded, so the warm-up's failure (two steps' memory at once, say) costs only
    the kernels it would have compiled early: a warning naming the cause, not a failed start."""
    runner = _runner()
    _spy_on_attention(monkeypatch, fail_on=KernelWarmUp.THREAD_NAME)
    with pytest.warns(RuntimeWarning, match=r"kernel warm-up: its eager step failed \(ValueError: planted\)"):
        runner.warm_up()
    runner.step([[1, 2, 3]], [0], [0])  # the start went on
    assert current_forward_context() is None


def test_a_trace_that_raises_waits_for_the_warm_up_and_leaves_no_hook_holding_the_model(monkeypatch, warm_up_on_cpu):
    """Dynamo keeps every backend it was given for the life of the process: a hook left on it would keep the
    warm-up, and through it the model and its KV cache, after a failed start."""
    from reference.compilation import backend as backend_module

    def fails(*args, **kwargs):
        raise RuntimeError("planted compile failure")

    monkeypatch.setattr(backend_module, "compile_piece", fails)
    runner = _runner()
    backend = runner.compiled.backend
    with pytest.raises(Exception, match="planted compile failure"):
        runner.warm_up()
    assert not [t for t in threading.enumerate() if t.name == KernelWarmUp.THREAD_NAME], "the warm-up still runs"
    assert backend.before_first_run is None
    model = weakref.ref(runner.model)
    del runner
    gc.collect()
    assert model() is None, "the model outlived its failed start"


@pytest.mark.parametrize("start", ["traced", "served by the compile cache"])
def test_the_backend_calls_before_first_run_once_after_compiling_and_before_any_piece_runs(
    monkeypatch, tmp_path, start
):
    if start != "traced":
        monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
        _runner(cache_dir=str(tmp_path)).warm_up()  # writes the entry the next start is served
    runner = _runner(cache_dir=str(tmp_path))
    cache = runner.model.model.layers[0].self_attn.attn.kv_cache
    hits, calls = compilation_counter.num_cache_hits, []
    runner.compiled.backend.before_first_run = lambda: calls.append(bool(cache.any()))
    runner.warm_up()
    assert calls == [False], "called once, before the first piece and attention ran (the KV cache still zero)"
    assert cache.any()
    assert compilation_counter.num_cache_hits - hits == (start != "traced")


def _warm_up_starts(monkeypatch) -> list[str]:
    """Each start of a kernel warm-up from now on appends the name of the thread that started it."""
    real_start, started = KernelWarmUp.start, []

    def start(self):
        started.append(threading.current_thread().name)
        real_start(self)

    monkeypatch.setattr(KernelWarmUp, "start", start)
    return started


@pytest.mark.parametrize("start", ["traced", "traced, writing its cache entry", "served by the compile cache"])
def test_the_runner_warms_up_kernels_only_for_a_start_that_traces(monkeypatch, tmp_path, warm_up_on_cpu, start):
    """A start the compile cache serves runs no trace for the step to hide behind: on an H100 a warm 8B
    ``no_inductor`` start waited 0.24-0.28 s for a warm-up it did not need (perf/NOTES.md v39)."""
    if start != "traced":
        monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    if start == "served by the compile cache":
        _runner(cache_dir=str(tmp_path)).warm_up()  # writes the entry the next start is served
    runner = _runner(cache_dir=str(tmp_path))
    started, hits = _warm_up_starts(monkeypatch), compilation_counter.num_cache_hits
    stats = runner.warm_up()
    served = compilation_counter.num_cache_hits - hits == 1
    assert served == (start == "served by the compile cache")
    assert started == ([] if served else ["MainThread"])
    assert (stats.kernel_warm_up_s > 0) == (not served)
    assert runner.compiled.before_trace is None and runner.compiled.backend.before_first_run is None


@pytest.mark.inductor
def test_the_runner_warms_up_no_kernels_for_inductor(monkeypatch, warm_up_on_cpu):
    """Inductor's pieces launch kernels of its own, compiled in its compile phase, and the step's Python would
    take turns with Inductor's: an 8B ``inductor`` start on an H100 was about 1 s slower with it, warm and cold
    (perf/NOTES.md v39). Inductor itself is stubbed out (each piece runs as traced): what is checked is the
    runner's choice, made from ``use_inductor``."""
    from reference.compilation import backend as backend_module

    monkeypatch.setattr(backend_module, "compile_piece", lambda module, config: module)
    runner = _runner("inductor")
    started = _warm_up_starts(monkeypatch)
    stats = runner.warm_up()
    assert started == [] and stats.kernel_warm_up_s == 0
    runner.step([[1, 2, 3]], [0], [0])


@pytest.mark.gpu
def test_on_cuda_the_warm_ups_launches_are_done_when_wait_returns(monkeypatch):
    """The backend's wait is all that keeps a capture from beginning while the step's kernels still run on the
    device. Each of the step's attention calls is followed by a spin kernel (``torch.cuda._sleep``, about 0.1 s
    on the device, returning at once on the host), so a thread that ends without waiting for its launches leaves
    the stream busy."""
    runner = _runner(device="cuda", dtype=torch.bfloat16)
    real = attention_module.attention_impl

    def then_spin(layer, md, q, k, v, out):
        real(layer, md, q, k, v, out)
        if threading.current_thread().name == KernelWarmUp.THREAD_NAME:
            torch.cuda._sleep(2**27)

    monkeypatch.setattr(attention_module, "attention_impl", then_spin)
    kernels = KernelWarmUp(runner.model, **SIZES)
    kernels.start()
    kernels.wait()
    assert kernels.error is None
    assert torch.cuda.default_stream(runner.device).query(), "the warm-up's kernels still ran after wait() returned"


def _triton_compiles(monkeypatch) -> list[tuple[str, str, bool]]:
    """Every compile of one of the project's Triton kernels from now on appends (thread name, kernel name, whether
    the thread was inside ``kernel_launch.compile_only``, where the compile is handed to a pool of threads).

    Each kernel's in-memory variants are dropped first, so a kernel an earlier test compiled in this process
    compiles again (from Triton's disk cache, where it has one: still a compile call, on some thread).
    """
    import triton.runtime.jit as jit

    from reference.ops import graph_attention_kernels, linear_kernels, triton_kernels

    modules = (triton_kernels, graph_attention_kernels, linear_kernels)
    ours = {id(v): v for m in modules for v in vars(m).values() if isinstance(v, jit.JITFunction)}
    assert ours, "no Triton kernel found in reference.ops"
    for kernel in ours.values():
        kernel.device_caches.clear()
    compile_variant, seen = jit.JITFunction._do_compile, []

    def spy(self, *args, **kwargs):
        if id(self) in ours:
            seen.append((threading.current_thread().name, self.fn.__name__, kernel_launch.compiling_only()))
        return compile_variant(self, *args, **kwargs)

    monkeypatch.setattr(jit.JITFunction, "_do_compile", spy)
    return seen


needs_parallel_compile = pytest.mark.skipif(
    not kernel_launch.supported(), reason="Triton has no AsyncCompileMode (3.4+): the warm-up compiles as it launches"
)


@pytest.mark.gpu
@needs_parallel_compile
def test_on_cuda_a_launch_inside_compile_only_compiles_its_kernel_and_writes_nothing(monkeypatch):
    """The warm-up's first pass runs the model with every launch turned into a compile: a kernel that launched there
    would run beside the trace, on outputs left as allocated. The launch after the block finds the compile."""
    from reference.ops import graph_attention_kernels

    compiles = _triton_compiles(monkeypatch)
    cache = torch.zeros(2, 4, 8, 2, 64, device="cuda", dtype=torch.bfloat16)  # [2, R, L, Hkv, D]
    k, v = (torch.randn(3, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))  # [T, Hkv * D]
    slots = torch.tensor([0, 9, 17], device="cuda")  # [T], flat row * L + position
    with kernel_launch.compile_only(workers=2, device="cuda"):
        graph_attention_kernels.write_kv_cache(k, v, cache, slots)
    torch.cuda.synchronize()
    assert not cache.any(), "a launch inside compile_only wrote the KV cache"
    assert compiles == [("MainThread", "_write_kv_cache_kernel", True)]
    graph_attention_kernels.write_kv_cache(k, v, cache, slots)
    assert len(compiles) == 1, f"the launch after the block compiled again: {compiles[1:]}"
    flat = cache.view(2, -1, 128)  # [2, R * L, Hkv * D]
    torch.testing.assert_close(flat[0, slots], k, rtol=0, atol=0)
    torch.testing.assert_close(flat[1, slots], v, rtol=0, atol=0)


def _kernels_readied(monkeypatch) -> list[tuple[str, bool]]:
    """Each time a compiled Triton kernel is readied for its first launch from now on (``_init_handles`` building
    its launcher and loading its binary: the first call does it, later calls return at once), appends the name of
    the thread that did it and whether that thread's current stream was capturing a CUDA graph then."""
    from triton.compiler.compiler import CompiledKernel

    ready, seen = CompiledKernel._init_handles, []

    def spy(self):
        fresh = getattr(self, "module", None) is None
        if fresh:
            seen.append((threading.current_thread().name, torch.cuda.is_current_stream_capturing()))
        ready(self)

    monkeypatch.setattr(CompiledKernel, "_init_handles", spy)
    return seen


@pytest.mark.gpu
@needs_parallel_compile
def test_on_cuda_the_warm_up_compiles_its_kernels_at_once_then_launches_them_compiling_nothing(monkeypatch):
    """The first pass hands every compile to the pool before any ends, so the pool's first two compiles meet at a
    barrier before compiling (with one compile thread, or a first pass that launches and so waits for each compile,
    the first waits for the second until the barrier breaks: a failed step), and the pool readies each kernel it
    compiled. The second pass launches: a kernel it compiles is a specialisation the first pass's launches missed,
    and one it readies costs its launcher's build on the warm-up's thread (0.87-0.92 s for six kernels on the
    H100, perf/NOTES.md v45)."""
    compiles, readied = _triton_compiles(monkeypatch), _kernels_readied(monkeypatch)
    barrier, submitted = threading.Barrier(2, timeout=20), []

    class MeetingPool(kernel_launch.CompilePool):
        def submit(self, fn, /, *args, **kwargs):
            submitted.append(fn)
            if len(submitted) > 2:
                return super().submit(fn, *args, **kwargs)

            def meet():
                barrier.wait()
                return fn(*args, **kwargs)

            return super().submit(meet)

    if usable_cpus() < 2:
        pytest.skip("this process may run on one CPU: the warm-up's pool has one thread, so none meet at a barrier")
    monkeypatch.setattr(kernel_launch, "CompilePool", MeetingPool)
    runner = _runner(device="cuda", dtype=torch.bfloat16)
    kernels = KernelWarmUp(runner.model, **SIZES)
    kernels.start()
    kernels.wait()
    assert kernels.error is None, f"the warm-up's step failed: {kernels.error!r}"
    assert {thread for thread, _, _ in compiles} == {KernelWarmUp.THREAD_NAME}
    launched = sorted({name for _, name, inside in compiles if not inside})
    assert not launched, f"compiled by the warm-up's launching pass: {launched}"
    names = {name for _, name, _ in compiles}
    assert len(submitted) >= len(names) >= 5, f"{len(submitted)} compiles handed to the pool for {sorted(names)}"
    assert len(readied) == len(submitted), f"{len(readied)} kernels readied of {len(submitted)} compiled"
    outside = sorted({t for t, _ in readied if not t.startswith(kernel_launch.WORKER_PREFIX)})
    assert not outside, f"kernels readied outside the pool, at their first launch: on {outside}"
    assert 0 < kernels.compile_s < kernels.step_s


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["no_inductor", "no_inductor_full"])
def test_on_cuda_every_kernel_a_warm_up_and_its_steps_launch_is_compiled_on_the_warm_up_thread(monkeypatch, mode):
    """A kernel compiled on the main thread is a variant the warm-up's step missed (another dtype, stride class,
    constexpr or layer kind): the cold start pays for it after the trace again. After the warm-up, a prefill
    step and decode steps (piecewise and, under ``no_inductor_full``, full graphs) compile nothing either."""
    from conformance.driver import prefill_and_decode

    compiles = _triton_compiles(monkeypatch)
    runner = _runner(mode, device="cuda", dtype=torch.bfloat16)
    stats = runner.warm_up()
    assert stats.kernel_warm_up_s > 0, "no kernel warm-up ran"
    assert 0 < stats.kernel_compile_s < stats.kernel_warm_up_s, "the warm-up's step had no compile-only pass"
    prefill_and_decode({"run": runner}, [[1, 2, 3], [4, 5, 6, 7, 8]], num_decode=3, leader="run")
    on_main = sorted({name for thread, name, _ in compiles if thread != KernelWarmUp.THREAD_NAME})
    assert not on_main, f"compiled on the runner's thread, after the warm-up's step: {on_main}"
    compiled = {name for _, name, _ in compiles}
    expected = {"_rms_norm_kernel", "_rotary_kernel", "_gated_kernel"}
    expected |= {"_decode_attention_kernel", "_prefill_attention_kernel"}
    assert expected <= compiled, f"never compiled: {sorted(expected - compiled)}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("mode", "overrides"),
    [("no_inductor", {}), ("no_inductor_full", {}), ("no_inductor", {"cudagraph_mode": "full"}), ("breakable", {})],
    ids=["no_inductor", "no_inductor_full", "full", "breakable"],
)
def test_on_cuda_a_start_with_no_kernel_warm_up_and_no_warm_up_runs_loads_no_kernel_inside_a_capture(
    monkeypatch, mode, overrides
):
    """A compile-cache hit runs no kernel warm-up, and with ``cudagraph_num_of_warmups=0`` a capture at a size's
    first run would hold the first launch of each kernel that size compiles to, which loads its binary onto the
    device (an 8B warm start exited with a CUDA error there, perf/NOTES.md v45): every size runs plainly once
    first (``plain_runs_before_capture``). Each kernel's in-memory variants are dropped first, so each is loaded
    afresh here as in a fresh process."""
    from conformance.driver import prefill_and_decode

    monkeypatch.setattr(kernel_warm_up, "wanted", lambda device, config: False)  # as for a compile-cache hit
    _triton_compiles(monkeypatch)  # drops the variants compiled so far in this process
    readied = _kernels_readied(monkeypatch)
    runner = _runner(mode, device="cuda", dtype=torch.bfloat16, cudagraph_num_of_warmups=0, **overrides)
    stats = runner.warm_up()
    assert stats.kernel_warm_up_s == 0
    prefill_and_decode({"run": runner}, [[1, 2, 3], [4, 5, 6, 7, 8]], num_decode=3, leader="run")
    torch.cuda.synchronize()
    assert readied, "no kernel was loaded: the spy saw nothing"
    inside = [thread for thread, capturing in readied if capturing]
    assert not inside, f"{len(inside)} of {len(readied)} kernels loaded inside a capture"
