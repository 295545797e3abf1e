"""Llama (reference/models/llama.py) against transformers' ``LlamaForCausalLM``, and across model modes.

Subjects: the ``llama-tiny`` preset (random std-0.2 weights, llama3 RoPE scaling in all three bands) and
the committed ``fixtures/tiny-llama`` checkpoint (read by our loader and by transformers' own).
Transcript (conformance/oracle.py): prompts of 5, 12, 1 and 8 tokens in one batch (one of them a single
token: the prefill path with nothing to attend to but itself), 4 greedy decode steps, then a 3-token
extend step per sequence; logits compared after every step, within ``ORACLE_ATOL`` (see oracle.py).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from conformance.helpers import DEVICES, MODES
from conformance.oracle import OracleCase
from reference.models.registry import model_config

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama"
MODELS = {"llama-tiny": "llama-tiny", "fixture": str(FIXTURE)}


@pytest.fixture(scope="module", params=list(MODELS))
def case(request, impl) -> OracleCase:
    return OracleCase(MODELS[request.param], impl, prompt_lens=(5, 12, 1, 8), decode_steps=4)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_logits_match_transformers_over_prefill_decode_and_extend(case, mode, device):
    case.assert_matches_oracle(mode, device)


@pytest.mark.eager
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", DEVICES)
def test_no_inductor_is_bitwise_equal_to_eager(case, device):
    case.assert_no_inductor_bitwise_equal_to_eager(device)


@pytest.mark.eager
@pytest.mark.parametrize("mode", ["eager", "no_inductor"])
def test_custom_ops_on_cpu_are_bitwise_equal_to_forward_native(case, mode):
    """On CPU a custom op runs the very function ``forward_native`` calls (reference.ops.library), and
    no_inductor runs the traced ops as they are: with every custom op on, the logits must equal plain
    eager PyTorch's (``custom_ops=['none']``) bit for bit. Bitwise equality assumes the same shapes, so
    no_inductor captures the transcript's own token counts and pads nothing (see
    ``OracleCase.assert_no_inductor_bitwise_equal_to_eager``)."""
    native = case.ours("eager", custom_ops=["none"])
    sizes = {"cudagraph_capture_sizes": case.exact_capture_sizes} if mode == "no_inductor" else {}
    for step, (ours, expected) in enumerate(zip(case.ours(mode, **sizes), native)):
        torch.testing.assert_close(ours, expected, rtol=0, atol=0, msg=lambda m: f"step {step}: {m}")


@pytest.mark.requires("components")
def test_llama_tiny_rope_frequencies_span_all_llama3_bands():
    """llama-tiny exists to exercise llama3 scaling: some frequencies must be kept, some divided by the
    factor and some interpolated between the two (Meta's scheme, as transformers implements it)."""
    config = model_config("llama-tiny")
    unscaled = copy.deepcopy(config)
    unscaled.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
    ratio = LlamaRotaryEmbedding(config).inv_freq / LlamaRotaryEmbedding(unscaled).inv_freq
    factor = config.rope_parameters["factor"]  # ratio 1: kept, 1/factor: scaled, in between: interpolated
    kept = torch.isclose(ratio, torch.tensor(1.0))
    divided = torch.isclose(ratio, torch.tensor(1 / factor))
    assert kept.any() and divided.any() and (~kept & ~divided).any(), ratio.tolist()
