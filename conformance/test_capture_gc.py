"""No garbage collection runs while a CUDA graph is being captured (piecewise and full graphs, breakable segments).

Why it matters: a collection calls the finalizers of the dead reference cycles it finds, and a cycle may hold an
earlier model's ``torch.cuda.CUDAGraph``. Destroying a graph is a CUDA call that a capture in torch's default
``'global'`` error mode forbids to the whole process, so the capture under way fails. A conformance run builds
hundreds of models in one process, and its captures meet such cycles at whatever moment the collector picks:
the likely cause of the one capture of ``tox -e gpu`` at 52d99dc that CUDA invalidated (perf/NOTES.md v32).
See :func:`reference.compilation.cuda_graph.collection_paused` for the sources.

How the tests force the moment: the dead cycle is made while the collector's threshold is out of reach, and the
captured function lowers it to 1 and allocates containers, so an enabled collector would run right there, inside
the capture. On a CPU the graph is a stand-in that records whether it was destroyed mid-capture; on CUDA it is a
real captured graph, and the capture itself fails if it is destroyed mid-capture.
"""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch

from reference.compilation.breakable import BreakableCUDAGraphs
from reference.compilation.cuda_graph import capture_graph
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output

pytestmark = pytest.mark.requires("components")
OUT_OF_REACH = 10**9  # a collector threshold no test allocates up to


@pytest.fixture
def collector():
    """Restores the collector's thresholds and on/off state after the test; starts with no pending garbage."""
    thresholds, enabled = gc.get_threshold(), gc.isenabled()
    gc.collect()
    gc.set_threshold(OUT_OF_REACH)
    gc.enable()
    yield
    gc.set_threshold(*thresholds)
    (gc.enable if enabled else gc.disable)()
    gc.collect()


class _Cycle:
    """An object that refers to itself, so dropping it leaves it for the collector."""

    def __init__(self, payload):
        self.payload, self.itself = payload, self


def _drop_in_a_cycle(payload) -> None:
    _Cycle(payload)


def _collect_if_enabled() -> None:
    """What the collector does when a capture allocates: with the threshold at 1, any container allocated runs
    a collection of the youngest generation, where the dropped cycle is."""
    gc.set_threshold(1)
    try:
        [[i] for i in range(100)]  # containers: each allocation counts towards the threshold
    finally:
        gc.set_threshold(OUT_OF_REACH)


# ---------------------------------------------------------------------- any device: a stand-in CUDA graph
class _StandInGraph:
    """``torch.cuda.CUDAGraph``'s capture calls, recording whether a stand-in was destroyed mid-capture."""

    capturing = False
    destroyed: list[bool] = []  # one entry per destroyed stand-in (the dead one, or a capture's own): capturing?

    def capture_begin(self, pool=None):
        _StandInGraph.capturing = True

    def capture_end(self):
        _StandInGraph.capturing = False

    def replay(self):
        pass

    def __del__(self):
        _StandInGraph.destroyed.append(_StandInGraph.capturing)


class _StandInStream:
    def wait_stream(self, other):
        pass


@pytest.fixture
def stand_in_cuda(monkeypatch):
    """The CUDA calls of ``capture_graph`` and of a breakable capture replaced by stand-ins, so their captures
    run on any device."""
    _StandInGraph.capturing, _StandInGraph.destroyed = False, []
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _StandInGraph)
    monkeypatch.setattr(torch.cuda, "Stream", _StandInStream)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a: _StandInStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())


def _dead_stand_in() -> weakref.ref:
    """A stand-in graph dropped in a reference cycle; a weak reference that says whether it still exists."""
    graph = _StandInGraph()
    _drop_in_a_cycle(graph)
    return weakref.ref(graph)


def _assert_collected_after_the_capture_only(dead: weakref.ref) -> None:
    assert True not in _StandInGraph.destroyed, "a graph was destroyed while a capture was under way"
    assert dead() is not None
    gc.collect()  # the cycle was collectable all along: it goes now, outside any capture
    assert dead() is None
    assert gc.isenabled()


def test_a_dead_graph_is_not_collected_while_capture_graph_captures(collector, stand_in_cuda):
    dead = _dead_stand_in()

    graph, output = capture_graph(lambda x: (_collect_if_enabled(), x + 1)[1], (torch.ones(2),), None, _StandInStream())

    assert torch.equal(output, torch.full((2,), 2.0))
    _assert_collected_after_the_capture_only(dead)


@pytest.mark.parametrize("enabled", [True, False], ids=["collector-on", "collector-off"])
@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
def test_capture_graph_leaves_the_collector_as_it_found_it(enabled, raises, collector, stand_in_cuda):
    def fn():
        assert not gc.isenabled()
        if raises:
            raise ValueError("the captured function failed")

    (gc.enable if enabled else gc.disable)()
    with pytest.raises(ValueError) if raises else contextlib.nullcontext():
        capture_graph(fn, (), None, _StandInStream())
    assert gc.isenabled() == enabled
    assert _StandInGraph.capturing is False  # capture_end ran on the error path too


def _breakable_capture(forward, x: torch.Tensor):
    """A breakable capture of ``forward`` at ``x``'s size, called directly: on a CPU ``BreakableCUDAGraphs``
    itself runs a CPU tensor without graphs."""
    graphs = BreakableCUDAGraphs(forward, SILLY_SPLITTING_OPS, capture_sizes=(4,), num_warmups=0, debug_addresses=False)
    return graphs._capture(x.shape[0], (x,))


def test_a_dead_graph_is_not_collected_while_breakable_segments_are_captured(collector, stand_in_cuda):
    model, x = SillyModel(), torch.randn(4, 8)
    dead = _dead_stand_in()

    output = _breakable_capture(lambda t: (_collect_if_enabled(), model(t))[1], x)

    torch.testing.assert_close(output, expected_output(x))  # three segments and two eager ops ran
    _assert_collected_after_the_capture_only(dead)


def test_a_breakable_capture_that_raises_leaves_the_collector_on(collector, stand_in_cuda):
    model = SillyModel()

    def forward(t):  # fails between the first segment and the second
        assert not gc.isenabled()
        model(t)
        raise ValueError("the model failed mid-capture")

    with pytest.raises(ValueError, match="mid-capture"):
        _breakable_capture(forward, torch.randn(4, 8))
    assert gc.isenabled()
    assert _StandInGraph.capturing is False  # the open segment's capture was ended


# ---------------------------------------------------------------------- CUDA: real graphs
def _dead_real_graph() -> None:
    """A captured graph, dropped in a reference cycle: only a collection destroys it."""
    x = torch.zeros(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x.add_(1)
    _drop_in_a_cycle(graph)


@pytest.mark.gpu
def test_capture_graph_survives_a_dead_graph_in_a_cycle(collector):
    _dead_real_graph()
    x = torch.ones(8, device="cuda")

    graph, output = capture_graph(
        lambda t: (_collect_if_enabled(), t * 3)[1], (x,), torch.cuda.graph_pool_handle(), torch.cuda.Stream()
    )

    torch.testing.assert_close(output, torch.full_like(x, 3.0), rtol=0, atol=0)
    x.fill_(2.0)
    graph.replay()
    torch.testing.assert_close(output, torch.full_like(x, 6.0), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.breakable
def test_breakable_segments_survive_a_dead_graph_in_a_cycle(collector):
    model = SillyModel()
    capturing = []

    def forward(x):  # the collector's moment comes inside the capture, not in the first (checking) call
        if capturing:
            _collect_if_enabled()
        return model(x)

    graphs = BreakableCUDAGraphs(forward, SILLY_SPLITTING_OPS, capture_sizes=(4,), num_warmups=0, debug_addresses=False)
    x = torch.randn(4, 16, device="cuda")
    graphs(x)  # checks the splitting ops, runs eagerly
    _dead_real_graph()
    capturing.append(True)
    captured = graphs(x)
    torch.testing.assert_close(captured, expected_output(x))
    x.copy_(torch.randn_like(x))
    replayed = graphs(x)
    torch.testing.assert_close(replayed, expected_output(x))
