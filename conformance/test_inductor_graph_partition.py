"""``use_inductor_graph_partition`` (vLLM's field): Inductor, not the project's FX split, cuts the graph at the
splitting ops.

The rules: the model is traced once and compiled by Inductor once, whole (one piece, attention inside it, where
Inductor partitions around it); it computes the same function as eager within Inductor's rounding (no more than
twice eager's distance from float64, the rule of the ``inductor`` mode); on CUDA the steps at capture sizes
replay one graph per partition and size, with other prompts in a second round (a graph that read a moved buffer
or kept one step's values would show); no compile outside the mode is wrapped. How a partition's wrapper routes
each call is checked on every machine with a stand-in partition. The config's checks are in test_config.py, the
compile cache's refusal in test_compile_cache.py.
"""

from __future__ import annotations

import types

import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import DEVICES, assert_error_within_twice_eager, make_runner, small_llama_config, token_ids
from reference.compilation import compilation_counter, expect_counters
from reference.compilation.cuda_graph import inside_full_graph
from reference.compilation.compile_piece import partition_patches
from reference.compilation.inductor_passes import PARTITION_WRAPPERS_KEY
from reference.compilation.partition_graph import PartitionGraph, partition_wrappers
from reference.compilation.backend import PiecewiseBackend
from reference.config import CompilationConfig, ConfigError, mode_config
from reference.config.compilation import PARTITION_INDUCTOR_SETTINGS
from reference.forward_context import BatchDescriptor, ForwardContext, current_forward_context, set_forward_context

pytestmark = [pytest.mark.requires("inductor_graph_partition"), pytest.mark.inductor]


def _wrapper_slot():
    from torch._inductor.utils import _unstable_customized_partition_wrapper

    return _unstable_customized_partition_wrapper.wrapper


@pytest.mark.eager
@pytest.mark.inductor_full
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["inductor", "inductor_full"])
def test_partitioned_inductor_is_one_compile_and_at_most_twice_as_far_as_eager_from_float64(mode, device, impl):
    """One layer (Inductor's compiles take seconds on a CPU). Prompts of 24 tokens and decodes of 4 run at
    capture sizes: on CUDA the second round replays the graphs the first captured, the partitions' for every
    step under ``inductor``, for the prefills under ``inductor_full`` (its decodes replay one full graph, inside
    which the partitions record their kernels). A partition's inputs include buffers the attention between two
    partitions writes into: a replay that found one moved since its capture raises (address checks on)."""
    hf = small_llama_config(num_hidden_layers=1)
    runners = {
        "reference": make_runner(impl, "eager", hf, device=device, dtype=torch.float64),
        "eager": make_runner(impl, "eager", hf, device=device),
    }
    before = compilation_counter.snapshot()
    with expect_counters(num_graphs_seen=1, num_piecewise_graphs_seen=1, num_inductor_compiles=1):
        runners["partition"] = make_runner(  # on CUDA every replay checks its inputs are where they were at capture
            impl, mode, hf, device=device, use_inductor_graph_partition=True, max_cudagraph_capture_size=32,
            debug_cudagraph_addresses=True,
        )
        for runner in runners.values():
            runner.warm_up()
    assert _wrapper_slot() is None  # no later compile of the process is wrapped
    for round_, lengths in enumerate(([5, 7, 3, 9], [9, 3, 7, 5])):
        prompts = [token_ids(n, hf.vocab_size, seed=10 * round_ + i) for i, n in enumerate(lengths)]
        logits = prefill_and_decode(runners, prompts, num_decode=3, leader="reference")
        for reference, eager, ours in zip(logits["reference"], logits["eager"], logits["partition"]):
            assert_error_within_twice_eager(ours, eager, reference)
    after = compilation_counter.snapshot()
    names = ("num_cudagraph_captured", "num_cudagraph_replays", "num_full_cudagraph_replays")
    captured, replayed, full = (getattr(after, n) - getattr(before, n) for n in names)
    sizes = len(runners["partition"].piecewise_warm_up_sizes)  # captured at warm-up, largest first
    if device == "cpu":
        assert (captured, replayed, full) == (0, 0, 0)  # nothing is captured on a CPU
    elif mode == "inductor":  # the layer's partitions (before and after attention) in all 8 steps
        assert captured >= 2 * sizes and replayed >= 2 * 8 and full == 0, (captured, replayed, full)
    else:  # the partitions in the 2 prefills; the 6 decode steps in full graphs
        assert captured >= 2 * sizes and replayed >= 2 * 2 and full == 6, (captured, replayed, full)


class _StandIn:
    """A partition's calling convention: one list of inputs, emptied by the call."""

    def __init__(self):
        self.calls = []

    def __call__(self, args: list):
        self.calls.append(list(args))
        args.clear()
        return ("out",)


def _wrapped(**overrides) -> tuple[PartitionGraph, _StandIn]:
    stand_in = _StandIn()
    settings = dict(capture_sizes=(4, 8), num_warmups=1, pool=None, stream=None, debug_addresses=False)
    return PartitionGraph(stand_in, 0, **{**settings, **overrides}), stand_in


def _step(mode: str | None, size: int = 4) -> ForwardContext:
    return ForwardContext(cudagraph_runtime_mode=mode, batch_descriptor=BatchDescriptor(size, False))


@pytest.mark.parametrize(
    "context, size",
    [(None, None), ("NONE", 4), ("FULL", 4), ("PIECEWISE", 6)],
    ids=["outside-a-runner-step", "step-without-graphs", "full-graph-step", "size-not-captured"],
)
def test_a_partition_runs_as_compiled_where_no_graph_of_it_is_due(context, size):
    """Outside a step, in a step sent to no graph or to a full one, and at a size that is not captured, the
    partition runs on the list it is given; only the last is counted as a run without a graph."""
    wrapped, stand_in = _wrapped()
    args = [torch.ones(2)]
    with expect_counters(num_cudagraph_eager_runs=int(context == "PIECEWISE"), num_cudagraph_captured=0):
        if context is None:
            out = wrapped(args)
        else:
            with set_forward_context(_step(context, size)):
                out = wrapped(args)
    assert out == ("out",) and len(stand_in.calls) == 1 and args == []


def test_inside_a_full_graph_a_partition_records_its_kernels_into_it():
    wrapped, stand_in = _wrapped()
    with set_forward_context(_step("PIECEWISE")), inside_full_graph():
        with expect_counters(num_cudagraph_eager_runs=0, num_cudagraph_captured=0):
            wrapped([torch.ones(2)])
    assert len(stand_in.calls) == 1


def test_a_captured_size_runs_its_warm_ups_first():
    """Two warm-ups at size 8 run the partition, each counted; the capture (CUDA only) would come next."""
    wrapped, stand_in = _wrapped(num_warmups=2)
    with set_forward_context(_step("PIECEWISE", 8)), expect_counters(num_cudagraph_eager_runs=2):
        wrapped([torch.ones(2)])
        wrapped([torch.ones(2)])
    assert len(stand_in.calls) == 2 and wrapped.warm_ups.done == {8: 2}


def test_the_wrapper_slot_holds_what_it_held_after_the_block_even_when_it_raises():
    """Ours only while we compile; someone else's (set with torch's setter) is put back, not wiped."""
    from torch._inductor.utils import set_customized_partition_wrappers

    def wrap(fn, index):
        return fn

    with pytest.raises(RuntimeError, match="^inside$"):
        with partition_wrappers(wrap):
            assert _wrapper_slot() is not None
            raise RuntimeError("inside")
    assert _wrapper_slot() is None

    def theirs(fn, metadata):
        return fn

    set_customized_partition_wrappers(theirs)
    try:
        with partition_wrappers(None):
            assert _wrapper_slot() is None
        assert _wrapper_slot() is theirs
    finally:
        set_customized_partition_wrappers(None)


def test_a_wrapper_turns_inductors_graph_partition_on_for_its_block_alone():
    """A loaded artifact's partitions are wrapped only if ``graph_partition`` is on when it loads (torch reads
    the setting then): with ``TORCHINDUCTOR_GRAPH_PARTITION=0`` a compile-cache hit would capture nothing.
    (Inductor's config is patched with its own ``patch``: pytest's monkeypatch deletes the setting on undo.)"""
    from torch._inductor import config as inductor_config

    with inductor_config.patch(graph_partition=False):
        with partition_wrappers(lambda fn, index: fn):
            assert inductor_config.graph_partition is True
        with partition_wrappers(None):
            assert inductor_config.graph_partition is False
        assert inductor_config.graph_partition is False


def test_the_mode_sets_inductors_partition_and_a_pass_that_keys_the_wrapper():
    """Exactly these settings are what the config refuses to see set by ``inductor_compile_config``."""
    named = CompilationConfig(use_inductor_graph_partition=True, splitting_ops=["reference::attention"])
    assert partition_patches(named) == {
        "graph_partition": True, "custom_should_partition_ops": ["reference::attention"],
        "post_grad_custom_pre_pass": PARTITION_WRAPPERS_KEY,
    }  # fmt: skip
    assert tuple(partition_patches(named)) == PARTITION_INDUCTOR_SETTINGS
    assert partition_patches(CompilationConfig(use_inductor_graph_partition=True))["custom_should_partition_ops"] == []
    assert partition_patches(CompilationConfig()) == {}


def _norm_then_add(x, y):
    return (torch.nn.functional.rms_norm(x, (x.shape[-1],)) + y,)


@pytest.mark.requires("components")
def test_inductors_cache_keys_a_compile_with_partition_wrappers_apart_from_one_without(tmp_path, monkeypatch):
    """Inductor's FX-graph cache key leaves out whether a partition wrapper is installed, though the code
    depends on it (pytorch#165471): a compile to be captured per partition could be served a compile without
    partitions. The mode's pre-pass puts the wrapper into the key. Three compiles of one graph in an empty
    Inductor cache: unwrapped (a miss), unwrapped again (a hit: the cache is on), wrapped (must miss)."""
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    patches = partition_patches(CompilationConfig(use_inductor_graph_partition=True))
    gm = torch.fx.symbolic_trace(_norm_then_add)
    inputs = [torch.randn(4, 8), torch.randn(4, 8)]
    outcomes = []
    for wrap in (None, None, lambda fn, index: fn):
        hits, misses = counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]
        with partition_wrappers(wrap):
            compiled = torch._inductor.standalone_compile(
                gm, inputs, dynamic_shapes="from_example_inputs", options={"config_patches": patches}
            )
        hit = counters["inductor"]["fxgraph_cache_hit"] - hits
        outcomes.append("hit" if hit else "miss" if counters["inductor"]["fxgraph_cache_miss"] > misses else "?")
        torch.testing.assert_close(compiled(*inputs)[0], _norm_then_add(*inputs)[0])
    assert outcomes == ["miss", "hit", "miss"]


# rms_norm returns its result: between two partitions' graphs it would live at an address the next graph does
# not follow. Refused as the FX split refuses it (before Inductor compiles anything); without graphs it may run.
CUT_AT_A_RETURNING_OP = dict(custom_ops=["all"], splitting_ops=["reference::attention", "reference::rms_norm"],
                             use_inductor_graph_partition=True)  # fmt: skip


def test_an_op_inductor_cuts_at_must_write_into_buffers_under_piecewise_graphs(impl):
    runner = make_runner(impl, "inductor", small_llama_config(num_hidden_layers=1), **CUT_AT_A_RETURNING_OP)
    with pytest.raises(ConfigError) as err:
        runner.warm_up()
    assert str(err.value) == (
        "splitting_ops: 'reference::rms_norm' returns tensors; with use_inductor_graph_partition and piecewise graphs "
        "an op Inductor cuts at must write into buffers it is given (as reference::attention does), or use "
        "cudagraph_mode='none'"
    )


def test_without_graphs_inductor_may_cut_at_an_op_that_returns_tensors(impl):
    hf = small_llama_config(num_hidden_layers=1)
    make_runner(impl, "inductor", hf, cudagraph_mode="none", **CUT_AT_A_RETURNING_OP).warm_up()


def test_with_inductors_partition_the_fx_split_keeps_the_graph_one_piece(impl):
    """Inductor's partition cuts at the splitting ops; the FX split must not cut there too, or each partition
    would be a compile of its own (without the float64 run of the rule above: the mutation run's cheap check)."""
    hf = small_llama_config(num_hidden_layers=1)
    with expect_counters(num_graphs_seen=1, num_piecewise_graphs_seen=1, num_inductor_compiles=1):
        make_runner(impl, "inductor", hf, use_inductor_graph_partition=True, cudagraph_mode="none").warm_up()


def test_naming_an_op_the_graph_lacks_is_no_warning_where_inductor_still_cuts_at_attention(impl, recwarn):
    """With custom_ops none rms_norm is not in the graph: the FX split would be one piece (a warning), Inductor's
    partition still cuts at the tagged attention (none)."""
    hf = small_llama_config(num_hidden_layers=1)
    fields = dict(custom_ops=["none"], splitting_ops=["reference::rms_norm"], cudagraph_mode="none")
    make_runner(impl, "inductor", hf, use_inductor_graph_partition=True, **fields).warm_up()
    assert not [w for w in recwarn if "none of splitting_ops" in str(w.message)]


@pytest.mark.parametrize("mode", ["eager", "no_inductor", "inductor"])
def test_the_step_says_the_token_count_the_model_is_called_with_even_for_the_tracing_call(mode, impl):
    """A graph sized by the step (a partition's) must not take the 2-token tracing call of a 1-token step for
    size 1: every call's descriptor gives the number of tokens the model is called with."""
    runner = make_runner(impl, mode, small_llama_config(num_hidden_layers=1), cudagraph_capture_sizes=[1, 4])
    seen, compiled = [], runner.compiled

    class Spy:
        awaits_trace = property(lambda self: getattr(compiled, "awaits_trace", False))

        def __call__(self, input_ids, positions):
            seen.append((current_forward_context().batch_descriptor.num_tokens, input_ids.shape[0]))
            return compiled(input_ids, positions)

    runner.compiled = Spy()
    runner.step([[5]], [0], [0])  # the first call traces, with the one token padded to 2
    runner.step([[6], [7]], [1, 0], [0, 1])
    traced = mode != "eager"  # eager traces nothing and runs a 1-token step at 1 token
    assert seen[0][1] == (2 if traced else 1) and all(descriptor == tokens for descriptor, tokens in seen), seen


def test_the_cache_key_pass_says_whether_a_partition_wrapper_is_installed():
    """Its uuid is what Inductor's caches key on, and what a person reading a cache's key sees: it must say
    'installed' exactly while ``partition_wrappers`` holds a wrapper (two swapped answers would still key the
    two compiles apart, and say the opposite of the truth)."""
    assert PARTITION_WRAPPERS_KEY.uuid() == b"partition wrapper installed: False"
    with partition_wrappers(lambda fn, index: fn):
        assert PARTITION_WRAPPERS_KEY.uuid() == b"partition wrapper installed: True"
    with partition_wrappers(None):
        assert PARTITION_WRAPPERS_KEY.uuid() == b"partition wrapper installed: False"


class _FakeStream:
    """Stands in for ``torch.cuda.Stream`` on a machine without CUDA."""


@pytest.fixture
def fake_graph_resources(monkeypatch):
    """``torch.cuda``'s memory pool handle and stream made constructible without CUDA: the CPU can then check
    what the backend hands its graph wrappers on CUDA (the GPU rules of this file check that they capture)."""
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: ("pool",))
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)


def test_on_cuda_each_partition_is_wrapped_with_the_configs_capture_settings(fake_graph_resources):
    config = mode_config(
        "inductor", use_inductor_graph_partition=True, cudagraph_capture_sizes=[1, 2, 8], cudagraph_num_of_warmups=2,
        debug_cudagraph_addresses=True,
    )  # fmt: skip
    stale = object()
    backend = PiecewiseBackend(config, stale_outputs=stale)
    with backend.partition_graphs(on_cuda=True):
        wrap = _wrapper_slot()
        assert wrap is not None, "no partition wrapper on CUDA"
        first, second = (wrap(fn, types.SimpleNamespace(partition_index=i)) for i, fn in enumerate((min, max)))
    assert _wrapper_slot() is None
    for index, (graph, fn) in enumerate(((first, min), (second, max))):
        assert isinstance(graph, PartitionGraph)
        assert (graph.runnable, graph.index, graph.capture_sizes) == (fn, index, frozenset({1, 2, 8}))
        assert graph.warm_ups.num_warmups == 2 and graph.debug_addresses is True and graph.stale_outputs is stale
        assert graph.pool == ("pool",) and isinstance(graph.stream, _FakeStream)
    assert first.pool is second.pool and first.stream is second.stream  # one pool and stream for them all


@pytest.mark.parametrize(
    "overrides, on_cuda",
    [({}, False), ({"cudagraph_mode": "none"}, True), ({"use_inductor_graph_partition": False}, True)],
    ids=["cpu", "no-graphs", "fx-split"],
)
def test_partitions_get_no_graph_off_cuda_without_piecewise_graphs_or_partition(fake_graph_resources, overrides,
                                                                                 on_cuda):  # fmt: skip
    config = mode_config("inductor", **{"use_inductor_graph_partition": True, **overrides})
    with PiecewiseBackend(config).partition_graphs(on_cuda=on_cuda):
        assert _wrapper_slot() is None


@pytest.mark.parametrize(
    "partition, on_cuda, cudagraph_mode, pieces, partitions",
    [
        (False, True, "piecewise", True, False),  # the FX split's pieces have the graphs
        (True, True, "piecewise", False, True),  # Inductor's partitions have them
        (False, False, "piecewise", False, False),
        (True, False, "piecewise", False, False),
        (False, True, "none", False, False),
    ],
)
def test_either_the_pieces_or_the_partitions_get_graphs(fake_graph_resources, partition, on_cuda, cudagraph_mode,
                                                        pieces, partitions):  # fmt: skip
    config = mode_config("inductor", use_inductor_graph_partition=partition, cudagraph_mode=cudagraph_mode)
    backend = PiecewiseBackend(config)
    for settings, expected in ((backend._graph_settings(on_cuda), pieces),
                               (backend._graph_settings(on_cuda, partitions=True), partitions)):  # fmt: skip
        use_graphs, pool, stream = settings
        assert use_graphs is expected
        assert (pool, isinstance(stream, _FakeStream)) == ((("pool",), True) if expected else (None, False))


@pytest.mark.parametrize("use_graphs", [True, False])
def test_on_cuda_each_compiled_piece_is_wrapped_with_the_configs_capture_settings(use_graphs):
    """What ``PiecewiseBackend`` hands a piece's CUDA-graph wrapper (the FX split's counterpart of the partition
    rule above): checked on a CPU by calling the install step's wrapper with graphs asked for."""
    from reference.compilation.cuda_graph import CUDAGraphPiece

    config = mode_config(
        "no_inductor", cudagraph_capture_sizes=[1, 4], cudagraph_num_of_warmups=3, debug_cudagraph_addresses=True
    )
    stale, pool, stream = object(), ("pool",), _FakeStream()
    backend = PiecewiseBackend(config, stale_outputs=stale)
    wrapped = backend._wrapped("submod_2", min, (0, 1), use_graphs, pool, stream)
    if not use_graphs:
        assert wrapped is min
        return
    assert isinstance(wrapped, CUDAGraphPiece)
    assert (wrapped.name, wrapped.runnable, wrapped.size_args) == ("submod_2", min, (0, 1))
    assert wrapped.capture_sizes == frozenset({1, 4}) and wrapped.warm_ups.num_warmups == 3
    assert wrapped.pool is pool and wrapped.stream is stream
    assert wrapped.debug_addresses is True and wrapped.stale_outputs is stale
