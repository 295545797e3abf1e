"""Real checkpoint layouts load, and give transformers' logits: sharded, tied, multimodal Gemma 3.

Fixtures (written by ``fixtures/make_checkpoint_layouts.py``; ``fixtures/tiny-llama`` by
``make_tiny_llama.py``):

* ``tiny-qwen3-sharded``: Qwen/Qwen3-8B's layout: three shards and ``model.safetensors.index.json``, an
  untied ``lm_head.weight``, a layer straddling two shards.
* ``tiny-llama``: Llama 3.2 1B's tied embedding (no ``lm_head.weight`` in the file); its loading and logits
  are checked in ``test_loader.py`` and ``test_llama_oracle.py``, so it is not repeated here.
* ``tiny-gemma3-multimodal``: google/gemma-3-4b-it's layout, written by transformers'
  ``Gemma3ForConditionalGeneration.save_pretrained``: ``model_type: gemma3`` with a nested ``text_config``,
  the decoder under ``language_model.model.``, a vision tower and projector that the text decoder ignores.

Logits: our model built from the directory (our loader, fp32, CPU, eager) against transformers' model read
by transformers' own loader (``AutoModelForCausalLM.from_pretrained``: ``Qwen3ForCausalLM``, and for the
multimodal checkpoint the whole ``Gemma3ForConditionalGeneration`` fed text only), over the oracle's
transcript (conformance/oracle.py: prompts, greedy decode steps, an extend step), within ``ORACLE_ATOL``:
both sides read the same bf16 values and compute in fp32, so only summation order differs (see oracle.py).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import Gemma3ForConditionalGeneration, Gemma3TextConfig

from conformance.oracle import OracleCase, build_oracle
from reference.config import CompilationConfig
from reference.models.gemma3 import Gemma3ForCausalLM
from reference.models.loader import checkpoint_files, copy_from_hf, hf_state_dict
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SHARDED, MULTIMODAL = FIXTURES / "tiny-qwen3-sharded", FIXTURES / "tiny-gemma3-multimodal"
LAYOUTS = {"sharded": SHARDED, "gemma3-multimodal": MULTIMODAL}
# google/gemma-3-4b-it's config.json as published: its text_config names six fields and leaves the rest
# (vocab_size, num_attention_heads, head_dim, ...) to Gemma3TextConfig's defaults.
GEMMA_3_4B_IT_CONFIG = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "boi_token_index": 255999,
    "eoi_token_index": 256000,
    "eos_token_id": [1, 106],
    "image_token_index": 262144,
    "initializer_range": 0.02,
    "mm_tokens_per_image": 256,
    "model_type": "gemma3",
    "text_config": {
        "hidden_size": 2560,
        "intermediate_size": 10240,
        "model_type": "gemma3_text",
        "num_hidden_layers": 34,
        "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
        "sliding_window": 1024,
    },
    "torch_dtype": "bfloat16",
    "transformers_version": "4.50.0.dev0",
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}


def build(model, device="cpu"):
    return build_model(model, CustomOpSelection(CompilationConfig(level=0)), dtype=torch.float32, device=device)


def file_names(path: Path) -> list[str]:
    with safe_open(path, framework="pt") as f:
        return list(f.keys())


# ---------------------------------------------------------------------- logits
# Within ORACLE_ATOL (1e-4): both models read the same bf16 values into fp32 and differ only in summation
# order (fused GEMMs, SDPA, batching); measured at most 4e-6 here on logits of magnitude up to 8.
@pytest.mark.eager
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_logits_match_transformers_reading_the_same_directory(impl, layout):
    OracleCase(LAYOUTS[layout], impl).assert_matches_oracle("eager", "cpu")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_loads_exactly_the_weights_transformers_loads(layout):
    ours = hf_state_dict(build(LAYOUTS[layout]))
    hf = build_oracle(LAYOUTS[layout], None).state_dict()
    if layout == "gemma3-multimodal":  # the language model's tensors, under the text model's names
        text = ("model.language_model.", "lm_head.")
        hf = {n.replace(text[0], "model."): t for n, t in hf.items() if n.startswith(text)}

    assert ours.keys() == hf.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], hf[name], rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------- sharded
def test_sharded_fixture_is_sharded_by_its_index_and_untied():
    index = json.loads((SHARDED / "model.safetensors.index.json").read_text())
    files = checkpoint_files(SHARDED)
    assert [f.name for f in files] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    held = {name: f.name for f in files for name in file_names(f)}
    assert held == index["weight_map"]  # each tensor in exactly the shard the index names
    layer_0 = {file for name, file in held.items() if name.startswith("model.layers.0.")}
    assert len(layer_0) == 2  # a layer straddles a shard boundary, as on the Hub
    assert "lm_head.weight" in held and not model_config(SHARDED).tie_word_embeddings


# ---------------------------------------------------------------------- multimodal Gemma 3
def test_multimodal_fixture_has_the_hub_layout():
    fields = json.loads((MULTIMODAL / "config.json").read_text())
    assert fields["model_type"] == "gemma3" and fields["text_config"]["model_type"] == "gemma3_text"
    assert fields["vision_config"]["model_type"] == "siglip_vision_model"
    names = file_names(MULTIMODAL / "model.safetensors")
    prefixes = {n.split(".")[0] for n in names}
    assert prefixes == {"language_model", "vision_tower", "multi_modal_projector"}
    assert all(n.startswith("language_model.model.") for n in names if n.startswith("language_model."))
    assert not any("lm_head" in n for n in names)  # tied
    assert isinstance(build_oracle(MULTIMODAL, None), Gemma3ForConditionalGeneration)


def test_multimodal_config_gives_the_text_decoder_with_the_top_level_generation_fields():
    config = model_config(MULTIMODAL)
    assert isinstance(config, Gemma3TextConfig) and config.model_type == "gemma3_text"
    assert config.eos_token_id == [1, 106]  # the top level's, with <end_of_turn>; the text config says 1
    assert config.dtype == torch.bfloat16  # the top level's torch_dtype
    assert config.tie_word_embeddings  # transformers ties by the top-level config
    assert config.layer_types == ["sliding_attention", "full_attention", "sliding_attention"]
    assert config.rope_parameters["full_attention"] == {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}
    assert isinstance(build(MULTIMODAL), Gemma3ForCausalLM)


def test_multimodal_top_level_untied_config_unties_the_decoder(tmp_path):
    fields = json.loads((MULTIMODAL / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**fields, "tie_word_embeddings": False}))
    assert not model_config(tmp_path).tie_word_embeddings


def test_published_gemma_3_4b_it_config_gives_the_gemma_3_4b_preset_decoder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(GEMMA_3_4B_IT_CONFIG))
    config, preset = model_config(tmp_path), model_config("gemma-3-4b")

    fields = [
        "vocab_size",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "query_pre_attn_scalar",
        "sliding_window",
        "layer_types",
        "rope_parameters",
        "tie_word_embeddings",
        "rms_norm_eps",
    ]
    assert {f: getattr(config, f) for f in fields} == {f: getattr(preset, f) for f in fields}
    with torch.device("meta"):
        ours = Gemma3ForCausalLM(config, CustomOpSelection(CompilationConfig(level=0)))
    expected = {n: t.shape for n, t in build("gemma-3-4b", "meta").state_dict().items()}
    assert {n: t.shape for n, t in ours.state_dict().items()} == expected


def test_transformers_in_memory_names_load_too():
    """transformers 5.x names the decoder ``model.language_model.`` in memory (``state_dict()``), where its
    files say ``language_model.model.``; both load."""
    hf = build_oracle(MULTIMODAL, None)
    ours = build(MULTIMODAL)
    with torch.no_grad():
        for parameter in ours.parameters():
            parameter.zero_()

    copy_from_hf(ours, hf)

    expected = build(MULTIMODAL).state_dict()
    for name, tensor in ours.state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------- the committed fixtures
def test_fixtures_are_small():
    for directory in LAYOUTS.values():
        size = sum(f.stat().st_size for f in directory.iterdir())
        assert size < 400_000, f"{directory.name} is {size} bytes"


def test_fixture_script_reproduces_the_committed_fixtures(tmp_path):
    spec = importlib.util.spec_from_file_location("make_checkpoint_layouts", FIXTURES / "make_checkpoint_layouts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.write_all(tmp_path)

    for directory in LAYOUTS.values():
        new_dir = tmp_path / directory.name
        assert sorted(p.name for p in new_dir.iterdir()) == sorted(p.name for p in directory.iterdir())
        for path in directory.glob("*.json"):
            assert json.loads((new_dir / path.name).read_text()) == json.loads(path.read_text()), path.name
        for path in directory.glob("*.safetensors"):
            with safe_open(new_dir / path.name, "pt") as new, safe_open(path, "pt") as old:
                assert sorted(new.keys()) == sorted(old.keys()), path.name
                for key in old.keys():
                    torch.testing.assert_close(new.get_tensor(key), old.get_tensor(key), rtol=0, atol=0, msg=key)
