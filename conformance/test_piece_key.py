"""Identical pieces compile once (:mod:`reference.compilation.piece_key`), and only identical ones.

The 32 layers of an 8B Llama split at attention give 31 middle pieces that differ only in names; with Inductor the
backend compiles one of them and the others take its compile, and the compile cache stores and loads it once.
Sharing a compile between pieces that are *not* one program is silent corruption: a layer would run another
layer's constants or another shape's code. The rules: pieces that differ only in names share a key, pieces that
differ in anything a compile reads (a literal, an op, an input's shape, stride or dtype) do not; with Inductor,
the backend compiles once per key, every piece still computes its own layer, and sharing changes no bit of the
output; a warm start loads one artifact per compile and matches the cold start bitwise.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conformance.helpers import DEVICES, build_llama, small_llama_config
from reference.compilation import backend as backend_module
from reference.compilation import cache_key, compilation_counter, compile_model
from reference.compilation.piece_key import piece_key
from reference.config import CompilationConfig, mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, silly_attention

pytestmark = pytest.mark.requires("components")


class Layers(nn.Module):
    """``forward(x [T, W]) -> [T, W]``: per layer ``x = op(x @ weight + bias, scale) + 1``, then the silly
    attention (``3x``); then ``2x``. Each layer's spec: ``scale`` (a Python number, a literal of the graph),
    ``op`` (``'mul'`` or ``'add'``), ``transposed`` (the weight stored as the transpose of a contiguous tensor:
    other strides), the bias's ``bias_shape`` (``(W,)`` or ``(1, W)``, the same broadcast) and ``bias_dtype``
    (read through ``.float()`` either way). Only what a spec names differs between two layers' pieces."""

    def __init__(self, specs: list[dict], width: int = 8):
        super().__init__()
        self.specs = specs
        generator = torch.Generator().manual_seed(0)
        weights, biases = [], []
        for spec in specs:
            weight = torch.randn(width, width, generator=generator) / width**0.5
            weights.append(weight.t().contiguous().t() if spec.get("transposed") else weight)
            bias = torch.randn(spec.get("bias_shape", (width,)), generator=generator)
            biases.append(bias.to(spec.get("bias_dtype", torch.float32)))
        self.weights = nn.ParameterList([nn.Parameter(w, requires_grad=False) for w in weights])
        self.biases = nn.ParameterList([nn.Parameter(b, requires_grad=False) for b in biases])

    @staticmethod
    def _layer(spec: dict, x, weight, bias):
        y = x @ weight + bias
        return (y * spec["scale"] if spec.get("op", "mul") == "mul" else y + spec["scale"]) + 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for spec, weight, bias in zip(self.specs, self.weights, self.biases):
            x = self._layer(spec, x, weight, bias.float())
            out = torch.empty_like(x)
            silly_attention(x, x, x, out)
            x = out
        return x * 2

    def expected(self, x: torch.Tensor) -> torch.Tensor:
        """The same arithmetic without compiling, in float64 (to check that each piece ran its own layer)."""
        x = x.double()
        for spec, weight, bias in zip(self.specs, self.weights, self.biases):
            x = 3 * self._layer(spec, x, weight.double(), bias.double())
        return x * 2


def _config(use_inductor: bool, **fields) -> CompilationConfig:
    return CompilationConfig(
        level=3, use_inductor=use_inductor, splitting_ops=list(SILLY_SPLITTING_OPS), cudagraph_mode="none", **fields
    )


def _pieces_keys(specs: list[dict]) -> list:
    """The key of every compiled piece of ``Layers(specs)`` in order: one per layer, then the output's."""
    compiled = compile_model(Layers(specs), _config(use_inductor=False))
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    return [piece_key(p.module) for p in compiled.backend.pieces if not p.is_splitting_op]


SAME = {"scale": 2.0}
DIFFERENT = {
    "a literal": {"scale": 3.0},
    "the sign of a zero literal": {"scale": -0.0},  # beside {"scale": 0.0}, which equals it in Python
    "an int literal for a float one": {"scale": 2},
    "an op": {"scale": 2.0, "op": "add"},
    "an input's shape": {"scale": 2.0, "bias_shape": (1, 8)},
    "an input's dtype": {"scale": 2.0, "bias_dtype": torch.float64},
    "an input's strides": {"scale": 2.0, "transposed": True},
}


@pytest.mark.no_inductor
def test_pieces_that_differ_only_in_names_share_a_key():
    keys = _pieces_keys([SAME, SAME, SAME])
    assert None not in keys
    assert keys[0] == keys[1] == keys[2], "identical layers' pieces, their inputs named after different layers"
    assert keys[3] != keys[0]


@pytest.mark.no_inductor
@pytest.mark.parametrize("what", DIFFERENT)
def test_pieces_that_differ_in_what_a_compile_reads_do_not_share_a_key(what):
    base = {"scale": 0.0} if what == "the sign of a zero literal" else SAME
    keys = _pieces_keys([base, DIFFERENT[what], base])
    assert None not in keys
    assert keys[0] == keys[2] and keys[1] != keys[0], f"a piece that differs in {what} shares a key"


class AliasedInputs(nn.Module):
    """``forward(x [T, 8])``: per layer ``h = x @ w + 1``, then ``r``, either ``h * 1`` or a view of the attention's
    output buffer (``aliased``), the attention writes the buffer, ``r`` is doubled in place and added to it.
    The piece after an aliased layer takes two inputs that share one storage, where the same ops after another
    layer take two that do not (a compile for the second would double the buffer's values once, not twice)."""

    def __init__(self, aliased: list[bool]):
        super().__init__()
        self.aliased = aliased
        self.weights = nn.ParameterList([nn.Parameter(torch.randn(8, 8), requires_grad=False) for _ in aliased])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for aliased, weight in zip(self.aliased, self.weights):
            h = x @ weight + 1
            out = torch.empty_like(h)
            r = out.view(-1, 8) if aliased else h * 1
            silly_attention(h, h, h, out)
            r.mul_(2)
            x = out + r
        return x * 2


@pytest.mark.no_inductor
def test_pieces_whose_inputs_alias_differently_do_not_share_a_key():
    """Layers 1 and 4 both end as ``h * 1``: the pieces after layers 0 and 3 run the same ops, on separate
    tensors after layer 0 and on a buffer and its view after layer 3 (found by a review: shared, they gave
    wrong values without a word)."""
    compiled = compile_model(AliasedInputs([False, False, True, True, False]), _config(use_inductor=False))
    with torch.no_grad():
        compiled(torch.randn(4, 8))
    keys = [piece_key(p.module) for p in compiled.backend.pieces if not p.is_splitting_op]
    assert None not in keys
    assert keys[1] != keys[4], "a piece whose inputs share a storage took the key of one whose inputs do not"


def test_a_piece_with_state_of_its_own_has_no_key():
    """A ``get_attr`` reads a tensor the piece holds, which the key cannot see: no other piece may take its
    compile. Built by hand (Dynamo lifts every parameter to an input), its input described as Dynamo would."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(4, 8)
    graph.output(graph.call_function(torch.add, (x, graph.get_attr("constant"))))
    owner = nn.Module()
    owner.register_buffer("constant", torch.ones(8))
    assert piece_key(torch.fx.GraphModule(owner, graph)) is None


def _use(*args, **kwargs):
    """A call target for hand-built pieces: the key compares its arguments, never runs it."""


def _piece(inputs: list, build, meta_key: str = "example_value") -> torch.fx.GraphModule:
    """A piece whose placeholders carry ``inputs`` as example values under ``meta_key``; ``build(graph, nodes)``
    returns what it outputs."""
    graph = torch.fx.Graph()
    nodes = []
    for i, value in enumerate(inputs):
        node = graph.placeholder(f"in_{i}")
        node.meta[meta_key] = value
        nodes.append(node)
    graph.output(build(graph, nodes))
    return torch.fx.GraphModule(nn.Module(), graph)


def _call(*args, **kwargs):
    """``build`` for :func:`_piece`: one call of ``_use``, each int ``n`` among the arguments (also inside a
    slice, tuple, list or dict) standing for input node ``n`` where it is wrapped as ``('in', n)``."""

    def node_or_value(value, nodes):
        if isinstance(value, tuple) and value[:1] == ("in",):
            return nodes[value[1]]
        if isinstance(value, slice):
            return slice(*(node_or_value(v, nodes) for v in (value.start, value.stop, value.step)))
        if isinstance(value, (tuple, list)):
            return type(value)(node_or_value(v, nodes) for v in value)
        if isinstance(value, dict):
            return {k: node_or_value(v, nodes) for k, v in value.items()}
        return value

    return lambda graph, nodes: graph.call_function(
        _use, node_or_value(args, nodes), {k: node_or_value(v, nodes) for k, v in kwargs.items()}
    )


X, Y, Z = ("in", 0), ("in", 1), ("in", 2)  # three inputs of one shape, dtype and strides, separate storages
DIFFERENT_ARGUMENTS = {
    "1 and True": ((X, 1), (X, True)),
    "1 and 1.0": ((X, 1), (X, 1.0)),
    "0.0 and -0.0": ((X, 0.0), (X, -0.0)),
    "None and 'None'": ((X, None), (X, "None")),
    "two dtypes": ((X, torch.float32), (X, torch.float16)),
    "a tuple and a list": ((X, (1, 2)), (X, [1, 2])),
    "two slices": ((X, slice(1, 2)), (X, slice(1, 3))),
    "a slice and a tuple": ((X, slice(1, 2, None)), (X, (1, 2, None))),
    "slices of two nodes": ((X, slice(Y, None)), (X, slice(Z, None))),
    "two dict values": ((X, {"a": 1}), (X, {"a": 2})),
    "two dict keys": ((X, {"a": 1}), (X, {"b": 1})),
    "dicts of two nodes": ((X, {"a": Y}), (X, {"a": Z})),
    "two nodes' order": ((X, Y), (Y, X)),
}


@pytest.mark.parametrize("first, second", DIFFERENT_ARGUMENTS.values(), ids=DIFFERENT_ARGUMENTS)
def test_arguments_are_compared_by_value_and_kind_and_nodes_by_position(first, second):
    """Each part of an argument a compile reads: a literal's value and type (1, 1.0 and True are equal in Python
    and hash alike), a container's kind, a slice's bounds, a dict's keys and values, and which input a node is,
    inside any of them. Equal arguments give equal keys."""
    inputs = [torch.empty(4, 8) for _ in range(3)]
    keys = [piece_key(_piece(inputs, _call(*args))) for args in (first, first, second)]
    assert None not in keys
    assert keys[0] == keys[1], "one piece built twice took two keys"
    assert keys[0] != keys[2], "pieces that differ in an argument shared a key"


def test_keyword_arguments_count_as_positional_ones_do():
    inputs = [torch.empty(4, 8) for _ in range(3)]
    keys = [piece_key(_piece(inputs, _call(X, **kwargs))) for kwargs in ({"k": 1}, {"k": 2}, {"k": Y}, {"k": Z})]
    assert None not in keys and len(set(keys)) == 4


def test_inputs_differ_by_storage_offset_integer_value_and_which_input_they_alias():
    """A view's offset into its storage, an integer input's value, and which earlier input a tensor shares
    a storage with (inputs 1 and 2 sharing one is not inputs 0 and 2 sharing one, nor all three separate)."""
    base = torch.empty(9, 8)
    at_0, at_1 = base[:8], base[1:]  # one shape and stride, offsets 0 and 8
    assert piece_key(_piece([at_0], _call(X))) != piece_key(_piece([at_1], _call(X)))
    assert piece_key(_piece([3], _call(X))) != piece_key(_piece([4], _call(X)))
    a, b, c = (torch.empty(4, 8) for _ in range(3))
    patterns = {
        "separate": [a, b, c],
        "1 and 2 share": [a, b, b.view(4, 8)],
        "0 and 2 share": [a, b, a.view(4, 8)],
        "0 and 1 share": [a, a.view(4, 8), c],
    }
    keys = {name: piece_key(_piece(inputs, _call(X, Y, Z))) for name, inputs in patterns.items()}
    assert None not in keys.values() and len(set(keys.values())) == len(patterns), keys


def test_an_input_described_under_val_has_a_key():
    """After some passes a placeholder carries its example value under ``meta['val']`` only: it is as
    comparable as under Dynamo's ``example_value``."""
    keys = [piece_key(_piece([torch.empty(*shape)], _call(X), meta_key="val")) for shape in ((4, 8), (4, 8), (8, 4))]
    assert None not in keys and keys[0] == keys[1] != keys[2]


def test_a_submodule_call_has_no_key():
    """``call_module`` runs state the key cannot see (as ``get_attr`` reads it, above)."""
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    x.meta["example_value"] = torch.empty(4, 8)
    graph.output(graph.call_module("inner", (x,)))
    owner = nn.Module()
    owner.inner = nn.Identity()
    assert piece_key(torch.fx.GraphModule(owner, graph)) is None


SCALES = [2.0, 2.0, 3.0, 2.0, 2.0]  # layers 0, 1, 3 and 4 one program, layer 2 another, the output a third


@pytest.mark.inductor
def test_with_inductor_each_program_compiles_once_and_each_piece_computes_its_own_layer():
    model = Layers([{"scale": s} for s in SCALES])
    compiled = compile_model(model, _config(use_inductor=True))
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(1))
    before = compilation_counter.snapshot()
    with torch.no_grad():
        output = compiled(x)
    after = compilation_counter.snapshot()
    assert after.num_inductor_compiles - before.num_inductor_compiles == 3
    assert after.num_compiles_shared - before.num_compiles_shared == len(SCALES) + 1 - 3
    # float32 arithmetic of a few operations on values of order 10 against float64: a piece that ran another
    # layer's scale (2 for 3) is off by a third of the output
    torch.testing.assert_close(output.double(), model.expected(x), rtol=1e-5, atol=1e-4)


@pytest.mark.inductor
@pytest.mark.parametrize("device", DEVICES)
def test_sharing_a_compile_changes_no_bit_of_the_output(monkeypatch, device):
    """The same 4-layer Llama under ``inductor`` with each piece compiled on its own (the key switched off)
    gives the same logits: bitwise on a CPU, where a shared compile is the same generated code. On CUDA, where
    the middle pieces' piecewise graphs then capture one shared compile with three layers' weights, to float32's
    reassociation error (assert_close's float32 defaults): Inductor's Triton kernels pick a launch config by
    timing at each compile's first launch, so two compiles of one program may add in another order (the
    compile cache's warm-start rule measured 1.2e-6); another layer's weights would be off by far more."""
    from conformance.driver import prefill_and_decode
    from reference.engine.runner import ModelRunner

    def logits() -> list[torch.Tensor]:
        config = mode_config("inductor", cudagraph_capture_sizes=[1, 2, 4])
        model = build_llama(small_llama_config(num_hidden_layers=4), config, device=device)
        runner = ModelRunner(model, config, max_num_seqs=4, max_model_len=16)
        steps = prefill_and_decode({"run": runner}, [[1, 2, 3], [4, 5, 6, 7, 8]], num_decode=2, leader="run")
        return steps["run"]

    shared = compilation_counter.num_compiles_shared
    with_sharing = logits()
    assert compilation_counter.num_compiles_shared - shared == 2, "the 4 layers' 3 middle pieces did not share"
    monkeypatch.setattr(backend_module, "piece_key", lambda module: None)
    alone = logits()
    exact = {"rtol": 0, "atol": 0} if device == "cpu" else {}
    for step, (a, b) in enumerate(zip(with_sharing, alone)):
        torch.testing.assert_close(a, b, **exact, msg=lambda m: f"step {step}: {m}")


@pytest.mark.inductor
def test_a_warm_start_loads_each_shared_artifact_once_and_matches_the_cold_start(monkeypatch, tmp_path):
    from torch._inductor import CompiledArtifact

    monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    model = Layers([{"scale": s} for s in SCALES])
    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(2))
    config = _config(use_inductor=True, cache_dir=str(tmp_path))
    with torch.no_grad():
        cold = compile_model(model, config)(x)
    (entry,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(list(entry.glob("*.bin"))) == 3, "one artifact file per compile"
    real_load, loads = CompiledArtifact.load, []

    def load(*args, **kwargs):
        loads.append(kwargs.get("path", args[0] if args else None))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(CompiledArtifact, "load", staticmethod(load))
    hits = compilation_counter.num_cache_hits
    with torch.no_grad():
        warm = compile_model(model, config)(x)
    assert compilation_counter.num_cache_hits - hits == 1
    assert len(loads) == 3 == len(set(loads))
    torch.testing.assert_close(warm, cold, rtol=0, atol=0)
