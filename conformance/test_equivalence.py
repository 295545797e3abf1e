"""Equivalence: every mode, split or not, computes the same function as eager PyTorch.

Three kinds of oracle, from strongest to weakest:

* Closed forms (silly model, toy Llama), computed in float64 from the models' definitions alone.
* Eager mode itself: ``no_inductor`` runs the same torch functions and custom ops on the same shapes as
  eager, so at the same token count it must be *bitwise* equal (on CUDA too: a CUDA graph replays the
  very kernels it recorded).
* For Inductor, which may fuse and reorder reductions, a higher-precision run of the same weights: the
  mode may not be more than twice as far from it as eager is (``assert_error_within_twice_eager``).
"""

from __future__ import annotations

import pytest
import torch

from conformance.driver import prefill_and_decode
from conformance.helpers import (
    DEVICES,
    MODES,
    StaticTokens,
    assert_error_within_twice_eager,
    make_runner,
    small_llama_config,
    token_ids,
)
from reference.config import mode_config
from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output
from reference.models.toy_llama import TOY_SPLITTING_OPS, ToyLlama, expected_hidden, toy_llama_config
from reference.ops import CustomOpSelection

CAPTURE_SIZES = [4, 8]
# The toy model is called with these token counts, in order: on CUDA size 8 is warmed up, captured and
# replayed, then size 4; 6 is not a capture size and runs without a graph. Every call has new token ids.
TOY_CALL_SIZES = [8, 8, 8, 4, 4, 4, 6, 8]

# Closed-form tolerance. The toy model runs in float32 on values of order 1, and the float64 closed form
# follows the same formula, so each result carries the rounding of a few dozen float32 operations
# (~1e-7 each, measured max 2e-7). Inductor may reorder the sums inside norms and projections, which
# moves the result by a few float32 ulps more. torch's float32 defaults (rtol 1.3e-6, atol 1e-5) admit
# that and nothing larger: a wrong residual, norm or attention weight changes the result by > 1e-2.
FP32_CLOSE = dict(rtol=1.3e-6, atol=1e-5)

TOY_CASES = [
    pytest.param("eager", None, None, id="eager"),
    pytest.param("eager", None, ["none"], id="eager-custom_ops=none"),
    pytest.param("no_inductor", TOY_SPLITTING_OPS, None, id="no_inductor-split"),
    pytest.param("no_inductor", [], None, id="no_inductor-unsplit"),
    pytest.param("no_inductor", TOY_SPLITTING_OPS, ["none"], id="no_inductor-split-custom_ops=none"),
    pytest.param("inductor", TOY_SPLITTING_OPS, None, id="inductor-split"),
    pytest.param("inductor", [], None, id="inductor-unsplit"),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode, splitting_ops, custom_ops", TOY_CASES)
def test_toy_llama_matches_its_closed_form(mode, splitting_ops, custom_ops, device, impl):
    overrides = {"cudagraph_capture_sizes": CAPTURE_SIZES}
    if splitting_ops is not None:
        overrides["splitting_ops"] = splitting_ops
    if custom_ops is not None:
        overrides["custom_ops"] = custom_ops
    config = mode_config(mode, **overrides)
    hf = toy_llama_config(num_layers=2)
    compiled = impl.compile(ToyLlama(hf, CustomOpSelection(config)).to(device), config)
    tokens = StaticTokens(max(TOY_CALL_SIZES), device)
    with torch.no_grad():
        for call, size in enumerate(TOY_CALL_SIZES):
            ids = token_ids(size, hf.vocab_size, seed=call)
            hidden = compiled(*tokens(ids))
            torch.testing.assert_close(
                hidden.double().cpu(), expected_hidden(ids, hf), **FP32_CLOSE, msg=lambda m: f"call {call}: {m}"
            )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_silly_model_matches_its_closed_form(mode, device, impl):
    config = mode_config(mode, splitting_ops=SILLY_SPLITTING_OPS, cudagraph_capture_sizes=[2, 4])
    compiled = impl.compile(SillyModel(), config)
    buffer = torch.zeros(4, 16, device=device)
    for size in (4, 4, 4, 2, 2, 2, 3, 4):
        x = buffer[:size]
        x.copy_(torch.randn(x.shape))
        # exact: the closed form performs the model's IEEE operations in the model's order
        torch.testing.assert_close(compiled(x), expected_output(x), rtol=0, atol=0)


LLAMA_DEVICES = [
    pytest.param("cpu", torch.float32, id="cpu-fp32"),
    pytest.param("cuda", torch.bfloat16, id="cuda-bf16", marks=pytest.mark.gpu),
]


@pytest.mark.eager
@pytest.mark.parametrize("device, dtype", LLAMA_DEVICES)
@pytest.mark.parametrize("mode", ["no_inductor", "breakable", "no_inductor_full"])
def test_inductor_free_modes_are_bitwise_equal_to_eager_with_the_same_custom_ops(mode, device, dtype, impl):
    """Prefill (24 tokens) and decode (4 tokens) both run at capture sizes, so on CUDA every step replays
    CUDA graphs (piecewise graphs or breakable segments for the prefill; for ``no_inductor_full`` a full
    graph for each decode step); the second round, with other prompts, replays the same graphs on new input
    contents and would expose a graph reading a buffer that was reallocated since capture, or a full graph
    that kept one step's lengths."""
    hf = small_llama_config()
    runners = {
        name: make_runner(impl, name, hf, device=device, dtype=dtype, max_cudagraph_capture_size=32)
        for name in ("eager", mode)
    }
    assert runners[mode].config.custom_ops == ("all",)
    assert runners["eager"].config.custom_ops_default  # eager: all custom ops by default, the same set
    for runner in runners.values():
        runner.warm_up()
    for round_, lengths in enumerate(([5, 7, 3, 9], [9, 3, 7, 5])):
        prompts = [token_ids(n, hf.vocab_size, seed=10 * round_ + i) for i, n in enumerate(lengths)]
        assert sum(lengths) in runners[mode].capture_sizes or device == "cpu"
        logits = prefill_and_decode(runners, prompts, num_decode=6, leader="eager")
        for step, (eager, ours) in enumerate(zip(logits["eager"], logits[mode])):
            assert torch.equal(ours, eager), f"round {round_} step {step}: max diff {(ours - eager).abs().max()}"


@pytest.mark.eager
@pytest.mark.inductor
def test_inductor_is_at_most_twice_as_far_as_eager_from_float64_on_cpu(impl):
    """Inductor (float32, fused) vs eager (float32) against the same weights run in float64."""
    hf = small_llama_config(num_hidden_layers=1)  # one layer: Inductor compiles take seconds on CPU
    runners = {
        "reference": make_runner(impl, "eager", hf, dtype=torch.float64),
        "eager": make_runner(impl, "eager", hf),
        "inductor": make_runner(impl, "inductor", hf),
    }
    for runner in runners.values():
        runner.warm_up()
    prompts = [token_ids(n, hf.vocab_size, seed=i) for i, n in enumerate([5, 7, 3])]
    logits = prefill_and_decode(runners, prompts, num_decode=3, leader="reference")
    for reference, eager, inductor in zip(logits["reference"], logits["eager"], logits["inductor"]):
        assert_error_within_twice_eager(inductor, eager, reference)
