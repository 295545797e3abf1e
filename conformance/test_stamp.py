"""Stamped layers (``CompilationConfig.stamp_layers``, :mod:`reference.compilation.stamp`): Dynamo traces a prefix
of the decoder layers and the rest are copied into the graph.

The rule: for every architecture the graph the backend splits is, node for node, the graph of a trace of every
layer (each input named by the model tensor or argument it binds, each node by its position), and the two give
bitwise the same logits. The faults that copy a layer wrongly (its attention name, its weights, the final norm's
input) fail it. A stack that stamping cannot serve (layers that differ in their ops or settings, a weight read
after the stack, a trace of the prefix that raises) is traced whole after one warning line.
"""

from __future__ import annotations

import re
import warnings

import pytest
import torch
from torch import nn
from transformers import Gemma3TextConfig, LlamaConfig, Qwen3Config

from conformance.driver import prefill_and_decode
from conformance.helpers import DEVICES, perturb_norms, points_at, runner_for
from reference.compilation import cache_key, compile_model, expect_counters, stamp
from reference.compilation.backend import PiecewiseBackend
from reference.compilation.split import Piece
from reference.config import CompilationConfig, mode_config
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.llama import LlamaForCausalLM
from reference.models.presets import GEMMA_3_TINY, LLAMA_TINY, QWEN3_TINY
from reference.models.qwen3 import Qwen3ForCausalLM
from reference.models.silly import SILLY_SPLITTING_OPS, silly_attention
from reference.models.weights import init_random_weights
from reference.ops import CustomOpSelection

pytestmark = pytest.mark.requires("components")

PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79]]
# Gemma 3's local and global layers with a period of 3 (the 4B's is 6): 12 layers trace 9, the shortest prefix
# that holds every transition twice and ends on the last layer's kind.
GEMMA_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 4
ARCHITECTURES = {
    "llama": (LlamaForCausalLM, LlamaConfig, {**LLAMA_TINY, "num_hidden_layers": 7}, 4),
    "qwen3": (Qwen3ForCausalLM, Qwen3Config, {**QWEN3_TINY, "num_hidden_layers": 6, "max_window_layers": 6}, 4),
    "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig,
               {**GEMMA_3_TINY, "num_hidden_layers": 12, "layer_types": GEMMA_TYPES}, 9),
}  # fmt: skip


def build(arch: str, config: CompilationConfig, device: str = "cpu") -> nn.Module:
    cls, config_cls, fields, _ = ARCHITECTURES[arch]
    model = cls(config_cls(**fields), CustomOpSelection(config))
    init_random_weights(model, 0)
    perturb_norms(model, 1)
    return model.to(device).eval()


def canonical(gm: torch.fx.GraphModule, inputs: list, model: nn.Module) -> list:
    """The graph with its names left out: each placeholder named by the model tensor it binds (all its names)
    or by its place among the other inputs, each other node by its place; node names differ between the two
    traces, and the stamped graph takes the stamped layers' tensors after Dynamo's inputs."""
    names: dict[int, tuple[str, ...]] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        names[id(t)] = tuple(sorted({*names.get(id(t), ()), name}))
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    others = iter(range(len(placeholders)))
    label = {p: ("tensor", names[id(v)]) if id(v) in names else ("input", next(others))
             for p, v in zip(placeholders, inputs)}  # fmt: skip
    nodes = [n for n in gm.graph.nodes if n.op != "placeholder"]
    label.update({n: ("node", i) for i, n in enumerate(nodes)})
    name = lambda a: label[a] if isinstance(a, torch.fx.Node) else a  # noqa: E731
    return [(n.op, n.target, torch.fx.node.map_aggregate(n.args, name),
             torch.fx.node.map_aggregate(n.kwargs, name)) for n in nodes]  # fmt: skip


@pytest.fixture
def traces(monkeypatch) -> list:
    """``(graph module, inputs)`` of each graph the backend splits, stamped or traced whole, in order."""
    seen = []
    real_call, real_stamp = PiecewiseBackend.__call__, stamp.LayerStamp.stamp

    def call(self, gm, example_inputs):
        seen.append((gm, example_inputs))
        return real_call(self, gm, example_inputs)

    def stamped(self, gm, example_inputs):
        result = real_stamp(self, gm, example_inputs)
        seen[-1] = result[:2]
        return result

    monkeypatch.setattr(PiecewiseBackend, "__call__", call)
    monkeypatch.setattr(stamp.LayerStamp, "stamp", stamped)
    return seen


def run(impl, arch: str, mode: str, device: str, **overrides) -> tuple[nn.Module, list[torch.Tensor]]:
    config = mode_config(mode, max_cudagraph_capture_size=16, **overrides)
    model = build(arch, config, device)
    runner = runner_for(impl, model, config, max_num_seqs=2, max_model_len=16)
    runner.warm_up()
    return model, prefill_and_decode({"run": runner}, PROMPTS, num_decode=3, leader="run")["run"]


# ---------------------------------------------------------------------- the prefix
@pytest.mark.parametrize(
    "kinds, prefix",
    [
        (("full_attention",) * 32, 4),  # Llama 3.1 8B
        (("a",) * 5, 4),
        (("a",) * 4, None),  # nothing left to stamp
        ((("s",) * 5 + ("g",)) * 5 + ("s",) * 4, 13),  # Gemma 3 4B: 34 layers, a global one in every 6
        (tuple(GEMMA_TYPES), 9),
        (("a",) * 10 + ("b",), None),  # (a, b) occurs once, at the end
        (("a", "b") * 2 + ("a",) * 6, 7),  # (a, a) twice at 5 and 6; the prefix ends on the last kind, a
    ],
)
def test_the_prefix_holds_every_transition_twice_and_ends_on_the_last_kind(kinds, prefix):
    assert stamp.prefix_length(kinds) == prefix


# ---------------------------------------------------------------------- the rule
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_the_stamped_graph_is_the_whole_trace_and_gives_its_logits_bitwise(arch, device, traces, impl):
    layers, prefix = ARCHITECTURES[arch][2]["num_hidden_layers"], ARCHITECTURES[arch][3]
    with expect_counters(num_layers_stamped=layers - prefix, num_graphs_seen=1):
        stamped_model, stamped = run(impl, arch, "no_inductor", device)
    with expect_counters(num_layers_stamped=0, num_graphs_seen=1):
        whole_model, whole = run(impl, arch, "no_inductor", device, stamp_layers=False)
    (stamped_gm, stamped_inputs), (whole_gm, whole_inputs) = traces
    assert canonical(stamped_gm, stamped_inputs, stamped_model) == canonical(whole_gm, whole_inputs, whole_model)
    assert len(stamped_inputs) == len(whole_inputs)  # one input per tensor: the layers' shared rotary table once
    for a, b in zip(stamped, whole):
        assert torch.equal(a, b)


@pytest.mark.inductor
def test_inductor_compiles_the_stamped_graph_to_the_whole_traces_logits(traces, impl):
    """Inductor compiles the same pieces either way, so its CPU kernels give the same bits."""
    stamped_model, stamped = run(impl, "llama", "inductor", "cpu")
    whole_model, whole = run(impl, "llama", "inductor", "cpu", stamp_layers=False)
    (stamped_gm, stamped_inputs), (whole_gm, whole_inputs) = traces
    assert canonical(stamped_gm, stamped_inputs, stamped_model) == canonical(whole_gm, whole_inputs, whole_model)
    for a, b in zip(stamped, whole):
        assert torch.equal(a, b)


# ---------------------------------------------------------------------- what stamping refuses
class Layer(nn.Module):
    """``x [T, 8] -> [T, 8]``: a linear layer, its activation, then what its settings say (each a way two layers
    of one declared kind can differ)."""

    def __init__(self, doubles=False, *, adds_input=False, floor=-1.0, act=nn.ReLU, settings=None):
        super().__init__()
        self.linear, self.act = nn.Linear(8, 8), act()
        self.doubles, self.adds_input, self.floor = doubles, adds_input, floor
        self.settings = settings or {"gain": 1.0}

    def forward(self, x, shift=None):
        y = self.act(self.linear(x)) * self.settings["gain"]
        y = y + (x if self.adds_input else y)  # one op either way; what it reads differs
        y = torch.clamp(y, min=self.floor)
        if hasattr(self, "scale"):
            y = y * self.scale
        if shift is not None:
            y = y + shift
        return y * 2 if self.doubles else y


class Stack(nn.Module):
    """Layers declared of one kind (or of ``kinds``); ``odd`` gets ``Layer(**odd_settings)``, the others
    ``Layer(**settings)``. With ``shift``, each layer also takes one value the forward computes before the stack."""

    def __init__(self, odd: int = -1, odd_settings=None, *, n=6, kinds=None, shift=False, **settings):
        super().__init__()
        torch.manual_seed(0)
        odd_settings = {"doubles": True} if odd_settings is None else odd_settings
        self.layers = nn.ModuleList(Layer(**(odd_settings if i == odd else settings)) for i in range(n))
        self.kinds = kinds or ("same",) * n
        self.shift = shift

    def repeated_layers(self):
        return "layers", self.kinds

    def forward(self, x):
        shift = x.mean() if self.shift else None
        for layer in self.layers:
            x = layer(x, shift)
        return x


class IndexedStack(Stack):
    """Indexes its stack by a count of its own (as vLLM's pipeline-parallel loop does): a prefix has no layer 4."""

    def forward(self, x):
        for i in range(6):
            x = self.layers[i](x)
        return x


class LastWeightStack(Stack):
    """Reads the last layer's weight after the stack: in a trace of the prefix, the last traced layer's."""

    def forward(self, x):
        return super().forward(x) @ self.layers[-1].linear.weight.t()


class IdentityLayer(nn.Module):
    def forward(self, x, shift=None):
        return x


class IdentityStack(Stack):
    """Layers that compute nothing: no node of the trace is any layer's."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(IdentityLayer() for _ in range(6))

    def forward(self, x):
        return super().forward(x) * 2


def _with_scales(stack: Stack) -> Stack:
    for i, layer in enumerate(stack.layers):
        layer.scale = torch.full((8,), float(i + 1))  # held, not registered: not among the layer's own tensors
    return stack


class SkipLayer(Layer):
    """Adds the output of the layer two back (a skip connection over one layer)."""

    def forward(self, x, skip):
        return super().forward(x) + skip, x


class SkipStack(Stack):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(SkipLayer() for _ in range(6))

    def forward(self, x):
        skip = torch.zeros_like(x)
        for layer in self.layers:
            x, skip = layer(x, skip)
        return x


class FirstOutputStack(Stack):
    """Adds the first layer's output to the last one's after the stack."""

    def forward(self, x):
        first = x = self.layers[0](x)
        for layer in self.layers[1:]:
            x = layer(x)
        return x + first


def _with_settings(stack: Stack, settings) -> Stack:
    for i, layer in enumerate(stack.layers):
        layer.settings = settings(i)
    return stack


# each reason is a pattern: node names are Dynamo's
MISMATCH = re.escape("differs from layer 3, of its kind, in its modules, tensor shapes or settings")
TRACED_APART = re.escape("layers 2 and 3 (both 'same' after 'same') traced to different graphs")


@pytest.mark.parametrize(
    "stack, why",
    [
        (lambda: Stack(odd=3), "layer 3 runs other ops than an earlier layer of kind 'same'"),  # the trace shows it
        (lambda: Stack(odd=3, odd_settings={"adds_input": True}), TRACED_APART),  # same ops, another argument
        (lambda: Stack(odd=3, odd_settings={"floor": 0.5}), TRACED_APART),  # same ops, another keyword's value
        (lambda: _with_scales(Stack()), TRACED_APART),  # each layer reads a tensor that is not its own
        (lambda: Stack(odd=5), f"layer 5 {MISMATCH}"),
        (lambda: Stack(odd=5, odd_settings={"settings": {"gain": -1.0}}), f"layer 5 {MISMATCH}"),  # in a dict
        (lambda: _with_settings(Stack(), lambda i: {"gain": 1.0, "name": "ab"[i == 5]}), f"layer 5 {MISMATCH}"),
        # each names itself, but layer 5 its predecessor: the same text made relative is another setting
        (lambda: _with_settings(Stack(), lambda i: {"of": f"layers.{i - (i == 5)}", "gain": 1}), f"layer 5 {MISMATCH}"),
        (lambda: Stack(odd=5, odd_settings={"act": nn.SiLU}), f"layer 5 {MISMATCH}"),  # another class, same settings
        (LastWeightStack, r"\w+, outside the layers, reads layers\.3\.linear\.weight, a layer's own tensor"),
        (FirstOutputStack, r"\w+, outside the layers, reads \w+ of layer 0"),
        (SkipStack, r"layer 2 reads \w+ of layer 0, not of the layer before"),
        (IndexedStack, r"its trace raised \w+: "),
        (IdentityStack, re.escape("no node of the trace is in layer 0 (Dynamo's module paths not understood)")),
        # two kinds: layer 4 of kind a reads another argument than layer 2, the other a after a b
        (lambda: Stack(4, {"adds_input": True}, n=8, kinds=("a", "b") * 4), re.escape(
            "layers 2 and 4 (both 'a' after 'b') traced to different graphs")),
    ],
    ids=["ops", "an-argument", "a-keyword", "a-tensor-not-its-own", "settings", "a-number-in-a-dict",
         "a-string-in-a-dict", "a-layer-named-in-a-setting", "a-module-class", "a-layer-weight-read-after-the-stack",
         "an-early-layer-read-after-the-stack", "a-skip-over-a-layer", "a-trace-that-fails", "no-layer-in-the-graph",
         "two-kinds-traced-apart"],
)  # fmt: skip
def test_a_stack_stamping_cannot_serve_is_traced_whole_after_one_warning(stack, why):
    model = stack().eval()
    x = torch.randn(5, 8)
    expected = model(x)
    compiled = compile_model(model, CompilationConfig(level=2, use_inductor=False))
    prefix = compiled.layer_stamp.prefix
    with expect_counters(num_layers_stamped=0, num_graphs_seen=1), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output = compiled(x)
    stamped = [w for w in caught if "stamped layers" in str(w.message)]
    messages = [str(w.message) for w in stamped]
    assert len(messages) == 1 and re.match(f"stamped layers: {why}", messages[0]), messages
    assert points_at(stamped[0], __file__), f"the warning names {stamped[0].filename}, not the caller's line"
    assert messages[0].endswith(f"; tracing all {len(model.layers)} layers instead of {prefix}")
    assert "\n" not in messages[0]
    torch.testing.assert_close(output, expected, rtol=0, atol=0)
    torch.testing.assert_close(compiled(x[:3]), model(x[:3]), rtol=0, atol=0)  # and it stays traced whole


@pytest.mark.parametrize(
    "error, said", [(ValueError("the first line\nthe second"), "ValueError: the first line"), (KeyError(), "KeyError: ")]
)
def test_a_trace_that_fails_is_named_by_its_errors_type_and_first_line_in_a_runtime_warning(monkeypatch, error, said):
    """The reason of :class:`IndexedStack`'s case above is Dynamo's own text, which differs between torch versions;
    here the stamped trace fails with an error of the test's own before anything is compiled."""
    model = Stack().eval()
    x = torch.randn(5, 8)
    compiled = compile_model(model, CompilationConfig(level=2, use_inductor=False))
    prefix = compiled.layer_stamp.prefix

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(type(compiled.layer_stamp), "prefix_model", fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        output = compiled(x)
    stamped = [w for w in caught if "stamped layers" in str(w.message)]
    assert [(w.category, str(w.message)) for w in stamped] == [
        (RuntimeWarning, f"stamped layers: its trace raised {said}; tracing all 6 layers instead of {prefix}")
    ]
    torch.testing.assert_close(output, model(x), rtol=0, atol=0)


class RowsStack(Stack):
    """Returns the rows it is given of the stack's output: an index past them fails in the compiled graph's run."""

    def forward(self, x, rows):
        return super().forward(x)[rows]


def test_an_error_after_the_stamped_graph_compiled_is_the_calls_own_and_not_a_fallback():
    """Once the backend has compiled the stamped graph, an error is the call's (its input's) own: it reaches the
    caller as raised, without the fallback's warning and a second trace that would raise it again."""
    compiled = compile_model(RowsStack().eval(), CompilationConfig(level=2, use_inductor=False))
    with warnings.catch_warnings(record=True) as caught, pytest.raises(IndexError, match="index 7 is out of bounds"):
        warnings.simplefilter("always")
        compiled(torch.randn(5, 8), torch.tensor([7, 0]))
    assert compiled.backend.traced and not [w for w in caught if "stamped layers" in str(w.message)]


@pytest.mark.no_inductor
@pytest.mark.no_inductor_full
def test_the_fallback_warning_names_the_callers_line_through_full_graphs_too():
    """With full graphs the tracing call passes through the full-graph wrapper, one frame more than without:
    a fixed ``stacklevel`` then named ``reference/compilation/capture.py``."""
    config = CompilationConfig(level=3, use_inductor=False, cudagraph_mode="full_and_piecewise", splitting_ops=[])
    compiled = compile_model(IndexedStack().eval(), config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(torch.randn(5, 8))
    (stamped,) = [w for w in caught if "stamped layers" in str(w.message)]
    assert points_at(stamped, __file__), f"the warning names {stamped.filename}:{stamped.lineno}"


@pytest.mark.parametrize(
    "stack, stamped",
    [
        (lambda: Stack(), 2),
        (lambda: Stack(shift=True), 2),  # each layer reads a value computed outside the stack
        # two kinds that run different ops, alternating: (b, a) and (a, b) twice each from layer 2 on, ending on b
        (lambda: Stack(odd=-1, n=8, kinds=("a", "b") * 4), 2),
        (lambda: Stack(odd=-1, n=12, kinds=("a", "a", "b") * 4), 3),  # as Gemma 3's local and global layers
        (lambda: Stack(0, {"floor": 0.5}), 2),  # the first layer, traced and never a template, may differ
    ],
    ids=["equal-layers", "a-value-from-outside", "two-kinds", "two-kinds-of-period-3", "a-first-layer-of-its-own"],
)
def test_a_stack_stamping_can_serve_is_stamped_and_computes_the_model(stack, stamped):
    model = stack().eval()
    if model.kinds[0] == "a":  # a layer of kind b doubles its output
        model.layers = nn.ModuleList(Layer(doubles=k == "b") for k in model.kinds)
    x = torch.randn(5, 8)
    compiled = compile_model(model, CompilationConfig(level=2, use_inductor=False))
    with expect_counters(num_layers_stamped=stamped, num_graphs_seen=1):
        torch.testing.assert_close(compiled(x), model(x), rtol=0, atol=0)
    torch.testing.assert_close(compiled(x[:2]), model(x[:2]), rtol=0, atol=0)


@pytest.mark.parametrize("level", [pytest.param(0, marks=pytest.mark.eager), 1])
def test_levels_that_do_not_trace_once_stamp_nothing(level):
    assert compile_model(Stack(odd=-1), CompilationConfig(level=level, use_inductor=False)).layer_stamp is None


def test_a_model_that_declares_no_stack_or_too_short_a_one_stamps_nothing():
    assert compile_model(nn.Linear(2, 2), CompilationConfig(level=2, use_inductor=False)).layer_stamp is None
    assert compile_model(Stack(n=4), CompilationConfig(level=2, use_inductor=False)).layer_stamp is None
    assert compile_model(Stack(n=5), CompilationConfig(level=2, use_inductor=False)).layer_stamp.prefix == 4


def test_a_declaration_that_names_no_module_list_is_refused():
    model = Stack()
    model.repeated_layers = lambda: ("layers.0", ("same",) * 6)
    expected = r"repeated_layers: Stack names 'layers.0' with 6 kinds, but that is Layer of no layers"
    with pytest.raises(ValueError, match=expected):
        compile_model(model, CompilationConfig(level=2, use_inductor=False))


def test_a_declaration_that_does_not_fit_the_stack_is_refused():
    model = Stack(odd=-1)
    model.repeated_layers = lambda: ("layers", ("same",) * 5)
    expected = r"repeated_layers: Stack names 'layers' with 5 kinds, but that is ModuleList of 6"
    with pytest.raises(ValueError, match=expected):
        compile_model(model, CompilationConfig(level=2, use_inductor=False))


@pytest.mark.no_inductor
@pytest.mark.requires("compile_cache")
def test_a_stamped_cold_start_is_cached_and_its_warm_start_gives_its_logits(monkeypatch, tmp_path, impl):
    """The entry binds the stamped layers' inputs by name like any other: a warm start needs no stamping."""
    monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    overrides = {"cache_dir": str(tmp_path)}
    with expect_counters(num_cache_misses=1, num_cache_entries_written=1, num_layers_stamped=3):
        _, cold = run(impl, "llama", "no_inductor", "cpu", **overrides)
    with expect_counters(num_cache_hits=1, num_graphs_seen=0, num_layers_stamped=0):
        _, warm = run(impl, "llama", "no_inductor", "cpu", **overrides)
    for a, b in zip(cold, warm):
        assert torch.equal(a, b)


def test_the_trace_sees_a_copy_and_the_model_keeps_its_whole_stack():
    """A thread that runs the model during the trace (the runner's kernel warm-up) runs every layer."""
    model = Stack(odd=-1)
    layers = model.layers
    prefix_model = stamp.LayerStamp.for_model(model).prefix_model()
    assert model.layers is layers and len(model.layers) == 6
    assert len(prefix_model.layers) == 4 and all(a is b for a, b in zip(prefix_model.layers, layers))
    nested = build("llama", mode_config("no_inductor"))
    copy = stamp.LayerStamp.for_model(nested).prefix_model()
    assert len(nested.model.layers) == 7 and len(copy.model.layers) == 4
    assert copy.model.embed_tokens is nested.model.embed_tokens and copy.lm_head is nested.lm_head


@pytest.mark.parametrize(
    "dynamo_path",
    ["L['self'].model.layers.3.mlp", "L['self']._modules['model']._modules['layers']._modules['3'].mlp",
     "L['self'].model.layers[3].mlp"],
)  # fmt: skip
def test_each_spelling_of_a_module_path_in_dynamos_graph_is_read(dynamo_path):
    assert stamp._module_path(dynamo_path) == "model.layers.3.mlp"


def test_a_piece_given_one_fake_value_twice_is_refused():
    """Stamped nodes share their template's fake values; a piece taking two of them would be compiled as if
    given one tensor twice."""
    graph = torch.fx.Graph()
    a, b = graph.placeholder("a"), graph.placeholder("b")
    graph.output(graph.call_function(torch.add, (a, b)))
    fake = torch.empty(2)
    a.meta["example_value"] = b.meta["example_value"] = fake
    piece = Piece("submod_1", 1, False, torch.fx.GraphModule({}, graph))
    with pytest.raises(stamp.NotStampable, match="submod_1 would take two stamped values that share one fake tensor"):
        stamp.check_distinct_inputs([piece])
    b.meta["example_value"] = torch.empty(2)
    stamp.check_distinct_inputs([piece])


class CarryLayer(nn.Module):
    """``(x [T, 8], carried [T, 8]) -> (out, y)``: ``y`` is made before a splitting op, and read after it beside
    the previous layer's ``y`` (``carried``): the piece after each split takes two copies of one traced node."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, carried):
        y = self.linear(x)
        out = torch.empty_like(y)
        silly_attention(y, y, y, out)  # the split
        return out + y + carried, y


class CarryStack(Stack):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(CarryLayer() for _ in range(6))

    def forward(self, x):
        carried = torch.zeros_like(x)
        for layer in self.layers:
            x, carried = layer(x, carried)
        return x


@pytest.mark.no_inductor
def test_a_stamped_split_whose_piece_takes_two_copies_of_one_node_is_traced_whole():
    """Stamping itself serves :class:`CarryStack` (each layer reads only its own values and the layer before's);
    its split does not, since a piece would take two stamped values sharing one fake tensor, so the backend
    refuses it (:func:`stamp.check_distinct_inputs`) and the model is traced whole after one warning."""
    model = CarryStack().eval()
    x = torch.randn(5, 8)
    config = CompilationConfig(level=3, use_inductor=False, splitting_ops=list(SILLY_SPLITTING_OPS))
    compiled = compile_model(model, config)
    with (
        torch.no_grad(),
        expect_counters(num_layers_stamped=0, num_graphs_seen=1),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        output = compiled(x)
        expected = model(x)
    messages = [str(w.message) for w in caught if "stamped layers" in str(w.message)]
    assert len(messages) == 1 and re.fullmatch(
        r"stamped layers: submod_\d+ would take two stamped values that share one fake tensor; "
        r"tracing all 6 layers instead of 4",
        messages[0],
    ), messages
    torch.testing.assert_close(output, expected, rtol=0, atol=0)


def relative(text: str) -> str:
    return text.replace("layers.3", "layers.<+0>")


@pytest.mark.parametrize(
    "value, plain",
    [
        ("model.layers.3.attn", "model.layers.<+0>.attn"),
        (2, 2), (0.5, 0.5), (None, None), (b"x", b"x"), (1j, 1j), (torch.bfloat16, torch.bfloat16),
        (torch.device("cpu"), torch.device("cpu")),
        (("layers.3", 1), ("tuple", ("layers.<+0>", 1))),
        (["b", "a"], ("list", ("b", "a"))),  # a list keeps its order
        ({"b", "a"}, ("set", ("a", "b"))),  # a set's order is its contents'
        ({1, "a"}, ("set", ("a", 1))),  # mixed types sort by their repr: "'a'" before "1"
        ({"layers.3": ["layers.3"]}, ("dict", (("layers.<+0>", ("list", ("layers.<+0>",))),))),
    ],
)  # fmt: skip
def test_a_setting_reads_as_plain_data_with_its_layer_made_relative(value, plain):
    assert stamp._plain(value, relative) == plain


def test_two_equal_sets_read_alike_whatever_order_they_iterate_in():
    first, second = {1, 9}, {9, 1}  # 1 and 9 share a slot of a small table: the first inserted comes first
    assert list(first) != list(second)
    assert stamp._plain(first, relative) == stamp._plain(second, relative)


def test_modules_tensors_and_private_attributes_are_no_settings():
    module = nn.Linear(2, 2)
    module.note, module._private, module.held = "layers.3", 1, torch.zeros(1)
    module.nested = [nn.ReLU()]
    settings = dict(stamp._settings(module, relative))
    assert settings == {"in_features": 2, "out_features": 2, "note": "layers.<+0>",
                        "nested": ("list", (stamp._OPAQUE,))}  # fmt: skip
    assert stamp._plain(nn.ReLU(), relative) is stamp._OPAQUE
