"""The reference's compiled model and graph split below what the conformance rules compare
(reference.compilation.capture, reference.compilation.split): how a call is checked against the traced one,
the private forward each compiled model gets, the one warning without CUDA, the pieces' names and order.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch

from conformance.helpers import points_at
from reference.compilation import compile_model
from reference.compilation.split import split_graph
from reference.config import CompilationConfig, ConfigError
from reference.models.silly import SillyModel, expected_output

pytestmark = pytest.mark.requires("components")

aten = torch.ops.aten


def _config(**fields) -> CompilationConfig:
    return CompilationConfig(**{"level": 2, "use_inductor": False, "cudagraph_mode": "none", **fields})


class _Scaled(torch.nn.Module):
    def forward(self, x, scale):
        return x * scale


def test_a_non_tensor_argument_of_another_type_than_the_traced_one_is_refused():
    """Dynamo bakes a Python number into the graph it traces; with its guards dropped, a call with a number
    of another type would run the traced one silently."""
    compiled = compile_model(_Scaled(), _config())
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x, 2), x * 2)
    with pytest.raises(TypeError) as err:
        compiled(x, 2.5)
    traced = [(torch.float32, torch.device("cpu"), (8,)), int]
    assert str(err.value) == (
        "compiled model called with arguments of another dtype, device or non-token shape than the first call: "
        f"got {[traced[0], float]}, traced {traced}; the graph was traced once, for the first kind, and cannot "
        "serve others"
    )


def test_a_one_token_first_call_is_refused_in_full():
    compiled = compile_model(_Scaled(), _config())
    with pytest.raises(ValueError) as err:
        compiled(torch.randn(1, 8), 2)
    assert str(err.value) == (
        "the first call traces the model and needs at least 2 tokens in argument 0 (got shape (1, 8)): Dynamo "
        "specializes sizes 0 and 1, which would fix the graph to that size; make the first call with a larger batch"
    )


def test_level_one_checks_nothing_and_recompiles_for_another_dtype():
    """Level 1 is Dynamo as it is: its own guards decide, and the traced-once checks are not its business."""
    compiled = compile_model(_Scaled(), _config(level=1))
    x = torch.randn(4, 8)
    compiled(x, 2)
    torch.testing.assert_close(compiled(x.double(), 2), x.double() * 2)


def _closure_model(factor: float) -> torch.nn.Module:
    class WithDefaultsAndClosure(torch.nn.Module):
        def forward(self, x, scale=3.0):
            return x * scale * factor  # factor: a free variable, held in forward's closure

    return WithDefaultsAndClosure()


@pytest.mark.parametrize("level", [1, 2])
def test_a_forward_with_defaults_and_a_closure_compiles_like_the_original(level):
    """Each compiled model gets a private copy of forward's code (capture._own_forward); the copy must keep
    the function's defaults and closure."""
    model = _closure_model(0.5)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compile_model(model, _config(level=level))(x), model(x))


@pytest.mark.no_inductor
def test_graphs_asked_for_without_cuda_warn_once_at_the_callers_line():
    compiled = compile_model(_Scaled(), _config(cudagraph_mode="piecewise", level=3))
    x = torch.randn(4, 8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(x, 2)
        compiled(x, 2)
    ours = [w for w in caught if "CUDA graphs asked for" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    assert points_at(ours[0], __file__)  # the line that called the model, not the library's
    assert str(ours[0].message) == (
        "CUDA graphs asked for (cudagraph_mode='piecewise') but the model is not on a CUDA device: CUDA graphs "
        "exist only on CUDA, so the model runs (compiled, if its level says so) without graphs"
    )


def test_pieces_are_named_and_numbered_in_execution_order_around_each_splitting_op():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(aten.mul.Tensor, (x, 2.0))
    b = graph.call_function(aten.relu.default, (a,))  # a splitting op, by name below
    c = graph.call_function(aten.add.Tensor, (b, 1.0))
    d = graph.call_function(aten.relu.default, (c,))
    graph.output(graph.call_function(aten.sin.default, (d,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    split, pieces = split_graph(gm, ("aten::relu",))
    assert [(p.name, p.index, p.is_splitting_op) for p in pieces] == [
        ("submod_0", 0, False), ("submod_1", 1, True), ("submod_2", 2, False), ("submod_3", 3, True),
        ("submod_4", 4, False),
    ]  # fmt: skip
    assert all(getattr(split, p.name) is p.module for p in pieces)
    x = torch.randn(5)
    torch.testing.assert_close(split(x), gm(x))


# ---------------------------------------------------------------------- the backend's trace, split and words
@torch.library.custom_op("test_compiled_model::unsafe_copy", mutates_args=("out",), tags=(torch.Tag.cudagraph_unsafe,))
def _unsafe_copy(x: torch.Tensor, out: torch.Tensor) -> None:
    """An op tagged like attention: the default splitting_ops (None) splits at it."""
    out.copy_(x)


class _Tagged(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _unsafe_copy(x * 2, out)
        return out + 1


@pytest.mark.parametrize("level, pieces", [(2, 1), pytest.param(3, 3, marks=pytest.mark.no_inductor)])
def test_only_level_three_splits_at_the_default_splitting_ops(level, pieces):
    compiled = compile_model(_Tagged(), _config(level=level))
    assert compiled.backend.pieces == []  # nothing traced yet
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    assert len(compiled.backend.pieces) == pieces


@pytest.mark.no_inductor
@pytest.mark.parametrize(
    "splitting_ops, named", [(None, "ops tagged cudagraph_unsafe"), (["reference::attention"], "['reference::attention']")]
)
def test_splitting_ops_that_the_graph_never_calls_are_named_in_the_warning(splitting_ops, named):
    compiled = compile_model(_Scaled(), _config(level=3, splitting_ops=splitting_ops))
    with pytest.warns(RuntimeWarning) as caught:
        compiled(torch.randn(4, 8), 2)
    ours = [w for w in caught if "none of splitting_ops" in str(w.message)]
    assert [str(w.message) for w in ours] == [
        f"none of splitting_ops ({named}) is called in the traced graph, so the model is one piece (attention "
        "included, if it is in the graph); splitting ops must be torch.library custom ops, which Dynamo keeps as "
        "graph nodes"
    ]
    # the backend runs inside Dynamo's compile of the forward: the warning still names the line that called it
    assert points_at(ours[0], __file__), ours[0].filename


@pytest.mark.no_inductor
def test_a_tagged_op_the_graph_calls_does_not_stand_in_for_named_splitting_ops_it_never_calls():
    """Only Inductor's graph partition cuts at every tagged op whatever splitting_ops names; without it, naming
    ops the graph lacks leaves the model one piece, and that is the warning even though a tagged op is called."""
    compiled = compile_model(_Tagged(), _config(level=3, splitting_ops=["reference::attention"]))
    with pytest.warns(RuntimeWarning, match=re.escape("none of splitting_ops (['reference::attention'])")):
        compiled(torch.randn(4, 8))
    assert len(compiled.backend.pieces) == 1


@pytest.mark.no_inductor
def test_a_tagged_op_left_in_a_captured_piece_is_one_error_without_the_one_piece_warning():
    """Naming only ops the graph lacks, with piecewise graphs asked for, leaves attention (a tagged op) inside
    the one piece: the refusal is the whole message. The warning that the model is one piece would add a
    second, contradicting story (it runs, attention captured) to an error that says it will not run."""
    config = _config(level=3, splitting_ops=["reference::attention"], cudagraph_mode="piecewise")
    compiled = compile_model(_Tagged(), config)
    with warnings.catch_warnings(record=True) as caught, pytest.raises(ConfigError, match="unsafe_copy"):
        warnings.simplefilter("always")
        compiled(torch.randn(4, 8))
    assert [str(w.message) for w in caught if "splitting_ops" in str(w.message)] == []


@torch.library.custom_op("test_compiled_model::scale_into", mutates_args=("out",))
def _scale_into(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Writes 2x into ``out`` and also returns a tensor, which the model below never reads."""
    out.copy_(x * 2)
    return x.sum()


@_scale_into.register_fake
def _(x, out):
    return x.new_empty(())


class _WritesAndReturns(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        _scale_into(x + 1, out)  # its returned tensor is dropped
        return out - 1


@pytest.mark.no_inductor
def test_a_splitting_op_whose_returned_tensor_nothing_reads_is_accepted_by_the_fx_split():
    """The FX split asks only that a splitting op's piece hand no tensor on (the tensor it returns is allocated
    outside the graph pool, where a later graph would not follow it); a return nothing reads is dropped with
    its piece. Inductor's partition asks more (every op it cuts at returns nothing: it cannot see which returns
    are read), so its check must not run for the FX split."""
    config = _config(level=3, splitting_ops=["test_compiled_model::scale_into"], cudagraph_mode="piecewise")
    compiled = compile_model(_WritesAndReturns(), config)
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), (x + 1) * 2 - 1)
    assert len(compiled.backend.pieces) == 3


def test_a_second_trace_is_refused_in_full():
    compiled = compile_model(_Scaled(), _config())
    compiled(torch.randn(4, 8), 2)
    with pytest.raises(RuntimeError) as err:
        compiled.backend(torch.fx.symbolic_trace(_Scaled()), [])  # what Dynamo does after torch._dynamo.reset()
    assert str(err.value) == (
        "this model was traced a second time, but levels 2 and 3 trace once (the token dimension is marked dynamic "
        "only on the first call); this happens after torch._dynamo.reset() - build a new compiled model "
        "(compile_model / ModelRunner) after resetting Dynamo"
    )


def test_the_backend_refuses_level_zero_in_full():
    from reference.compilation.backend import PiecewiseBackend
    from reference.config import ConfigError

    with pytest.raises(ConfigError) as err:
        PiecewiseBackend(CompilationConfig(level=0))
    assert str(err.value) == "level=0 means no compilation; PiecewiseBackend needs level 1, 2 or 3"


class _GraphBreak(torch.nn.Module):
    def forward(self, x):
        torch._dynamo.graph_break()
        return x + 1


@pytest.mark.parametrize("level", [1, 2, pytest.param(3, marks=pytest.mark.no_inductor)])
def test_a_graph_break_is_an_error_at_every_compiled_level(level):
    """One whole graph (fullgraph): a break would split it where no splitting op is, silently."""
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compile_model(_GraphBreak(), _config(level=level))(torch.randn(4, 8))


def test_the_per_call_check_can_be_turned_off_for_callers_that_feed_their_own_buffers():
    assert compile_model(_Scaled(), _config(), check_inputs=False).check_inputs is False
    assert compile_model(_Scaled(), _config()).check_inputs is True


@pytest.mark.no_inductor
def test_a_first_call_that_raises_leaves_the_next_call_a_first_call(monkeypatch):
    """A tracing call that fails before the trace (here the compile cache's switch, set to a value it refuses)
    must not leave the model half-started: the next call marks the token dimension dynamic, looks the cache
    up and calls ``before_trace`` again. A retry that skipped them would trace the token count of its call as a
    constant, and with Dynamo's guards dropped run that graph for every other count."""
    from reference.compilation import cache_key
    from reference.config import ConfigError

    model = SillyModel()
    compiled = compile_model(model, CompilationConfig(level=3, use_inductor=False, cudagraph_mode="none"))
    traces = []
    monkeypatch.setenv(cache_key.DISABLE_ENV, "yes")
    compiled.before_trace = lambda: traces.append("first")
    with pytest.raises(ConfigError, match=cache_key.DISABLE_ENV):
        compiled(torch.randn(4, 8))
    monkeypatch.setenv(cache_key.DISABLE_ENV, "1")
    compiled.before_trace = lambda: traces.append("retry")
    assert compiled.awaits_trace
    for size in (4, 8, 3):
        x = torch.randn(size, 8)
        torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)
    assert traces == ["retry"]
