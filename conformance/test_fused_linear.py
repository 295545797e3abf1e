"""The GEMM fusions (``rms_norm_linear``, ``linear_activation``, ``linear_residual_add``): each fused layer against
the unfused code it replaces, a whole model under every subset of them, and which ops each subset runs.

Tolerances. On a CPU every op runs its torch reference, and the fusions keep the unfused layers' additions in
their order (the residual add made where the GEMM ends instead of in the next norm adds the same two tensors),
so fused and unfused give the same bits: asserted exactly, per layer and per whole model. On CUDA a step of at
most 64 tokens runs the small-M kernel, whose error is bounded in test_linear_kernels.py; a larger one runs the
unfused kernels, so the same bits again.
"""

from __future__ import annotations

import itertools
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from conformance.helpers import perturb_norms
from reference.config import CompilationConfig
from reference.engine import ModelRunner
from reference.models import registry
from reference.ops import (
    CustomOpSelection,
    GeluTanhAndMul,
    LinearActivation,
    LinearResidualAdd,
    RMSNorm,
    RMSNormLinear,
    SiluAndMul,
)
from reference.ops import fused_linear
from reference.ops.fused_linear import norm_gate_up
from reference.ops.library import HAS_TRITON
from reference.ops.linear_configs import MAX_ROWS
from reference.parallel import ColumnParallelLinear, RowParallelLinear

pytestmark = pytest.mark.requires("components")

EXACT = dict(rtol=0, atol=0)
FUSIONS = ("rms_norm_linear", "linear_activation", "linear_residual_add")
ALL_FUSED = ["all", *(f"+{name}" for name in FUSIONS)]  # 'all' leaves the (opt-in) fusions off
BOTH = CustomOpSelection(CompilationConfig(level=0))  # the layer's own choice is irrelevant: both paths are called
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _operands(dtype, seed=0, t=7, h=64, inter=48, bias=False):
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(BOTH, h, eps=1e-6)
    gate_up = ColumnParallelLinear(h, [inter, inter], bias=bias)
    down = RowParallelLinear(inter, h, bias=bias)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(h, generator=gen))
        for linear in (gate_up, down):
            linear.weight.copy_(torch.randn(linear.weight.shape, generator=gen) * linear.in_features**-0.5)
    hidden, residual = (torch.randn(t, h, generator=gen).to(dtype) for _ in range(2))
    return norm.to(dtype), gate_up.to(dtype), down.to(dtype), hidden, residual


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("deferred", [True, False], ids=["deferred-add", "stream-alone"])
def test_the_fused_norm_and_gemm_equal_the_norm_then_the_gemm(dtype, deferred):
    norm, gate_up, _, hidden, residual = _operands(DTYPES[dtype])
    residual = residual if deferred else None
    layer = RMSNormLinear(BOTH)
    (native, native_stream), (custom, custom_stream) = (
        f(hidden, residual, norm, gate_up) for f in (layer.forward_native, layer.forward_custom)
    )
    stream = hidden + residual if deferred else hidden
    torch.testing.assert_close(custom_stream, stream, **EXACT)
    torch.testing.assert_close(native_stream, stream, **EXACT)
    torch.testing.assert_close(custom, native, **EXACT)
    torch.testing.assert_close(native, gate_up(norm(stream)), **EXACT)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("act_cls", [None, GeluTanhAndMul], ids=["silu", "gelu_tanh"])
@pytest.mark.parametrize(
    "fuse", list(itertools.product([False, True], repeat=2)), ids=lambda f: f"norm{f[0]:d}-act{f[1]:d}"
)
def test_every_way_of_fusing_the_mlp_prologue_gives_the_unfused_bits(dtype, act_cls, fuse):
    """norm, gate_up and activation: unfused, norm fused, activation fused, or all three in one op."""
    norm, gate_up, _, hidden, residual = _operands(DTYPES[dtype], seed=1)
    mlp = torch.nn.Module()
    mlp.gate_up_proj, mlp.act_fn = gate_up, (act_cls or SiluAndMul)(BOTH)
    switched_on = [f"+{name}" for name, on in zip(FUSIONS, fuse) if on]
    ops = CustomOpSelection(CompilationConfig(level=0, custom_ops=["none", *switched_on]))
    gated, stream = norm_gate_up(RMSNormLinear(ops), LinearActivation(ops), hidden, residual, norm, mlp)
    torch.testing.assert_close(stream, hidden + residual, **EXACT)
    torch.testing.assert_close(gated, mlp.act_fn(gate_up(norm(hidden + residual))), **EXACT)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_the_fused_residual_add_makes_the_add_the_next_norm_would_have_made(dtype):
    norm, _, down, _, residual = _operands(DTYPES[dtype], seed=2)
    x = torch.randn(7, 48, generator=torch.Generator().manual_seed(3)).to(DTYPES[dtype])
    layer = LinearResidualAdd(BOTH)
    hidden, deferred = layer.forward_native(x, residual, down)
    stream, nothing = layer.forward_custom(x, residual, down)
    assert deferred is residual and nothing is None
    torch.testing.assert_close(stream, hidden + residual, **EXACT)
    torch.testing.assert_close(norm(stream), norm(hidden, residual)[0], **EXACT)


class _ProjectOpCalls(TorchDispatchMode):
    """Counts the ``reference::`` ops dispatched (the fused op by its epilogue and whether it has a norm)."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "reference":
            name = func.name().split("::")[1].split(".")[0]
            if name == "fused_linear":
                name += f"[{'norm+' if args[2] is not None else ''}{args[5]}]"
            self.calls[name] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("unfusable", ["bias", "sharded"])
def test_a_biased_or_sharded_linear_is_left_unfused(unfusable):
    """The kernel has no bias, and a row-parallel GEMM's all-reduce comes before its residual add: such a layer
    runs the unfused ops, whatever the switch says, and gives their results."""
    norm, gate_up, down, hidden, residual = _operands(torch.float32, seed=4, bias=unfusable == "bias")
    if unfusable == "sharded":  # what a rank of two holds (the all-reduce itself is test_tensor_parallel's)
        gate_up.tp = down.tp = SimpleNamespace(size=2, rank=0)
        down.forward = lambda x: torch.nn.functional.linear(x, down.weight)
    x = torch.randn(7, 48)
    act = SiluAndMul(BOTH)
    with _ProjectOpCalls() as recorder:
        y, stream = RMSNormLinear(BOTH).forward_custom(hidden, residual, norm, gate_up, act)
        gated = LinearActivation(BOTH).forward_custom(hidden, gate_up, act)
        out, nothing = LinearResidualAdd(BOTH).forward_custom(x, residual, down)
    assert not any(name.startswith("fused_linear") for name in recorder.calls), recorder.calls
    torch.testing.assert_close(y, act(gate_up(norm(hidden + residual))), **EXACT)
    torch.testing.assert_close(stream, hidden + residual, **EXACT)
    torch.testing.assert_close(gated, act(gate_up(hidden)), **EXACT)
    torch.testing.assert_close(out, down(x) + residual, **EXACT)
    assert nothing is None


def test_a_plain_linear_without_a_group_is_fused():
    """An ``nn.Linear`` of a model built without tensor parallelism has no ``tp``: one rank, fusable."""
    norm, gate_up, _, hidden, _ = _operands(torch.float32, seed=7)
    plain = torch.nn.Linear(64, 96, bias=False)
    plain.weight = gate_up.weight
    act = SiluAndMul(BOTH)
    with _ProjectOpCalls() as recorder:
        gated = LinearActivation(BOTH).forward_custom(hidden, plain, act)
    assert recorder.calls == {"fused_linear[silu_and_mul]": 1}
    torch.testing.assert_close(gated, act(plain(hidden)), **EXACT)


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
def test_the_unfused_norm_linear_applies_the_activation_it_is_given(dtype):
    norm, gate_up, _, hidden, residual = _operands(DTYPES[dtype], seed=8)
    act = GeluTanhAndMul(BOTH)
    y, stream = RMSNormLinear(BOTH).forward_native(hidden, residual, norm, gate_up, act)
    torch.testing.assert_close(y, act(gate_up(norm(hidden + residual))), **EXACT)
    custom, _ = RMSNormLinear(BOTH).forward_custom(hidden, residual, norm, gate_up, act)
    torch.testing.assert_close(custom, y, **EXACT)


def _logits(model_name: str, custom_ops: list[str], recorder=None) -> torch.Tensor:
    config = CompilationConfig(level=0, custom_ops=custom_ops)
    net = registry.build_model(model_name, CustomOpSelection(config), dtype=torch.float32, device="cpu", seed=0)
    perturb_norms(net, seed=5)
    runner = ModelRunner(net, config, max_num_seqs=2, max_model_len=8)
    prefill = runner.step([[1, 2, 3], [4, 5]], [0, 0], [0, 1])  # [2, V]
    with recorder or torch.no_grad():
        decode = runner.step([[7], [9]], [3, 2], [0, 1])
    return torch.cat([prefill, decode])


def _subsets(model_name: str):
    usable = FUSIONS if "gemma" not in model_name else FUSIONS[:2]  # Gemma's post-norms leave no residual add to fuse
    return [s for r in range(len(usable) + 1) for s in itertools.combinations(usable, r)]


@pytest.mark.eager
@pytest.mark.parametrize("model_name", ["llama-tiny", "qwen3-tiny", "gemma-3-tiny"])
def test_a_model_gives_the_same_bits_under_every_subset_of_the_fusions(model_name):
    """The layers carry the residual stream deferred or whole depending on the switches (the module doc of
    reference.ops.fused_linear): a stream dropped or added twice, or a norm reading the wrong half of it,
    would change the logits."""
    unfused = _logits(model_name, ["all"])  # the fusions are opt-in
    for subset in _subsets(model_name)[1:]:
        fused = _logits(model_name, ["all", *(f"+{n}" for n in subset)])
        torch.testing.assert_close(fused, unfused, **EXACT, msg=lambda m: f"fusions {subset}: {m}")


@pytest.mark.eager
@pytest.mark.parametrize(
    "model_name, custom_ops, expected",
    [
        ("llama-tiny", ALL_FUSED, lambda n: {"fused_linear[norm+none]": n, "fused_linear[residual]": 2 * n,
                                            "fused_linear[norm+silu_and_mul]": n, "rms_norm": 1}),
        ("llama-tiny", ["all", "+rms_norm_linear", "+linear_residual_add"],
         lambda n: {"fused_linear[norm+none]": 2 * n, "fused_linear[residual]": 2 * n, "silu_and_mul": n,
                    "rms_norm": 1}),
        ("llama-tiny", ["all", "+linear_activation", "+linear_residual_add"],
         lambda n: {"rms_norm": 2 * n + 1, "fused_linear[silu_and_mul]": n, "fused_linear[residual]": 2 * n}),
        ("llama-tiny", ["all"], lambda n: {"rms_norm": 1, "fused_add_rms_norm": 2 * n, "silu_and_mul": n}),
        ("gemma-3-tiny", ALL_FUSED, lambda n: {"fused_linear[norm+none]": n, "fused_linear[norm+gelu_tanh_and_mul]": n,
                                              "rms_norm": 2 * n, "fused_add_rms_norm": 1}),
    ],
    ids=["llama-fused", "llama-no-activation", "llama-no-norm", "llama-all-unfused", "gemma-fused"],
)  # fmt: skip
def test_each_layer_runs_the_ops_the_selection_names(model_name, custom_ops, expected):
    """The project's ops in one decode step over n layers, RoPE and attention aside. With every fusion on, a
    Llama layer is four fused GEMMs and no norm or activation op of its own: the o and down GEMMs make the
    residual adds, so every norm reads its stream whole, the final one too (a plain ``rms_norm``). Unfused,
    the first layer's norm has no add to make (an ``rms_norm``), the others and the final norm each make one.
    Gemma keeps its two post-norms per layer and its deferred add into the final norm."""
    recorder = _ProjectOpCalls()
    _logits(model_name, custom_ops, recorder)
    layers = registry.model_config(model_name).get_text_config().num_hidden_layers
    skipped = ("attention", "rotary_embedding", "qk_norm_rope")
    assert {name: n for name, n in recorder.calls.items() if name not in skipped} == expected(layers)


@pytest.mark.parametrize("rows", [17, MAX_ROWS + 1], ids=["batch-17", "prefill-65"])
@pytest.mark.parametrize("norm_style", [None, "llama", "gemma"])
@pytest.mark.parametrize("epilogue", ["none", "residual", "silu_and_mul", "gelu_tanh_and_mul"])
def test_above_16_rows_the_cuda_path_composes_the_ops_the_reference_composes(rows, norm_style, epilogue, monkeypatch):
    """Above 16 rows (``KERNEL_MAX_ROWS``) the CUDA implementation runs the norm and activation ops around
    ``F.linear`` and never the small-M kernel; its host logic runs on CPU tensors too, where those ops run their
    references: the reference's bits. 17 rows is the least such step, a batch the kernel could still take (it
    takes up to 64, where the fused chain measured slower: perf/NOTES.md v33)."""
    kernel = SimpleNamespace(small_m_linear=lambda *a, **k: pytest.fail(f"the small-M kernel ran {rows} rows"))
    monkeypatch.setattr(fused_linear, "linear_kernels", kernel, raising=False)  # absent where Triton is
    gen = torch.Generator().manual_seed(9)
    x, weight = torch.randn(rows, 32, generator=gen), torch.randn(48, 32, generator=gen)
    residual = torch.randn(rows, 48, generator=gen) if epilogue == "residual" else None
    norm = (None, 0.0, 0.0)
    if norm_style is not None:
        norm = (torch.randn(32, generator=gen), 1e-6, float(norm_style == "gemma"))
    args = (x, weight, *norm, epilogue, residual)
    expected = fused_linear.fused_linear_reference(*args)
    torch.testing.assert_close(fused_linear._fused_linear_cuda(*args), expected, **EXACT)


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("normed", [True, False], ids=["norm", "no-norm"])
def test_up_to_16_rows_the_cuda_path_hands_the_small_m_kernel_the_call_it_was_given(rows, normed, monkeypatch):
    """The CUDA path's host logic on CPU tensors, the kernel spied on: at most 16 rows it is one call of
    ``small_m_linear`` with x, the weight, the epilogue, the residual and the norm as (weight, eps, offset),
    or None. K (32) is above 16, so a bound read off the wrong dimension shows too (the mutation run of
    2026-12-06: these lines run only on CUDA, and no CPU test read them)."""
    calls = []

    def kernel(x, weight, **kwargs):
        calls.append((x, weight, kwargs))
        return "the kernel's output"

    monkeypatch.setattr(fused_linear, "linear_kernels", SimpleNamespace(small_m_linear=kernel), raising=False)
    x, weight, residual = torch.randn(rows, 32), torch.randn(48, 32), torch.randn(rows, 48)
    norm_weight = torch.randn(32)
    args = (x, weight, norm_weight if normed else None, 1e-6, 1.0, "residual", residual)
    assert fused_linear._fused_linear_cuda(*args) == "the kernel's output"
    ((x_in, weight_in, kwargs),) = calls
    assert x_in is x and weight_in is weight and set(kwargs) == {"epilogue", "residual", "norm"}
    assert kwargs["epilogue"] == "residual" and kwargs["residual"] is residual
    if normed:
        assert kwargs["norm"][0] is norm_weight and kwargs["norm"][1:] == (1e-6, 1.0)
    else:
        assert kwargs["norm"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.parametrize("tokens", [8, 16, 17, 65], ids=["8-small-m-kernel", "16-small-m-kernel", "17-unfused", "65"])
def test_on_cuda_a_step_above_16_rows_runs_the_unfused_kernels_and_a_smaller_one_the_fused_one(tokens):
    """Above 16 rows (``KERNEL_MAX_ROWS``) the op composes today's kernels (the same bits as the unfused layers);
    at most 16 it runs the small-M kernel, within twice the unfused code's own error against float64."""
    from conformance.test_linear_kernels import _assert_within_twice_torchs_error

    norm, gate_up, _, hidden, residual = _operands(torch.bfloat16, seed=6, t=tokens)
    norm, gate_up, hidden, residual = norm.cuda(), gate_up.cuda(), hidden.cuda(), residual.cuda()
    fused, stream = RMSNormLinear(BOTH).forward_custom(hidden, residual, norm, gate_up)
    unfused, _ = RMSNormLinear(BOTH).forward_native(hidden, residual, norm, gate_up)
    if tokens > 16:
        torch.testing.assert_close(fused, unfused, **EXACT)
    else:
        nw = (norm.weight, norm.eps, norm.weight_offset)
        _assert_within_twice_torchs_error(fused, stream, gate_up.weight, "none", None, nw, torch.bfloat16)


@pytest.mark.parametrize("rows", [4, 65], ids=["decode", "prefill"])
def test_a_misspelt_epilogue_is_refused_not_run_as_a_plain_gemm(rows):
    """The reference (and the prefill path on CUDA, which composes the same way) ran a plain GEMM for an epilogue
    it did not know, where the small-M kernel refuses it: the new-user review of 2026-12-05."""
    x, weight = torch.randn(rows, 32), torch.randn(64, 32)
    with pytest.raises(ValueError, match=r"epilogue: expected one of \('none', 'residual', 'silu_and_mul', 'gelu"):
        fused_linear.fused_linear_op(x, weight, None, 0.0, 0.0, "relu", None)
