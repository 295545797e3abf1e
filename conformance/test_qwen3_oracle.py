"""Qwen3 (reference/models/qwen3.py) against transformers' Qwen3ForCausalLM, and across model modes.

Preset ``qwen3-tiny``: 2 layers, untied LM head, std-0.2 random weights, norm weights off the identity.
Transcript (conformance/oracle.py): prompts of 3, 7 and 12 tokens in one batch, 6 greedy decode steps,
then a 3-token extend step per sequence; logits compared after every step.
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config

from conformance.helpers import DEVICES, MODES
from conformance.oracle import OracleCase
from reference.config import mode_config
from reference.models.presets import QWEN3_TINY
from reference.models.qwen3 import Qwen3ForCausalLM
from reference.models.registry import build_model
from reference.ops import CustomOpSelection

PRESET = "qwen3-tiny"


@pytest.fixture(scope="module")
def case(impl) -> OracleCase:
    return OracleCase(PRESET, impl)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", MODES)
def test_logits_match_transformers_over_prefill_decode_and_extend(case, mode, device):
    case.assert_matches_oracle(mode, device)


@pytest.mark.eager
@pytest.mark.no_inductor
@pytest.mark.parametrize("device", DEVICES)
def test_no_inductor_is_bitwise_equal_to_eager(case, device):
    case.assert_no_inductor_bitwise_equal_to_eager(device)


@pytest.mark.parametrize("field, value", [("use_sliding_window", True), ("hidden_act", "gelu")])
@pytest.mark.requires("components")
def test_unsupported_config_is_rejected_naming_the_field(field, value):
    config = Qwen3Config(**{**QWEN3_TINY, field: value})
    with pytest.raises(ValueError, match=f"^{field}: expected"):
        Qwen3ForCausalLM(config, CustomOpSelection(mode_config("eager")))


@pytest.mark.requires("components")
def test_qwen3_8b_preset_has_the_published_parameter_count():
    # Model card of Qwen/Qwen3-8B: 8.2B parameters, 6.95B of them non-embedding (untied: embedding + head).
    model = build_model("qwen3-8b", CustomOpSelection(mode_config("eager")), dtype=torch.bfloat16, device="meta")
    total = sum(p.numel() for p in model.parameters())
    embedding = model.model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    assert round(total / 1e9, 1) == 8.2
    assert round((total - embedding) / 1e9, 2) == 6.95
