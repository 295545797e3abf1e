"""Presets, model construction (device, dtype, seeds, shared weights) and decode-step weight bytes."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import Gemma3TextConfig, MistralConfig

from reference.config import CompilationConfig
from reference.models.presets import PRESETS
from reference.models.registry import build_model, model_class, model_config
from reference.models.toy_llama import ToyLlama, expected_hidden
from reference.models.weights import init_random_weights, weight_bytes_per_decode_step
from reference.ops import CustomOpSelection, RMSNorm, RotaryEmbedding

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

# Published sizes: Llama 3.2 1B's parameter count on its model page; for 3.1 8B and 70B, half the bf16
# "total_size" (bytes) of their model.safetensors.index.json.
PUBLISHED_PARAMETERS = {
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.1-8b": 16_060_522_496 // 2,
    "llama-3.1-70b": 141_107_412_992 // 2,
}


def eager_ops() -> CustomOpSelection:
    return CustomOpSelection(CompilationConfig(level=0))


def build(model="llama-tiny", *, dtype=torch.float32, device="cpu", ops=None, **kwargs):
    return build_model(model, ops or eager_ops(), dtype=dtype, device=device, **kwargs)


def unique_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


# ---------------------------------------------------------------------- presets
@pytest.mark.parametrize("preset", sorted(PUBLISHED_PARAMETERS))
def test_llama_presets_have_the_published_parameter_count(preset):
    assert unique_parameters(build(preset, dtype=torch.bfloat16, device="meta")) == PUBLISHED_PARAMETERS[preset]


@pytest.mark.parametrize(("preset", "factor", "tied"), [("llama-3.2-1b", 32.0, True), ("llama-3.1-8b", 8.0, False)])
def test_llama_presets_use_llama3_rope_scaling(preset, factor, tied):
    config = model_config(preset)
    assert config.rope_parameters == dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=factor,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    assert config.tie_word_embeddings is tied
    assert (config.max_position_embeddings, config.rms_norm_eps, config.vocab_size) == (131072, 1e-5, 128256)


def test_presets_return_a_fresh_config_each_time():
    first = model_config("llama-tiny")
    first.rope_parameters["factor"] = 99.0
    assert model_config("llama-tiny").rope_parameters["factor"] != 99.0


def test_unknown_model_error_lists_presets_and_asks_for_config_json():
    with pytest.raises(ValueError) as error:
        model_config("llama-9b")
    message = str(error.value)
    assert "'llama-9b'" in message and "config.json" in message
    assert all(name in message for name in PRESETS)


def test_directory_without_config_json_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="directory without config.json"):
        model_config(tmp_path)


@pytest.mark.parametrize("name", ["", "  "])
def test_an_empty_model_name_is_called_empty_not_the_working_directory(name):
    """Path('') is '.', a directory: the message must name the real mistake."""
    with pytest.raises(ValueError, match=r"model: '\s*' is empty; expected a preset"):
        model_config(name)


def test_unsupported_model_type_is_named():
    with pytest.raises(ValueError, match=r"model_type: 'mistral' is not supported; supported: \[.*'llama'"):
        model_class(MistralConfig())


def test_non_float_dtype_is_rejected():
    with pytest.raises(ValueError, match=r"dtype: expected a floating-point torch.dtype"):
        build(dtype=torch.int8)


# ---------------------------------------------------------------------- construction
def test_build_in_bf16_keeps_the_rotary_table_float32():
    fp32, bf16 = build(dtype=torch.float32), build(dtype=torch.bfloat16)

    assert torch.get_default_dtype() == torch.float32  # restored after building
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    tables = [m.cos_sin_cache for m in bf16.modules() if isinstance(m, RotaryEmbedding)]
    expected = [m.cos_sin_cache for m in fp32.modules() if isinstance(m, RotaryEmbedding)]
    assert tables and len(tables) == len(expected)
    for table, reference in zip(tables, expected):
        assert table.dtype == torch.float32
        torch.testing.assert_close(table, reference, rtol=0, atol=0)


def test_seed_decides_the_random_weights():
    a, b, c = build(seed=0), build(seed=0), build(seed=1)
    for (name, x), y, z in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(x, y), name
        if name.endswith(("proj.weight", "embed_tokens.weight", "lm_head.weight")):
            assert not torch.equal(x, z), name


@pytest.mark.parametrize("model", ["llama-tiny", "gemma-3-tiny"])
def test_building_a_model_leaves_the_global_random_stream_alone(model):
    """Every parameter is written after construction (a checkpoint, or ``init_random_weights`` from its own
    seeded generator), so the layers' own construction-time init (nn.Linear's kaiming_uniform_, nn.Embedding's
    normal_) is work thrown away: on a CPU, seconds for a 270M model. Skipped, it draws nothing, and a user's
    ``torch.manual_seed`` stream is the same after a build as before."""
    torch.manual_seed(1234)
    expected = torch.rand(4)
    torch.manual_seed(1234)
    build(model)
    assert torch.equal(torch.rand(4), expected)


def test_random_init_follows_transformers_conventions():
    model = build()
    std = model.config.initializer_range
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            assert torch.equal(param, torch.ones_like(param)), name
        else:
            # >= 4096 samples each: the sample std is within ~2% of the true one (6 sigma < 10%)
            assert abs(param.std().item() / std - 1) < 0.1, name
            assert abs(param.mean().item()) < 6 * std / param.numel() ** 0.5, name


def test_random_init_puts_gemma_style_norms_at_zero():
    """Gemma's RMSNorm multiplies by (1 + weight), so its identity is weight 0."""
    config = Gemma3TextConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, max_position_embeddings=64, sliding_window=8,
    )  # fmt: skip
    model = model_class(config)(config, eager_ops())
    init_random_weights(model, seed=0)
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    assert norms and all(m.weight_offset == 1.0 and not m.weight.any() for m in norms)


def test_random_init_refuses_a_parameter_it_has_no_rule_for():
    model = build()
    model.model.extra = nn.Module()
    model.model.extra.scale = nn.Parameter(torch.ones(3))
    with pytest.raises(TypeError, match=r"model\.extra\.scale"):
        init_random_weights(model, seed=0)


def test_toy_llama_preset_keeps_its_closed_form():
    model = build("toy-llama")
    ids = [3, 17, 5, 60, 0]
    assert isinstance(model, ToyLlama)
    with torch.no_grad():
        hidden = model(torch.tensor(ids), torch.arange(len(ids)))
    # float32 arithmetic against float64 closed form: a few float32 ulps of O(1) values
    torch.testing.assert_close(hidden.double(), expected_hidden(ids, model.config), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------- shared weights
def test_share_weights_with_reuses_tensors_and_keeps_own_custom_op_choices():
    base = build("toy-llama")  # tied embeddings
    inductor_ops = CustomOpSelection(CompilationConfig(level=3, use_inductor=True))

    other = build("toy-llama", ops=inductor_ops, share_weights_with=base)

    for (name, mine), theirs in zip(other.named_parameters(), base.parameters()):
        assert mine is theirs, name
    for (name, mine), theirs in zip(other.named_buffers(), base.buffers()):
        assert mine is theirs, name
    assert other.lm_head.weight is other.model.embed_tokens.weight
    assert inductor_ops.summary()["enabled"] == []
    assert not other.model.norm.use_custom and base.model.norm.use_custom


def test_share_weights_with_a_different_model_is_rejected():
    with pytest.raises(ValueError, match="share_weights_with: the models' tensors differ"):
        build("llama-tiny", share_weights_with=build("toy-llama"))


def test_share_weights_with_another_dtype_is_rejected():
    with pytest.raises(ValueError, match=r"share_weights_with: its parameters are torch.float32 on cpu"):
        build(dtype=torch.bfloat16, share_weights_with=build())


# ---------------------------------------------------------------------- decode-step bytes
def test_llama_3_1_8b_streams_15_01_gb_of_bf16_weights_per_decode_step():
    model = build("llama-3.1-8b", dtype=torch.bfloat16, device="meta")  # shapes only, nothing allocated
    # every published parameter is read once per step, except the untied input embedding (gathered)
    embedding = model.config.vocab_size * model.config.hidden_size

    nbytes = weight_bytes_per_decode_step(model)

    assert nbytes == 2 * (PUBLISHED_PARAMETERS["llama-3.1-8b"] - embedding)
    assert round(nbytes / 1e9, 2) == 15.01
    assert all(p.is_meta for p in model.parameters())


def test_tied_embedding_counts_once_and_untied_embedding_not_at_all():
    tied = build("llama-3.2-1b", dtype=torch.bfloat16, device="meta")
    untied = build("llama-3.1-8b", dtype=torch.bfloat16, device="meta")
    assert weight_bytes_per_decode_step(tied) == 2 * unique_parameters(tied)
    embedding = untied.model.embed_tokens.weight.numel()
    assert weight_bytes_per_decode_step(untied) == 2 * (unique_parameters(untied) - embedding)
