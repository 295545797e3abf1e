"""Gemma 3 (reference/models/gemma3.py) against transformers' Gemma3ForCausalLM, and across model modes.

Preset ``gemma-3-tiny``: local, global, local layers with a 4-token window and per-kind RoPE (linear x8
on the global layer), attention scale from ``query_pre_attn_scalar`` (not head_dim), tied embedding,
final logit soft-cap, std-0.2 random weights and norm weights off Gemma's identity (0).
Transcript (conformance/oracle.py): prompts of 3, 7 and 12 tokens in one batch (one shorter than the
window, two longer), 6 greedy decode steps, then a 3-token extend step per sequence; logits compared
after every step. Decoding past the window exercises the KV-cache window mask of the local layers.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig

from conformance.helpers import DEVICES, MODES
from conformance.oracle import OracleCase
from reference.config import mode_config
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.presets import GEMMA_3_TINY
from reference.models.registry import build_model
from reference.ops import CustomOpSelection

PRESET = "gemma-3-tiny"


@pytest.fixture(scope="module")
def case(impl) -> OracleCase:
    case = OracleCase(PRESET, impl)
    lens = [len(prompt) for prompt in case.transcript.steps[0]]
    window = case.config.sliding_window
    # The checks below only mean something if the transcript crosses the window both ways.
    assert min(lens) < window < max(lens) and case.transcript.max_seq_len > 2 * window
    assert set(case.config.layer_types) == {"sliding_attention", "full_attention"}
    return case


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_logits_match_transformers_over_prefill_decode_and_extend(case, mode, device):
    case.assert_matches_oracle(mode, device)


@pytest.mark.eager
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", DEVICES)
def test_no_inductor_is_bitwise_equal_to_eager(case, device):
    case.assert_no_inductor_bitwise_equal_to_eager(device)


@pytest.mark.parametrize(
    "field, value",
    [
        ("attn_logit_softcapping", 50.0),  # transformers' Gemma 3 ignores it; we refuse to guess
        ("hidden_activation", "gelu"),
        ("use_bidirectional_attention", True),
        ("layer_types", ["sliding_attention", "chunked_attention", "full_attention"]),
    ],
)
@pytest.mark.requires("components")
def test_unsupported_config_is_rejected_naming_the_field(field, value):
    # set after construction: some transformers versions (5.17) reject an unknown layer type themselves
    config = Gemma3TextConfig(**GEMMA_3_TINY)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        Gemma3ForCausalLM(config, CustomOpSelection(mode_config("eager")))


@pytest.mark.requires("components")
def test_gemma_3_4b_preset_has_the_published_parameter_count():
    # Gemma 3 technical report, Table 1: the 4B's language model has 3,209M non-embedding parameters.
    model = build_model("gemma-3-4b", CustomOpSelection(mode_config("eager")), dtype=torch.bfloat16, device="meta")
    assert model.lm_head.weight is model.model.embed_tokens.weight  # tied: counted once
    non_embedding = sum(p.numel() for p in model.parameters()) - model.model.embed_tokens.weight.numel()
    assert round(non_embedding / 1e6) == 3209
