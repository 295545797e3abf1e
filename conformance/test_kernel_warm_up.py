"""The runner compiles the custom ops' Triton kernels on a thread while Dynamo traces the model (issue 22).

A cold start used to compile each kernel at the first forward that launched it, after the trace, one after
another (perf/NOTES.md v35: 1.1 s in the compile phase and 0.4 s in the capture phase of a cold 8B start on an
H100). :class:`~reference.engine.kernel_warm_up.KernelWarmUp` runs one small eager step of the model on a thread
of its own, so every kernel that step launches is compiled while the main thread traces, and the backend waits
for it before any piece runs (so no capture can meet the thread's launches).

The rules: a forward context belongs to the thread that set it (the warm-up's step and the runner's trace each
have their own); the warm-up's step leaves no context behind and says why it failed; on CUDA, every custom-op
kernel a piecewise warm-up launches was compiled on the warm-up's thread, none on the runner's.
"""

from __future__ import annotations

import threading

import pytest
import torch

from conformance.helpers import build_llama, small_llama_config
from reference.compilation import cache_key, compilation_counter
from reference.config import mode_config
from reference.engine.kernel_warm_up import KernelWarmUp, warm_up_step
from reference.engine.runner import ModelRunner
from reference.forward_context import ForwardContext, current_forward_context, set_forward_context

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


def _spy_on_attention(monkeypatch, runner, fail: Exception | None = None) -> list:
    """Each call of the first layer's attention appends (thread name, query lens, seq lens, rows, tokens)."""
    attention = runner.model.model.layers[0].self_attn.attn
    real, seen = attention.forward, []

    def spy(q, k, v):
        md = current_forward_context().attn_metadata
        seen.append((threading.current_thread().name, md.query_lens, md.seq_lens, md.rows, q.shape[0]))
        if fail is not None:
            raise fail
        return real(q, k, v)

    monkeypatch.setattr(attention, "forward", spy)
    return seen


def test_the_warm_up_is_one_eager_step_of_a_decode_beside_a_prefill_on_its_own_thread(monkeypatch):
    runner = _runner()
    seen = _spy_on_attention(monkeypatch, runner)
    kernels = KernelWarmUp(runner.model, **SIZES)
    kernels.start()
    kernels.join()
    assert seen == [(KernelWarmUp.THREAD_NAME, [1, 2], [1, 2], [0, 1], 3)]
    assert kernels.step_s > 0
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
    seen = _spy_on_attention(monkeypatch, runner)
    kernels = KernelWarmUp(runner.model, **sizes)
    kernels.start()
    kernels.join()
    assert [s[1:4] for s in seen] == [tuple(step)]


def test_a_failed_warm_up_step_is_raised_by_join_with_its_cause_and_only_once(monkeypatch):
    runner = _runner()
    _spy_on_attention(monkeypatch, runner, fail=ValueError("planted"))
    kernels = KernelWarmUp(runner.model, **SIZES)
    kernels.start()
    kernels.wait()  # waiting does not raise: the backend waits inside Dynamo, where an error would be rewrapped
    with pytest.raises(RuntimeError, match=r"kernel warm-up's eager step failed \(ValueError: planted\)") as caught:
        kernels.join()
    assert isinstance(caught.value.__cause__, ValueError)
    kernels.join()  # reported once
    assert current_forward_context() is None


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


def _triton_compiles(monkeypatch) -> list[tuple[str, str]]:
    """Every compile of one of the project's Triton kernels from now on appends (thread name, kernel name).

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
            seen.append((threading.current_thread().name, self.fn.__name__))
        return compile_variant(self, *args, **kwargs)

    monkeypatch.setattr(jit.JITFunction, "_do_compile", spy)
    return seen


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
    prefill_and_decode({"run": runner}, [[1, 2, 3], [4, 5, 6, 7, 8]], num_decode=3, leader="run")
    on_main = sorted({name for thread, name in compiles if thread != KernelWarmUp.THREAD_NAME})
    assert not on_main, f"compiled on the runner's thread, after the warm-up's step: {on_main}"
    compiled = {name for _, name in compiles}
    expected = {"_rms_norm_kernel", "_rotary_kernel", "_gated_kernel"}
    expected |= {"_decode_attention_kernel", "_prefill_attention_kernel"}
    assert expected <= compiled, f"never compiled: {sorted(expected - compiled)}"
