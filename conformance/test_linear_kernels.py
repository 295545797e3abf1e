"""The small-M GEMM kernel (``reference.ops.linear_kernels``) against the torch code it fuses: RMSNorm, the GEMM,
the residual add or the gated activation, over token counts, shapes, dtypes, strides and K splits.

Tolerance, relative to a baseline as flash-attention's tests set theirs: the kernel's largest error against a
float64 computation of the same formula must be at most twice that of a torch computation in the same dtype
that rounds where the kernel rounds (only the order of the sums differs, which moves a rounding by one step of
the output dtype at most), plus 2**-20 of the largest output for an error that happens to be 0. Without the
norm that computation is the unfused torch code itself. With it the kernel rounds ``x * w`` for its dot and
applies rstd to the fp32 sums (linear_kernels' module doc), one rounding fewer than ``rms_norm`` then the GEMM;
with a few outputs per case either scheme can land one step of the output dtype further from the exact value
than the other, so the bound takes the larger of the two schemes' errors: the kernel must be as accurate as the
unfused code or as its own rounding scheme computed by torch, within the factor of 2. (Bounded by the unfused
code's error alone, about 1 float16 case in 30 failed at one step past it: the new-user review of 2026-12-05.)

On a GPU machine these run on CUDA (``tox -e gpu``). Without one, Triton's interpreter runs them on the CPU:
``TRITON_INTERPRET=1 pytest conformance/test_linear_kernels.py`` with Triton installed (the same arithmetic and
masks; its programs run one after another, so the split-K tickets arrive in order). The interpreter has no
bfloat16 arithmetic (Triton's debugging guide says so; measured with Triton 3.6: a bf16 ``tl.dot`` multiplies
bit patterns, triton-lang/triton#11584, and fp32-to-bf16 casts truncate), so bfloat16 cases run on CUDA only.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from reference.ops.layernorm import rms_norm_reference
from reference.ops.library import HAS_TRITON

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = [
    pytest.mark.requires("components"),
    pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed"),
    *([] if INTERPRETED else [pytest.mark.gpu]),
]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if INTERPRETED and name == "bf16":
        pytest.skip("Triton's interpreter has no bfloat16 arithmetic (module doc)")
    return DTYPES[name]


def _lk():
    from reference.ops import linear_kernels

    return linear_kernels


def _case(m, n, k, dtype, epilogue, norm_style, seed=0, x_stride=None):
    gen = torch.Generator().manual_seed(seed)
    rows = 2 * n if epilogue.endswith("_and_mul") else n
    big = torch.randn(m, x_stride or k, generator=gen)
    x = big.to(dtype).to(DEVICE)[:, :k]  # a strided view when x_stride > k
    weight = (torch.randn(rows, k, generator=gen) * k**-0.5).to(dtype).to(DEVICE)
    residual = torch.randn(m, n, generator=gen).to(dtype).to(DEVICE) if epilogue == "residual" else None
    norm = None
    if norm_style is not None:
        offset = 1.0 if norm_style == "gemma" else 0.0
        norm = ((torch.randn(k, generator=gen) * 0.1 + (0.0 if offset else 1.0)).to(dtype).to(DEVICE), 1e-6, offset)
    return x, weight, residual, norm


def _epilogue(y, epilogue, residual):
    if epilogue == "residual":
        return y + residual.to(y.dtype)
    if epilogue == "none":
        return y
    gate, up = y.chunk(2, dim=-1)
    act = F.silu(gate) if epilogue == "silu_and_mul" else F.gelu(gate, approximate="tanh")
    return act * up


def _unfused(x, weight, epilogue, residual, norm, dtype):
    """The torch code the kernel replaces, in ``dtype`` (float64: the exact answer to compare both against)."""
    x, weight = x.to(dtype), weight.to(dtype)
    if norm is not None:
        g, eps, offset = norm
        x = rms_norm_reference(x, g.to(dtype), eps, offset)
    return _epilogue(F.linear(x, weight), epilogue, residual)


def _in_kernel_order(x, weight, epilogue, residual, norm, dtype):
    """The same formula rounded where the kernel rounds (module doc): ``x * w`` rounded to ``dtype``, the GEMM's
    sums and rstd in float32, the result rounded, then the epilogue in ``dtype``."""
    g, eps, offset = norm
    x32 = x.float()
    xw = (x32 * (g.float() + offset)).to(dtype).float()
    rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    y = (F.linear(xw, weight.float()) * rstd).to(dtype)
    return _epilogue(y, epilogue, residual)


def _assert_within_twice_torchs_error(out, x, weight, epilogue, residual, norm, dtype):
    exact = _unfused(x, weight, epilogue, residual, norm, torch.float64)
    torch_error = (_unfused(x, weight, epilogue, residual, norm, dtype).double() - exact).abs().max().item()
    if norm is not None:
        ordered = _in_kernel_order(x, weight, epilogue, residual, norm, dtype)
        torch_error = max(torch_error, (ordered.double() - exact).abs().max().item())
    error = (out.double() - exact).abs().max().item()
    bound = 2 * torch_error + 2**-20 * exact.abs().max().item()
    assert error <= bound, f"kernel error {error:.3g} > {bound:.3g} (torch {dtype}: {torch_error:.3g})"


@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize("epilogue", ["none", "residual", "silu_and_mul", "gelu_tanh_and_mul"])
@pytest.mark.parametrize("norm_style", [None, "llama", "gemma"])
@pytest.mark.parametrize("m", [1, 5, 16, 33])
def test_the_fused_gemm_matches_the_torch_code_it_replaces(dtype, epilogue, norm_style, m):
    dtype = _dtype(dtype)
    x, weight, residual, norm = _case(m, 96, 320, dtype, epilogue, norm_style)
    out = _lk().small_m_linear(x, weight, epilogue=epilogue, residual=residual, norm=norm)
    assert out.shape == (m, 96) and out.dtype == dtype
    _assert_within_twice_torchs_error(out, x, weight, epilogue, residual, norm, dtype)


HALF = ["bf16", "fp16"]  # the 16-bit dtypes, where a rounding flipped by the order of the sums shows


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("split_k", [1, 2, 3, 16])
@pytest.mark.parametrize("epilogue", ["residual", "silu_and_mul"])
def test_every_split_of_k_adds_up_to_the_whole_product(dtype, split_k, epilogue):
    """K = 1000 is no multiple of the 128-wide tiles; 3 slices are 384, 384 and 232 wide; 16 slices leave most
    programs nothing to add, whose zero partials must still be counted in."""
    dtype = _dtype(dtype)
    x, weight, residual, norm = _case(8, 257, 1000, dtype, epilogue, "llama", seed=1)
    config = {"BLOCK_N": 64, "BLOCK_K": 128, "SPLIT_K": split_k, "num_warps": 4}
    out = _lk().small_m_linear(x, weight, epilogue=epilogue, residual=residual, norm=norm, config=config)
    _assert_within_twice_torchs_error(out, x, weight, epilogue, residual, norm, dtype)


@pytest.mark.parametrize("dtype", HALF)
def test_split_k_is_deterministic_and_leaves_its_counters_ready_for_the_next_launch(dtype):
    """The last program to arrive adds the partials in slice order, so two launches agree bitwise; a counter
    left above 0 would make the next launch's reduction happen early, from partials not yet written."""
    lk = _lk()
    x, weight, _, _ = _case(4, 200, 2048, _dtype(dtype), "none", None, seed=2)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 4, "num_warps": 4}
    first = lk.small_m_linear(x, weight, config=config)
    assert int(lk._counters(x.device)[:8].abs().sum()) == 0
    for _ in range(2):
        assert torch.equal(lk.small_m_linear(x, weight, config=config), first)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("split_k", [1, 2])
def test_a_strided_x_and_an_output_view_leave_every_other_row_alone(dtype, split_k):
    """x as the first K columns of wider rows (a fused projection's slice); out as the first M rows of a
    larger buffer whose padding rows hold a sentinel the kernel must not overwrite."""
    m, n, dtype = 5, 96, _dtype(dtype)
    x, weight, residual, norm = _case(m, n, 320, dtype, "residual", "gemma", seed=3, x_stride=384)
    assert x.stride(0) == 384
    buffer = torch.full((16, n), 7.0, dtype=dtype, device=DEVICE)
    config = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": split_k, "num_warps": 4}
    out = _lk().small_m_linear(x, weight, epilogue="residual", residual=residual, norm=norm, out=buffer[:m],
                               config=config)  # fmt: skip
    assert out.data_ptr() == buffer.data_ptr()
    assert bool((buffer[m:] == 7.0).all()), "rows past M written"
    _assert_within_twice_torchs_error(out, x, weight, "residual", residual, norm, dtype)


def test_zero_rows_launch_nothing_and_return_an_empty_output():
    x, weight, _, _ = _case(1, 96, 320, torch.bfloat16, "none", None)
    assert _lk().small_m_linear(x[:0], weight).shape == (0, 96)


def _bad(change):
    """small_m_linear's arguments for 4 x 320 by 96 x 320 bf16 with ``change(args)`` applied: args is a dict of
    x, weight and the keyword arguments."""

    def make():
        x, weight, _, _ = _case(4, 96, 320, torch.bfloat16, "none", None)
        args = {"x": x, "weight": weight}
        change(args)
        return args

    return make


def _zeros(*shape, dtype=torch.bfloat16):
    return torch.zeros(*shape, dtype=dtype, device=DEVICE)


_NORM = lambda k=320: (_zeros(k) + 1, 1e-6, 0.0)  # noqa: E731
_CONFIG = {"BLOCK_N": 32, "BLOCK_K": 64, "SPLIT_K": 2, "num_warps": 4}
BAD_ARGUMENTS = {  # id: (how the arguments are made bad, the message's start)
    "epilogue": (lambda a: a.update(epilogue="relu"), r"epilogue: expected one of \('none', 'residual', 'silu_and"),
    "no-residual": (lambda a: a.update(epilogue="residual"), r"residual: missing; epilogue 'residual' takes one"),
    "stray-residual": (lambda a: a.update(residual=_zeros(4, 96)), r"residual: given; epilogue 'none' takes none"),
    "too-many-rows": (lambda a: a.update(x=_zeros(65, 320)), r"x: 65 rows; small_m_linear takes at most 64"),
    "x-1d": (lambda a: a.update(x=_zeros(320)), r"x: expected an \[M, K\] tensor of one of"),
    "x-int": (lambda a: a.update(x=_zeros(4, 320, dtype=torch.int32)), r"x: expected an \[M, K\] tensor .*int32"),
    "x-k-zero": (lambda a: a.update(x=_zeros(4, 0), weight=_zeros(96, 0)), r"x: expected K >= 1"),
    "x-columns-strided": (lambda a: a.update(x=_zeros(320, 4).t()), r"x: expected K >= 1 and a contiguous last"),
    "weight-1d": (lambda a: a.update(weight=_zeros(320)), r"weight: expected an \[N, 320\] tensor"),
    "weight-k": (lambda a: a.update(weight=_zeros(96, 300)), r"weight: expected \[96, 320\] .* got \(96, 300\)"),
    "weight-dtype": (lambda a: a.update(weight=_zeros(96, 320, dtype=torch.float16)), r"weight: expected .*float16"),
    "gated-odd-rows": (lambda a: a.update(weight=_zeros(33, 320), epilogue="silu_and_mul"),
                       r"weight: a gated epilogue takes \[2I, K\]"),
    "residual-shape": (lambda a: a.update(epilogue="residual", residual=_zeros(4, 95)), r"residual: expected \[4, 9"),
    "residual-strided": (lambda a: a.update(epilogue="residual", residual=_zeros(96, 4).t()),
                         r"residual: expected \[4, 96\] .* got \(4, 96\) .* strides \(1, 4\)"),
    "residual-float": (lambda a: a.update(epilogue="residual", residual=0.5), r"residual: expected .* got float"),
    "out-shape": (lambda a: a.update(out=_zeros(3, 96)), r"out: expected \[4, 96\] torch.bfloat16"),
    "norm-length": (lambda a: a.update(norm=_NORM(319)), r"norm: expected a contiguous \[320\] float weight"),
    "norm-pair": (lambda a: a.update(norm=_NORM()[:2]), r"norm: expected \(norm_weight, eps, weight_offset\)"),
    "norm-eps-none": (lambda a: a.update(norm=(_NORM()[0], None, 0.0)), r"norm: expected \(norm_weight, eps, we"),
    "config-split": (lambda a: a.update(config={**_CONFIG, "SPLIT_K": -1}), r"config: SPLIT_K must be from 1 to 64"),
    "config-block": (lambda a: a.update(config={**_CONFIG, "BLOCK_N": 48}), r"config: BLOCK_N must be a power of two"),
    "config-empty": (lambda a: a.update(config={}), r"config: expected a dict of"),
}


@pytest.mark.parametrize("change, message", BAD_ARGUMENTS.values(), ids=BAD_ARGUMENTS.keys())
def test_bad_arguments_are_one_line_naming_the_argument(change, message):
    """Each refused before anything launches, in one line naming the argument (the new-user review of
    2026-12-05 found a negative SPLIT_K that returned an unwritten output, a short norm weight read past its
    end, and tracebacks from inside Triton for the rest)."""
    args = _bad(change)()
    with pytest.raises(ValueError, match=message) as error:
        _lk().small_m_linear(**args)
    assert "\n" not in str(error.value)


def test_more_column_blocks_than_the_split_k_counters_is_refused():
    """Each column block of a split-K launch takes tickets from a counter of its own; past ``_MAX_TILES``
    blocks there is none (an LM head of 128256 columns needs 8016 of BLOCK_N 16)."""
    lk = _lk()
    n = 16 * (lk._MAX_TILES + 1)
    x, weight = _zeros(1, 16), torch.empty(n, 16, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match=r"config: 65537 column blocks of BLOCK_N=16; split-K counts 65536 at most"):
        lk.small_m_linear(x, weight, config={"BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 2, "num_warps": 4})
