"""Structure: what the pipeline traced, split, compiled and captured, read from the compilation counters.

The counters are asserted as exact deltas around a block (``expect_counters``), so each test states what
one model compilation must do, independent of Inductor's output and of timing. CUDA-graph captures
happen only on CUDA: the ``cpu`` cases expect 0 captures and the RuntimeWarning saying so, the ``cuda``
cases (marked gpu) expect one capture per capturable piece and capture size.

Call pattern for a capture size with the default ``cudagraph_num_of_warmups=1``: the first call at the
size is a warm-up (for the first size of all it is also the tracing call), the second captures, later
calls replay.
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections import Counter

import pytest
import torch

from conformance import helpers
from conformance.driver import run_steps
from conformance.helpers import (
    COMPILED_MODES,
    DEVICES,
    TRACED_MODES,
    StaticTokens,
    build_llama,
    small_llama_config,
    token_ids,
)
from conformance.implementation import make_runner
from conformance.oracle import ORACLE_ATOL
from reference.compilation import compilation_counter, expect_counters
from reference.compilation.backend import check_splitting_ops_exist
from reference.compilation.compile_piece import example_inputs
from reference.compilation.split import op_name
from reference.config import CompilationConfig, ConfigError, mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output
from reference.models.toy_llama import TOY_SPLITTING_OPS, ToyLlama, toy_llama_config
from reference.ops import CustomOpSelection

NO_GRAPHS_ON_CPU = r"not on a CUDA device.*without graphs"


def _counts(*, graphs: int, pieces: int, capturable: int, inductor: bool, captures: int) -> dict[str, int]:
    """Counter deltas for ``graphs`` Dynamo graphs split into ``pieces`` (``capturable`` of them compiled)."""
    return dict(
        num_graphs_seen=graphs,
        num_piecewise_graphs_seen=pieces,
        num_piecewise_capturable_graphs_seen=capturable,
        num_backend_compilations=capturable,
        num_inductor_compiles=capturable if inductor else 0,
        num_eager_compiles=0 if inductor else capturable,
        num_cudagraph_captured=captures,
    )


def _no_graph_warning_on_cpu(device: str):
    """On CPU the first (compiling) call must warn that no CUDA graphs will be captured."""
    return pytest.warns(RuntimeWarning, match=NO_GRAPHS_ON_CPU) if device == "cpu" else contextlib.nullcontext()


def _check_silly(compiled, buffer: torch.Tensor, size: int) -> None:
    """Run the silly model on ``size`` fresh rows of the static ``buffer`` and compare with its closed form.

    Exact: every operation of the closed form is the same IEEE operation, in the same order, as the model's
    (``(a + a) + a`` and ``3 * a`` round the same exact value ``3a`` once).
    """
    x = buffer[:size]
    x.copy_(torch.randn(x.shape))
    torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)


# ---------------------------------------------------------------------- silly model (level 3)
@pytest.mark.requires("counters")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", TRACED_MODES)
def test_silly_model_splits_into_five_pieces_and_captures_three_per_size(mode, device, impl):
    config = mode_config(mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[1, 2])
    compiled = impl.compile(SillyModel(), config)
    buffer = torch.zeros(2, 8, device=device)
    captures = 3 * 2 if device == "cuda" else 0
    with expect_counters(**_counts(graphs=1, pieces=5, capturable=3, inductor=mode == "inductor", captures=captures)):
        with _no_graph_warning_on_cpu(device):
            _check_silly(compiled, buffer, 2)  # trace + warm-up of size 2
        for size in (2, 1, 1):  # capture 2, warm up 1, capture 1
            _check_silly(compiled, buffer, size)
    with expect_counters(**_counts(graphs=0, pieces=0, capturable=0, inductor=False, captures=0)):
        for size in (2, 1, 2):  # replays: nothing is traced, compiled or captured again
            _check_silly(compiled, buffer, size)


@pytest.mark.requires("counters")
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", DEVICES)
def test_level3_without_cuda_graphs_compiles_the_pieces_and_captures_nothing(device, impl):
    config = CompilationConfig(use_inductor=False, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_mode="none")
    compiled = impl.compile(SillyModel(), config)
    buffer = torch.zeros(4, 8, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing to warn about: no graphs were asked for
        with expect_counters(**_counts(graphs=1, pieces=5, capturable=3, inductor=False, captures=0)):
            for size in (4, 2, 2, 2, 1, 1):
                _check_silly(compiled, buffer, size)


# ---------------------------------------------------------------------- toy Llama (level 3)
def _run_toy(compiled, tokens: StaticTokens, sizes) -> None:
    with torch.no_grad():
        for size in sizes:
            compiled(*tokens(list(range(size))))


# 12 layers is vLLM's toy-Llama scenario: 1 graph, 25 pieces, 13 capturable, 26 captures with two sizes.
# Inductor is slow on CPU: one small case.
TOY_CASES = [("no_inductor", 1), ("no_inductor", 3), ("no_inductor", 12), ("inductor", 1)]


@pytest.mark.requires("counters")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode, num_layers", TOY_CASES, ids=[f"{m}-{n}layers" for m, n in TOY_CASES])
def test_toy_llama_splits_at_each_attention(mode, num_layers, device, impl):
    """N attention calls split the graph into 2N + 1 pieces; the N + 1 between them are compiled and captured."""
    sizes = (2, 4)
    config = mode_config(mode, splitting_ops=TOY_SPLITTING_OPS, cudagraph_capture_sizes=list(sizes))
    compiled = impl.compile(ToyLlama(toy_llama_config(num_layers), CustomOpSelection(config)).to(device), config)
    tokens = StaticTokens(max(sizes), device)
    n, inductor = num_layers, mode == "inductor"
    captures = (n + 1) * len(sizes) if device == "cuda" else 0
    with expect_counters(**_counts(graphs=1, pieces=2 * n + 1, capturable=n + 1, inductor=inductor, captures=captures)):
        with _no_graph_warning_on_cpu(device):
            _run_toy(compiled, tokens, [4])  # trace + warm-up of size 4
        _run_toy(compiled, tokens, [4, 2, 2, 3])  # capture 4, warm up 2, capture 2, size 3 runs without a graph
    with expect_counters(**_counts(graphs=0, pieces=0, capturable=0, inductor=False, captures=0)):
        _run_toy(compiled, tokens, [2, 4, 3])


@pytest.mark.requires("counters")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", TRACED_MODES)
def test_two_compiled_submodules_of_one_model_trace_and_capture_separately(mode, device, impl):
    """Each compiled submodule is its own Dynamo graph with its own pieces and graphs; chained, they
    compute the composition of their closed forms (the second reads the first's graph output)."""
    config = mode_config(mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[2, 4])
    first, second = impl.compile(SillyModel(), config), impl.compile(SillyModel(), config)
    buffer = torch.zeros(4, 8, device=device)
    captures = 2 * 3 * 2 if device == "cuda" else 0  # two models x three capturable pieces x two sizes
    with expect_counters(**_counts(graphs=2, pieces=10, capturable=6, inductor=mode == "inductor", captures=captures)):
        with _no_graph_warning_on_cpu(device):
            for size in (4, 4, 2, 2, 4, 2, 3):  # warm up and capture both sizes, replay, run 3 without a graph
                x = buffer[:size]
                x.copy_(torch.randn(x.shape))
                torch.testing.assert_close(second(first(x)), expected_output(expected_output(x)), rtol=0, atol=0)


UNSPLIT_CASES = [
    pytest.param("no_inductor", "cpu", id="no_inductor-cpu"),
    pytest.param("no_inductor", "cuda", id="no_inductor-cuda", marks=pytest.mark.gpu),
    pytest.param("inductor", "cuda", id="inductor-cuda", marks=pytest.mark.gpu),  # on CPU: see test_equivalence
]


@pytest.mark.requires("counters")
@pytest.mark.parametrize("mode, device", UNSPLIT_CASES)
def test_toy_llama_without_splitting_ops_is_one_piece_captured_once_per_size(mode, device, impl):
    sizes = (2, 4)
    config = mode_config(mode, splitting_ops=[], cudagraph_capture_sizes=list(sizes))
    compiled = impl.compile(ToyLlama(toy_llama_config(2), CustomOpSelection(config)).to(device), config)
    tokens = StaticTokens(max(sizes), device)
    captures = len(sizes) if device == "cuda" else 0
    with expect_counters(**_counts(graphs=1, pieces=1, capturable=1, inductor=mode == "inductor", captures=captures)):
        with _no_graph_warning_on_cpu(device):
            _run_toy(compiled, tokens, [4])
        _run_toy(compiled, tokens, [4, 2, 2, 2])


FUSED = ["all", "+rms_norm_linear", "+linear_activation", "+linear_residual_add"]  # 'all' leaves them off


@pytest.mark.requires("pieces")
@pytest.mark.no_inductor
@pytest.mark.parametrize(
    "custom_ops", [FUSED, ["all"], ["none"]], ids=["custom_ops=fused", "custom_ops=all", "custom_ops=none"]
)
def test_enabled_custom_ops_are_single_opaque_nodes_of_the_traced_graph(custom_ops, impl):
    num_layers = 2
    config = CompilationConfig(use_inductor=False, custom_ops=custom_ops, splitting_ops=TOY_SPLITTING_OPS)
    compiled = impl.compile(ToyLlama(toy_llama_config(num_layers), CustomOpSelection(config)), config)
    with pytest.warns(RuntimeWarning, match=NO_GRAPHS_ON_CPU):
        _run_toy(compiled, StaticTokens(4), [4])
    ops = Counter(
        op_name(node.target)
        for piece in compiled.backend.pieces
        for node in piece.module.graph.nodes
        if node.op == "call_function" and (op_name(node.target) or "").startswith("reference::")
    )
    per_model = {"reference::toy_attention": num_layers}
    if custom_ops == FUSED:
        per_model |= {
            # qkv (with its norm), o and down (with the residual adds), gate_up (with its norm and activation)
            "reference::fused_linear": 4 * num_layers,
            "reference::rms_norm": 1,  # the final norm: the GEMMs made every residual add
            "reference::rotary_embedding": num_layers,
        }
    if custom_ops == ["all"]:
        per_model |= {
            "reference::rms_norm": 1,  # the first layer's input norm has no residual to add yet
            "reference::fused_add_rms_norm": 2 * num_layers,  # the other per-layer norms and the final norm
            "reference::silu_and_mul": num_layers,
            "reference::rotary_embedding": num_layers,  # one shared table, called by every layer
        }
    assert ops == Counter(per_model)


# ---------------------------------------------------------------------- levels 1 and 2
USE_INDUCTOR = pytest.mark.parametrize("use_inductor", [False, True], ids=["use_inductor=False", "use_inductor=True"])


@pytest.mark.requires("levels", "counters")
@USE_INDUCTOR
def test_level1_compiles_whole_graphs_and_recompiles_for_new_sizes(use_inductor, impl):
    compiled = impl.compile(SillyModel(), CompilationConfig(level=1, use_inductor=use_inductor))
    before = compilation_counter.snapshot()
    for size in (2, 5, 1, 16):  # 1 token: Dynamo specialises sizes 0 and 1
        x = torch.randn(size, 8)
        torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)
    after = compilation_counter.snapshot()
    graphs = after.num_graphs_seen - before.num_graphs_seen
    assert graphs >= 2, "Dynamo with guards must have recompiled for a new size"
    for name in ("num_piecewise_graphs_seen", "num_piecewise_capturable_graphs_seen", "num_backend_compilations"):
        assert getattr(after, name) - getattr(before, name) == graphs, f"{name}: one whole-graph piece per graph"
    assert after.num_cudagraph_captured == before.num_cudagraph_captured


@pytest.mark.requires("levels", "counters", "pieces")
@USE_INDUCTOR
def test_level2_traces_once_for_every_size(use_inductor, impl):
    compiled = impl.compile(SillyModel(), CompilationConfig(level=2, use_inductor=use_inductor))
    with expect_counters(**_counts(graphs=1, pieces=1, capturable=1, inductor=use_inductor, captures=0)):
        for size in (2, 5, 1, 16, 3):
            x = torch.randn(size, 8)
            torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)
    (piece,) = compiled.backend.pieces
    assert any(isinstance(v, torch.SymInt) for v in example_inputs(piece.module)), "traced for a symbolic size"


@pytest.mark.requires("trace_once")
@pytest.mark.parametrize("level", [2, pytest.param(3, marks=pytest.mark.no_inductor)])
def test_a_first_call_with_one_token_is_refused_and_leaves_the_model_usable(level, impl):
    config = CompilationConfig(level=level, use_inductor=False, cudagraph_mode="none")
    compiled = impl.compile(SillyModel(), config)
    message = r"first call traces the model and needs at least 2 tokens.*got shape \(1, 8\)"
    with pytest.raises(ValueError, match=message):
        compiled(torch.randn(1, 8))
    x = torch.randn(3, 8)
    torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)


@pytest.mark.requires("trace_once", "counters")
@pytest.mark.parametrize(
    "other", [torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 9)], ids=["other_dtype", "other_hidden_size"]
)
def test_a_call_unlike_the_traced_one_raises_type_error(other, impl):
    compiled = impl.compile(SillyModel(), CompilationConfig(level=2, use_inductor=False))
    compiled(torch.randn(4, 8))
    with expect_counters(num_graphs_seen=0):
        with pytest.raises(TypeError, match="another dtype, device or non-token shape than the first call"):
            compiled(other)


@pytest.mark.requires("trace_once")
@pytest.mark.parametrize("level", [2, pytest.param(3, marks=pytest.mark.no_inductor)])
def test_a_retrace_after_a_dynamo_reset_is_refused_with_a_clear_error(level, impl):
    """With guards dropped, a second trace would be fixed to one size and then serve every size."""
    compiled = impl.compile(SillyModel(), CompilationConfig(level=level, use_inductor=False, cudagraph_mode="none"))
    compiled(torch.randn(4, 8))
    torch._dynamo.reset()  # as a test harness or another library may do
    with pytest.raises(RuntimeError, match=r"traced a second time.*torch._dynamo.reset\(\)"):
        compiled(torch.randn(3, 8))


@pytest.mark.requires("trace_once", "counters")
@pytest.mark.parametrize("level", [2, pytest.param(3, marks=pytest.mark.no_inductor)])
def test_many_compiled_models_of_one_class_each_trace_once(level, impl):
    """Dynamo caches compiled code per code object; models of one class share ``forward``'s code, so
    without care the ninth model hits Dynamo's recompile limit (a hard error with fullgraph=True)."""
    split = {"splitting_ops": SILLY_SPLITTING_OPS} if level == 3 else {}
    config = CompilationConfig(level=level, use_inductor=False, **split)
    x = torch.randn(4, 3)
    with expect_counters(num_graphs_seen=12):
        for _ in range(12):
            compiled = impl.compile(SillyModel(), config)
            torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)
            torch.testing.assert_close(compiled(x[:2]), expected_output(x[:2]), rtol=0, atol=0)


@pytest.mark.requires("components")
def test_a_splitting_op_that_returns_tensors_is_refused_with_cuda_graphs():
    """Its output would be allocated outside the graph pool and move between replays."""
    from reference.compilation.backend import _check_writes_into_buffers
    from reference.compilation.split import split_graph

    def forward(x, w):
        return torch.ops.reference.rms_norm(x * 2, w, 1e-6, 0.0) + 1

    gm = torch.fx.symbolic_trace(forward)
    _, pieces = split_graph(gm, ("reference::rms_norm",))
    (norm_piece,) = [p for p in pieces if p.is_splitting_op]
    with pytest.raises(ConfigError, match="'reference::rms_norm' returns tensors"):
        _check_writes_into_buffers(norm_piece)


@pytest.mark.inductor
def test_an_unregistered_splitting_op_is_refused_when_the_model_is_compiled(impl):
    config = CompilationConfig(splitting_ops=["foo::bar"])  # well-formed: the config cannot know the ops
    with pytest.raises(ConfigError, match="splitting_ops: 'foo::bar' is not a registered torch.library op"):
        impl.compile(SillyModel(), config)


@pytest.mark.requires("splits_dynamo_graphs")
@pytest.mark.inductor
@pytest.mark.parametrize("name", ["aten::mm", "prims::add"])
def test_an_aten_splitting_op_is_refused_since_dynamo_graphs_never_hold_one(impl, name):
    """ATen and prims ops are registered, but Dynamo records torch-level calls: the graph would never be
    cut at them (README, splitting_ops)."""
    with pytest.raises(ConfigError, match=f"splitting_ops: '{name}' is an ATen-level op"):
        impl.compile(SillyModel(), CompilationConfig(splitting_ops=[name]))


@pytest.mark.requires("components")  # the reference's own words; the rules above read only their start
@pytest.mark.parametrize(
    "name, message",
    [
        ("aten::mm", "'aten::mm' is an ATen-level op: Dynamo's graph never holds one (ATen ops appear later, in "
         "AOT Autograd), and a breakable capture could not break at it (ATen ops return tensors; a splitting op "
         "writes into buffers it is given); name a torch.library custom op such as 'reference::attention'"),
        ("foo::bar", "'foo::bar' is not a registered torch.library op; import the module that defines it before "
         "compiling, or fix the name"),
    ],
)  # fmt: skip
def test_a_refused_splitting_op_is_explained_whole(name, message):
    with pytest.raises(ConfigError) as err:
        check_splitting_ops_exist(("reference::attention", name))
    assert str(err.value) == f"splitting_ops: {message}"


@pytest.mark.requires("pieces")
@pytest.mark.no_inductor
def test_the_default_splits_at_every_op_tagged_cudagraph_unsafe(impl):
    """``splitting_ops=None`` (vLLM's default spelling) means the attention ops, which the project tags
    where it defines them; untagged custom ops (RMSNorm's, RoPE's) stay inside their pieces."""
    config = CompilationConfig(use_inductor=False, cudagraph_mode="none", custom_ops=["all"])
    hf = small_llama_config()
    runner = make_runner(impl, build_llama(hf, config), config, max_num_seqs=2, max_model_len=16)
    runner.warm_up()
    calls = [
        (piece.is_splitting_op, op_name(node.target))
        for piece in runner.compiled.backend.pieces
        for node in piece.module.graph.nodes
        if node.op == "call_function" and (op_name(node.target) or "").startswith("reference::")
    ]
    assert [name for split, name in calls if split] == ["reference::attention"] * hf.num_hidden_layers
    assert {name for split, name in calls if not split} >= {"reference::rms_norm", "reference::rotary_embedding"}


@pytest.mark.requires("pieces")
@pytest.mark.no_inductor
def test_splitting_ops_absent_from_the_graph_are_reported(impl):
    config = CompilationConfig(level=3, use_inductor=False, splitting_ops=["reference::toy_attention"])
    with pytest.warns(RuntimeWarning, match="none of splitting_ops"):
        impl.compile(SillyModel(), config)(torch.randn(4, 3))


@pytest.mark.eager
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", COMPILED_MODES)
def test_attention_left_inside_a_captured_piece_is_refused_or_runs_like_eager(mode, device, impl):
    """``splitting_ops=[]`` with the KV-cache attention op and piecewise graphs asks to capture attention
    with one step's lengths and cache slots. An implementation must refuse it when the model is compiled,
    with one line naming the op (the reference does, on any device: the config asks for graphs), or keep
    attention out of the graphs some other way and then run like eager (torch's graph partition cuts at
    the op's ``cudagraph_unsafe`` tag whatever the list says): logits within ``ORACLE_ATOL`` over a
    prefill and decode steps whose lengths and slots differ from the captured ones."""
    hf = small_llama_config()
    sizes = dict(device=device, max_num_seqs=2, max_model_len=16)
    runner = helpers.make_runner(impl, mode, hf, splitting_ops=[], cudagraph_capture_sizes=[2, 4], **sizes)
    try:
        runner.warm_up()
    except ConfigError as err:
        message = r"'reference::attention' \(tagged torch.Tag.cudagraph_unsafe.*would be captured"
        assert re.search(message, str(err)) and "\n" not in str(err), str(err)
        return
    steps = [[token_ids(3, hf.vocab_size, seed=1), token_ids(5, hf.vocab_size, seed=2)]]
    steps += [[[7 + s], [11 + s]] for s in range(3)]  # decode: 2 rows, the captured size, contexts growing
    eager = run_steps(helpers.make_runner(impl, "eager", hf, **sizes), steps)
    for step, (ours, expected) in enumerate(zip(run_steps(runner, steps), eager)):
        torch.testing.assert_close(ours, expected, rtol=0, atol=ORACLE_ATOL, msg=lambda m: f"step {step}: {m}")
