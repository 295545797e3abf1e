"""The reference runner's capture steps replay no graph (``cuda_graph.outputs_unread``).

A capture records kernels without running them, so a capture that must return its call's values replays the
graph at once. The runner's warm-up drops every result of its capturing steps, so there it skips that replay:
each graph is first replayed, and uploaded, at its first real step (perf/NOTES.md v48 has why and what it saves).
Everywhere else a capture still replays: a compiled model called directly returns the capture call's values
(the warm-up count rule in test_cuda_graph_warmups.py checks them bitwise).

On any device, the switch itself: the one capture function every graph kind uses (pieces, full graphs, Inductor's
partitions) replays outside the block and not inside it, and the block always ends switched off; and a size's
steps stop at the one that captured (the tracing call may have been the largest size's plain run). On CUDA (marked
gpu), the runner's whole warm-up replays nothing, and what the runner computes after it (a prefill and decode
steps that read the KV cache) is bitwise what the same runner computes after a warm-up that replays, with the
unfilled outputs poisoned with NaN: nothing depends on them, the KV-cache entries the capturing steps wrote from
them included (the runner zeroes them; torch's attention, float64's, would read them).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch.utils._pytree import tree_map

from conformance.driver import prefill_and_decode
from conformance.helpers import build_llama, small_llama_config
from reference.compilation import compilation_counter, cuda_graph, full_graph
from reference.config import mode_config
from reference.engine.runner import ModelRunner


class _Graph:
    """Stands in for ``torch.cuda.CUDAGraph`` on a machine without CUDA: records its calls."""

    calls: list[str] = []

    def capture_begin(self, pool=None):
        self.calls.append("begin")

    def capture_end(self):
        self.calls.append("end")

    def replay(self):
        self.calls.append("replay")


class _Stream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def fake_cuda(monkeypatch) -> list[str]:
    """The CUDA calls of ``capture_graph`` replaced by recorders; returns the graph calls, in order."""
    _Graph.calls = []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _Graph)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    return _Graph.calls


def test_a_capture_replays_at_once_except_inside_outputs_unread(fake_cuda):
    graph, output = cuda_graph.capture_graph(lambda x: x + 1, (torch.ones(2),), None, _Stream())
    assert fake_cuda == ["begin", "end", "replay"] and torch.equal(output, torch.full((2,), 2.0))
    fake_cuda.clear()
    with cuda_graph.outputs_unread():
        assert not cuda_graph.replays_after_capture()
        cuda_graph.capture_graph(lambda x: x + 1, (torch.ones(2),), None, _Stream())
    assert fake_cuda == ["begin", "end"]
    assert cuda_graph.replays_after_capture()


def test_outputs_unread_ends_switched_off_when_its_block_raises():
    with pytest.raises(ValueError), cuda_graph.outputs_unread():
        raise ValueError("a failed capture step")
    assert cuda_graph.replays_after_capture()


@pytest.mark.parametrize(
    "captures_at, counter, calls",
    [
        (1, "num_cudagraph_captured", 1),  # the tracing call was the size's plain run: no step that only replays
        (2, "num_cudagraph_captured", 2),
        (2, "num_full_cudagraph_captured", 2),
        (None, "num_cudagraph_captured", 2),  # graphs that count nothing (the peer's) get every step
    ],
)
def test_a_sizes_steps_stop_at_the_one_that_captured(monkeypatch, captures_at, counter, calls):
    made = []

    def step():
        made.append(1)
        if len(made) == captures_at:
            monkeypatch.setattr(compilation_counter, counter, getattr(compilation_counter, counter) + 1)

    assert cuda_graph.steps_until_captured(step, 2) == calls and len(made) == calls


def _runner(mode: str, dtype: torch.dtype) -> ModelRunner:
    config = mode_config(mode, cudagraph_capture_sizes=[1, 2, 4, 8])
    model = build_llama(small_llama_config(), config, device="cuda", dtype=dtype)
    return ModelRunner(model, config, max_num_seqs=4, max_model_len=32, max_num_batched_tokens=8)


def _poison_unfilled_outputs(monkeypatch) -> None:
    """Fill a capture's floating outputs with NaN where no replay filled them (pool memory may hold anything; fresh
    memory is mostly zeros, which would hide a leak)."""
    real = cuda_graph.capture_graph

    def poisoned(fn, args, pool, stream):
        graph, output = real(fn, args, pool, stream)
        if not cuda_graph.replays_after_capture():
            tree_map(lambda t: t.fill_(float("nan")) if torch.is_tensor(t) and t.is_floating_point() else t, output)
        return graph, output

    monkeypatch.setattr(cuda_graph, "capture_graph", poisoned)  # the pieces'
    monkeypatch.setattr(full_graph, "capture_graph", poisoned)  # the full graphs'


@pytest.mark.gpu
@pytest.mark.parametrize(
    "mode, dtype",
    [
        pytest.param("no_inductor", torch.bfloat16, marks=pytest.mark.no_inductor),
        pytest.param("no_inductor_full", torch.bfloat16, marks=pytest.mark.no_inductor_full),
        pytest.param("breakable", torch.bfloat16, marks=pytest.mark.breakable),
        # float64 takes torch's attention (no Triton kernel for it), which reads a row past the sequence's end
        # and masks by adding -inf: a NaN left in the KV cache there would survive (0 * NaN)
        pytest.param("no_inductor", torch.float64, marks=pytest.mark.no_inductor),
        pytest.param("breakable", torch.float64, marks=pytest.mark.breakable),
    ],
)
def test_the_runners_warm_up_replays_no_graph_and_its_steps_are_bitwise_a_replaying_warm_ups(mode, dtype, monkeypatch):
    """Against the same runner whose warm-up replays each graph at its capture (the switch made a no-op): the
    prefill (8 tokens, a piecewise size) and the decode steps (full graphs in no_inductor_full) that follow give
    bitwise the same logits, with the unfilled outputs poisoned, so nothing read a value the captures left
    unfilled. The shorter prompt takes row 0, whose slots past its end the warm-up's steps wrote, and which the
    batch's longer sequence makes torch's attention read."""
    replays = []
    real_replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda self: (replays.append(1), real_replay(self))[1])
    _poison_unfilled_outputs(monkeypatch)
    unread, replaying = _runner(mode, dtype), _runner(mode, dtype)
    unread.warm_up()
    assert unread.startup.capture_sizes, "the warm-up captured nothing"
    assert replays == [], f"the warm-up replayed {len(replays)} graphs"
    with monkeypatch.context() as patch:
        patch.setattr(cuda_graph, "outputs_unread", contextlib.nullcontext)
        replaying.warm_up()
    assert replays, "the warm-up with the switch made a no-op replayed no graph: the comparison would be void"
    replays.clear()
    vocab = unread.vocab_size
    prompts = [[(7 * i + 3) % vocab for i in range(n)] for n in (3, 5)]
    logits = prefill_and_decode({"unread": unread, "replaying": replaying}, prompts, 3, leader="replaying")
    assert replays, "the steps after the warm-up replayed no graph"
    for step, (ours, theirs) in enumerate(zip(logits["unread"], logits["replaying"])):
        assert torch.equal(ours, theirs), f"step {step}: the logits differ from the replaying warm-up's"
