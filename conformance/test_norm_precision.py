"""Gemma's RMSNorm in bf16 rounds once: ``(1 + w) * norm(x)`` is computed in fp32 and cast at the end.

transformers' ``Gemma3RMSNorm`` (the oracle) normalises in fp32, multiplies by ``1 + w`` in fp32 and casts
the product to the input dtype, so its bf16 output is the fp32 result rounded once. Rounding to nearest
moves a value by at most half a bf16 ulp, a relative error of at most 2**-8, so that is the tolerance:
against the oracle's fp32 result (on the same bf16 inputs), every element must be within 2**-8 relative,
plus 2**-20 for the fp32 rounding of the norm itself. ``test_custom_ops.py`` compares with the bf16
oracle at torch's default bf16 tolerance (rtol 1.6e-2, four ulps), which cannot tell one rounding from
several: a norm that rounds to bf16 and then multiplies by ``1 + w`` in bf16 (Llama's order, wrong for
Gemma) rounds two or three times and reaches about 2.5 x 2**-8.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

from reference.config import CompilationConfig
from reference.ops import CustomOpSelection, RMSNorm

pytestmark = pytest.mark.requires("components")

ONE_ROUNDING = 2.0**-8 + 2.0**-20  # see the module docstring
HIDDEN, EPS = 256, 1e-6


@pytest.mark.parametrize("custom", [False, True], ids=["native", "custom_op"])
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "fused_residual"])
def test_gemma_norm_in_bf16_is_the_fp32_result_rounded_once(custom, with_residual):
    generator = torch.Generator().manual_seed(0)
    x, residual = (torch.randn(64, HIDDEN, generator=generator).to(torch.bfloat16) for _ in range(2))
    weight = (0.3 * torch.randn(HIDDEN, generator=generator)).to(torch.bfloat16)  # off Gemma's identity (0)
    layer = RMSNorm(CustomOpSelection(CompilationConfig(level=0)), HIDDEN, EPS, weight_offset=1.0).to(torch.bfloat16)
    oracle = Gemma3RMSNorm(HIDDEN, EPS)  # fp32
    with torch.no_grad():
        layer.weight.copy_(weight)
        oracle.weight.copy_(weight.float())
        forward = layer.forward_custom if custom else layer.forward_native
        if with_residual:
            ours, summed = forward(x, residual)
            assert torch.equal(summed, x + residual)
        else:
            ours, summed = forward(x), x
        expected = oracle(summed.float())  # fp32 result on the same bf16 inputs
    assert ours.dtype == torch.bfloat16
    error, bound = (ours.double() - expected.double()).abs(), ONE_ROUNDING * expected.double().abs()
    worst = (error / bound).max().item()
    assert (error <= bound).all(), f"error up to {worst:.2f} x the bound of one bf16 rounding ({ONE_ROUNDING:.3g})"
