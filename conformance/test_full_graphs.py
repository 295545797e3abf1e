"""Full CUDA graphs: which steps replay one graph of the whole forward, and that they compute what the
piecewise steps compute.

A full graph captures attention too, so it is right only if attention reads each step's lengths and cache
rows from static buffers the runner rewrites before the replay, and only for the steps it was captured for
(uniform decode, one token per sequence, padded to a capture size). The rules:

* dispatch: uniform decode steps of at most the largest full size go to a full graph keyed by the padded
  size; prefill and mixed steps, even of a decode size, do not (the runner's record says so, on a CPU too);
* a full step at a capture size is bitwise equal to eager with the same custom ops (the graph replays
  eager's kernels), and a padded full step bitwise equal to the piecewise step of the same padded size;
* after warm-up, decode steps replay the captured graphs (one replay per step, no new capture).
"""

from __future__ import annotations

import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import DEVICES, make_runner, small_llama_config, token_ids
from reference.compilation import expect_counters
from reference.forward_context import BatchDescriptor

CAPTURE_SIZES = [1, 2, 4, 8]


def _record(runner, new_tokens, context_lens):
    runner.step(new_tokens, context_lens, list(range(len(new_tokens))))
    return runner.last_dispatch.runtime_mode, runner.last_dispatch.descriptor


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["no_inductor_full", "breakable"])
def test_uniform_decode_steps_go_to_full_graphs_and_the_rest_to_pieces(mode, device, impl):
    """``full_and_piecewise``: decode -> FULL at the next full size; a prefill of a decode size -> PIECEWISE."""
    hf = small_llama_config()
    overrides = {"cudagraph_mode": "full_and_piecewise"} if mode == "breakable" else {}
    runner = make_runner(
        impl,
        mode,
        hf,
        device=device,
        max_num_seqs=4,
        max_model_len=32,
        cudagraph_capture_sizes=CAPTURE_SIZES,
        **overrides,
    )
    runner.warm_up()
    assert runner.full_sizes == (1, 2, 4)  # a decode step has at most max_num_seqs = 4 tokens
    assert _record(runner, [[1, 2, 3]], [0]) == ("PIECEWISE", BatchDescriptor(4, False))
    assert _record(runner, [[1], [2], [3]], [3, 5, 1]) == ("FULL", BatchDescriptor(4, True))
    assert _record(runner, [[1], [2]], [4, 6]) == ("FULL", BatchDescriptor(2, True))
    assert _record(runner, [[1, 2], [3]], [4, 6]) == ("PIECEWISE", BatchDescriptor(4, False))
    assert _record(runner, [[1] * 9], [0]) == ("NONE", BatchDescriptor(9, False))  # above every capture size


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["no_inductor"])
def test_full_decode_only_runs_other_steps_without_graphs(mode, device, impl):
    runner = make_runner(
        impl,
        mode,
        small_llama_config(),
        device=device,
        max_num_seqs=4,
        max_model_len=32,
        cudagraph_mode="full_decode_only",
        cudagraph_capture_sizes=CAPTURE_SIZES,
    )
    runner.warm_up()
    assert runner.capture_sizes == () and runner.full_sizes == (1, 2, 4)
    assert _record(runner, [[1, 2, 3]], [0]) == ("NONE", BatchDescriptor(3, False))
    assert _record(runner, [[1], [2], [3]], [3, 5, 1]) == ("FULL", BatchDescriptor(4, True))


@pytest.mark.no_inductor
@pytest.mark.no_inductor_full
def test_full_graphs_need_a_capture_size_a_decode_step_can_have(impl):
    with pytest.raises(ValueError, match=r"no capture size fits a decode step \(at most max_num_seqs=4"):
        make_runner(impl, "no_inductor_full", small_llama_config(), max_num_seqs=4, cudagraph_capture_sizes=[8, 16])


GPU_CASES = [pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=pytest.mark.gpu)]
# on a CPU the steps are dispatched as on CUDA and read the same static metadata; nothing is captured
CPU_AND_GPU_CASES = [pytest.param("cpu", torch.float32, id="cpu-fp32"), *GPU_CASES]


@pytest.mark.eager
@pytest.mark.parametrize("device, dtype", CPU_AND_GPU_CASES)
@pytest.mark.parametrize("mode", ["no_inductor_full", "breakable"])
def test_full_decode_at_a_capture_size_is_bitwise_eager_and_padded_decode_is_bitwise_piecewise(
    mode, device, dtype, impl
):
    """Four sequences decode at full size 4 (no padding: eager's shapes); three sequences pad to 4, where the
    piecewise runner pads to the same size. Lengths and rows change every step, so a graph that kept one
    step's metadata, or a prefill replayed as a decode graph, differs within a step or two."""
    hf = small_llama_config()
    sizes = dict(device=device, dtype=dtype, max_num_seqs=4, max_model_len=48, cudagraph_capture_sizes=CAPTURE_SIZES)
    piecewise = "no_inductor" if mode == "no_inductor_full" else "breakable"
    full_overrides = {"cudagraph_mode": "full_and_piecewise"} if mode == "breakable" else {}
    runners = {
        "eager": make_runner(impl, "eager", hf, **sizes),
        "piecewise": make_runner(impl, piecewise, hf, **sizes),
        "full": make_runner(impl, mode, hf, **sizes, **full_overrides),
    }
    for runner in runners.values():
        runner.warm_up()
    for round_, lengths in enumerate(([5, 7, 3, 9], [6, 2, 8])):
        prompts = [token_ids(n, hf.vocab_size, seed=10 * round_ + i) for i, n in enumerate(lengths)]
        before = runners["full"].dispatch_counts["FULL"]
        logits = prefill_and_decode(runners, prompts, num_decode=5, leader="eager")
        assert runners["full"].dispatch_counts["FULL"] - before == 5
        against = "eager" if len(lengths) in CAPTURE_SIZES else "piecewise"
        for step, (expected, ours) in enumerate(zip(logits[against], logits["full"])):
            assert torch.equal(ours, expected), (
                f"round {round_} ({len(lengths)} sequences) step {step} vs {against}: max diff "
                f"{(ours - expected).abs().max()}"
            )


@pytest.mark.requires("counters")
@pytest.mark.parametrize("device, dtype", GPU_CASES)
@pytest.mark.parametrize("mode", ["no_inductor_full", "inductor_full"])
def test_decode_steps_replay_the_full_graphs_captured_at_warm_up(mode, device, dtype, impl):
    hf = small_llama_config()
    runner = make_runner(
        impl,
        mode,
        hf,
        device=device,
        dtype=dtype,
        max_num_seqs=4,
        max_model_len=32,
        cudagraph_capture_sizes=CAPTURE_SIZES,
    )
    with expect_counters(num_full_cudagraph_captured=3):  # sizes 1, 2, 4
        runner.warm_up()
    assert runner.startup.full_capture_sizes == (4, 2, 1)
    runner.step([token_ids(5, hf.vocab_size, seed=1), token_ids(2, hf.vocab_size, seed=2)], [0, 0], [0, 1])
    with expect_counters(num_full_cudagraph_captured=0, num_full_cudagraph_replays=4):
        for s in range(4):
            runner.step([[3 + s], [9 + s]], [5 + s, 2 + s], [0, 1])


@pytest.mark.gpu
@pytest.mark.requires("components")
def test_debug_addresses_names_the_full_graph_when_an_input_moved():
    """The full-graph wrapper's own check (the piecewise one is test_cuda_graph's): after warm-up, capture and a
    replay from the captured address, a step whose input lies elsewhere raises, naming the graph's key."""
    from reference.compilation.full_graph import FullCUDAGraphs
    from reference.forward_context import ForwardContext, set_forward_context

    graphs = FullCUDAGraphs(lambda x: x * 2, num_warmups=1, debug_addresses=True)
    step = ForwardContext(cudagraph_runtime_mode="FULL", batch_descriptor=BatchDescriptor(4, True))
    x = torch.randn(4, 8, device="cuda")
    for _ in range(3):
        with set_forward_context(step):
            assert torch.equal(graphs(x), x * 2)
    moved = x.clone()  # x stays alive, so the allocator cannot hand its block to the clone
    with set_forward_context(step), pytest.raises(
        RuntimeError, match=r"CUDA graph of the full graph for BatchDescriptor\(num_tokens=4, uniform_decode=True\): "
        r"input 0 moved from 0x"
    ):
        graphs(moved)
