"""The reference backend's per-piece decisions (reference.compilation.backend), on pieces built by hand: which
splitting-op pieces skip the dispatcher, which pieces are refused for capture and in what words, and what
makes a graph count as on CUDA or a piece argument as a token count.

These are the reference's own choices, below what the conformance rules can see: the rules compare outputs,
and a splitting-op piece run through the dispatcher gives the same output as its direct call.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import reference.ops  # noqa: F401  (registers the reference:: ops)
from conformance.helpers import DEVICES
from reference.compilation import backend
from reference.compilation.split import Piece
from reference.config import ConfigError

pytestmark = pytest.mark.requires("components")

aten = torch.ops.aten


def _piece(build, name: str = "submod_1") -> Piece:
    """A piece whose graph ``build(graph, x, out)`` fills in after two placeholders x and out."""
    graph = torch.fx.Graph()
    x, out = graph.placeholder("x"), graph.placeholder("out")
    build(graph, x, out)
    return Piece(name, 1, True, torch.fx.GraphModule(torch.nn.Module(), graph))


def _one_call(graph, x, out):
    graph.call_function(aten.add_.Tensor, (out, x))
    graph.output(())


# ---------------------------------------------------------------------- direct calls of splitting ops
def test_a_one_call_piece_with_a_registered_function_calls_it_with_the_pieces_arguments_in_place(monkeypatch):
    calls = []
    monkeypatch.setattr(backend, "direct_call", lambda name: (lambda *a: calls.append((name, a))))

    def build(graph, x, out):
        graph.call_function(aten.add_.Tensor, (out, x, 2.5))  # placeholders and a constant, positional
        graph.output(())

    direct = backend._direct_splitting_call(_piece(build))
    assert direct("X", "OUT") == () and calls == [("aten::add_", ("OUT", "X", 2.5))]


def _keyword(graph, x, out):
    graph.call_function(aten.add_.Tensor, (out, x), {"alpha": 2})
    graph.output(())


def _two_calls(graph, x, out):
    graph.call_function(aten.add_.Tensor, (out, x))
    graph.call_function(aten.add_.Tensor, (out, x))
    graph.output(())


def _returns(graph, x, out):
    graph.output(graph.call_function(aten.add.Tensor, (out, x)))


def _no_call(graph, x, out):
    graph.output(())


@pytest.mark.parametrize("build", [_keyword, _two_calls, _returns, _no_call])
def test_any_other_piece_keeps_the_dispatcher(monkeypatch, build):
    """Keywords, several calls, a returned tensor or no call at all: the piece stays as Dynamo made it."""
    monkeypatch.setattr(backend, "direct_call", lambda name: (lambda *a: None))
    assert backend._direct_splitting_call(_piece(build)) is None


def test_an_op_without_a_registered_function_keeps_the_dispatcher(monkeypatch):
    names = []
    monkeypatch.setattr(backend, "direct_call", lambda name: names.append(name))  # registered: nothing
    assert backend._direct_splitting_call(_piece(_one_call)) is None and names == ["aten::add_"]


# ---------------------------------------------------------------------- pieces refused for capture
def test_a_splitting_op_that_returns_tensors_is_refused_in_full():
    with pytest.raises(ConfigError) as err:
        backend._check_writes_into_buffers(_piece(_returns))
    assert str(err.value) == (
        "splitting_ops: 'aten::add' returns tensors; with cudagraph_mode='piecewise' a splitting op must write "
        "into buffers the previous piece allocated (as reference::attention does), or use cudagraph_mode='none'"
    )
    backend._check_writes_into_buffers(_piece(_one_call))  # writes into out: accepted


def test_an_op_tagged_cudagraph_unsafe_inside_a_piece_to_capture_is_refused_in_full():
    attention = torch.ops.reference.attention.default
    assert torch.Tag.cudagraph_unsafe in attention.tags

    def build(graph, x, out):
        graph.call_function(aten.add_.Tensor, (out, x))  # untagged ops before it are fine
        graph.call_function(attention, tuple(graph.placeholder(f"a{i}") for i in range(len(attention._schema.arguments))))
        graph.output(())

    with pytest.raises(ConfigError) as err:
        backend._check_no_unsafe_op_captured(_piece(build, name="submod_4"))
    assert str(err.value) == (
        "splitting_ops: 'reference::attention' (tagged torch.Tag.cudagraph_unsafe: it reads per-step metadata) "
        "would be captured inside CUDA-graph piece submod_4; add it to splitting_ops, leave splitting_ops at its "
        "default (None), or use cudagraph_mode='none'"
    )
    backend._check_no_unsafe_op_captured(_piece(_one_call))  # untagged only: accepted


# ---------------------------------------------------------------------- device and token-count arguments
def _graph_module(example_values: list) -> torch.fx.GraphModule:
    graph = torch.fx.Graph()
    for i, value in enumerate(example_values):
        graph.placeholder(f"arg{i}").meta["example_value"] = value
    graph.output(())
    return torch.fx.GraphModule(torch.nn.Module(), graph)


@pytest.mark.parametrize("device, expected", [("cuda", True), ("cpu", False)])
def test_a_graph_is_on_cuda_when_one_of_its_inputs_dynamo_recorded_is(device, expected):
    with FakeTensorMode():  # fake CUDA tensors need no GPU
        values = [3, torch.empty(2, 4), torch.empty(2, device=device)]
    assert backend._on_cuda(_graph_module(values)) is expected


def test_a_pieces_token_count_arguments_are_its_symbolic_ints():
    token_count = ShapeEnv().create_unbacked_symint()
    with FakeTensorMode():
        values = [torch.empty(2, 4), token_count, 7, token_count]
    piece = Piece("submod_0", 0, False, _graph_module(values))
    assert backend._size_args(piece) == (1, 3)


@pytest.mark.parametrize("device", DEVICES)
def test_a_static_compiles_inputs_take_the_size_in_every_shape_and_stride_and_keep_dtype_and_device(device):
    """``compile_sizes``' example inputs (:func:`~reference.compilation.compile_piece.inputs_at`): a [4, T]
    tensor's row stride is the token count too, and a SymInt input becomes the count itself; the inputs are real
    tensors on the recorded device."""
    from reference.compilation.compile_piece import inputs_at

    token_count = ShapeEnv().create_unbacked_symint()
    with FakeTensorMode(shape_env=token_count.node.shape_env):
        values = [torch.empty(4, token_count, dtype=torch.float64, device=device), token_count,
                  torch.empty(3, 2, dtype=torch.int32)]  # fmt: skip
    wide, size, fixed = inputs_at(_graph_module(values), 6)
    assert (wide.shape, wide.stride(), wide.dtype, wide.device.type) == ((4, 6), (6, 1), torch.float64, device)
    assert size == 6 and (fixed.shape, fixed.stride(), fixed.dtype) == ((3, 2), (2, 1), torch.int32)


@torch.library.custom_op("test_backend_pieces::unsafe_scale", mutates_args=(), tags=(torch.Tag.cudagraph_unsafe,))
def _unsafe_scale(x: torch.Tensor) -> torch.Tensor:
    """An op Inductor's partition cuts at by its tag alone, which returns its result."""
    return 2 * x


@_unsafe_scale.register_fake
def _(x):
    return torch.empty_like(x)


@pytest.mark.parametrize("target", ["packet", "overload"])
def test_inductors_partition_refuses_a_cut_at_a_tagged_op_that_returns_tensors_though_unnamed(target):
    """Inductor's partition cuts at every op tagged cudagraph_unsafe, named in splitting_ops or not: such an
    op that returns a tensor is refused as a named one is, whether the graph calls it as Dynamo records it
    (the packet) or as an overload; an untagged unnamed op that returns a tensor is no cut and passes."""
    op = torch.ops.test_backend_pieces.unsafe_scale
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    graph.output(graph.call_function(op if target == "packet" else op.default, (x,)))
    gm = torch.fx.GraphModule(torch.nn.Module(), graph)
    with pytest.raises(ConfigError, match=r"^splitting_ops: 'test_backend_pieces::unsafe_scale' returns tensors"):
        backend._check_partition_cuts_write_into_buffers(gm, ("reference::attention",))
    untagged = torch.fx.Graph()
    y = untagged.placeholder("y")
    untagged.output(untagged.call_function(aten.add.Tensor, (y, y)))
    gm = torch.fx.GraphModule(torch.nn.Module(), untagged)
    backend._check_partition_cuts_write_into_buffers(gm, ("reference::attention",))


def test_every_compiled_piece_is_installed_after_a_splitting_op_without_a_direct_call():
    """A splitting op with no registered direct function stays a piece of its own, called through the dispatcher;
    the compiled pieces after it (here, after two of them) are installed all the same."""
    from reference.compilation.backend import PiecewiseBackend
    from reference.config import CompilationConfig

    def f(x):
        y = torch.ops.test_backend_pieces.unsafe_scale(x * 2)
        return torch.ops.test_backend_pieces.unsafe_scale(y + 1) - 3

    traced = []
    torch.compile(f, backend=lambda gm, inputs: traced.append((gm, inputs)) or gm, fullgraph=True)(torch.randn(4))
    ((gm, inputs),) = traced
    config = CompilationConfig(level=3, use_inductor=False, cudagraph_mode="none",
                               splitting_ops=["test_backend_pieces::unsafe_scale"])  # fmt: skip
    backend = PiecewiseBackend(config)
    split = backend(gm, inputs)
    compiled = [p.name for p in backend.pieces if not p.is_splitting_op]
    assert len(compiled) == 3 and all(name in split.__dict__ for name in compiled), (compiled, list(split.__dict__))
    x = torch.randn(4)
    torch.testing.assert_close(split(*[x if isinstance(i, torch.Tensor) else i for i in inputs]), (f(x),))


# an overload's name has one dot; past it (a typo's second dot) the op is still the name before the first
@pytest.mark.parametrize(
    "name", ["reference::attention.default", "reference::attention.out", "reference::attention.a.b"]
)
def test_an_overload_in_splitting_ops_is_refused_with_the_ops_own_name(name):
    """vLLM's users name ops, but torch prints overloads (``reference::attention.default``), and that name was
    refused as "not a registered torch.library op" (a new user's try): the op is registered, and a split
    matches every overload of a named op."""
    with pytest.raises(ConfigError) as err:
        backend.check_splitting_ops_exist((name,))
    assert str(err.value) == (
        f"splitting_ops: {name!r} names an overload; name the op, 'reference::attention', whose every overload "
        "the graph is cut at"
    )
