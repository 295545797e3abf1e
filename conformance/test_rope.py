"""RoPE frequencies (reference/models/rope.py) equal transformers' own, bitwise, for every preset and kind.

The models take their frequencies from :func:`reference.models.rope.rope_frequencies` rather than from
transformers' ``*RotaryEmbedding`` classes (whose modules are slow to import), so this is where a
difference between the two would show: a frequency off by one rounding moves every rotated position.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from reference.models.llama import head_dim
from reference.models.presets import PRESETS
from reference.models.rope import rope_frequencies

pytestmark = pytest.mark.requires("components")

ORACLE = {"llama": LlamaRotaryEmbedding, "qwen3": Qwen3RotaryEmbedding}


@pytest.mark.parametrize("preset", sorted(name for name in PRESETS if PRESETS[name]().model_type != "toy"))
def test_every_presets_frequencies_are_transformers_bitwise(preset):
    config = PRESETS[preset]()
    if config.model_type == "gemma3_text":
        oracle = Gemma3RotaryEmbedding(config)
        for layer_type in sorted(set(config.layer_types)):
            inv_freq, scaling = rope_frequencies(config, head_dim(config), layer_type)
            assert torch.equal(inv_freq, getattr(oracle, f"{layer_type}_inv_freq")), layer_type
            assert scaling == getattr(oracle, f"{layer_type}_attention_scaling"), layer_type
        return
    oracle = ORACLE[config.model_type](config)
    inv_freq, scaling = rope_frequencies(config, head_dim(config))
    assert inv_freq.dtype == torch.float32 and inv_freq.shape == (head_dim(config) // 2,)
    assert torch.equal(inv_freq, oracle.inv_freq)
    assert scaling == oracle.attention_scaling


@pytest.mark.parametrize(
    "rope",
    [
        dict(rope_type="default", rope_theta=10000.0),
        dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
        dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=512),
        dict(rope_type="dynamic", rope_theta=500000.0, factor=2.0),
    ],
    ids=lambda rope: rope["rope_type"],
)
def test_each_kind_of_rope_is_transformers_bitwise(rope):
    config = LlamaConfig(hidden_size=64, num_attention_heads=2, max_position_embeddings=2048, rope_parameters=rope)
    oracle = LlamaRotaryEmbedding(config)
    inv_freq, scaling = rope_frequencies(config, 32)
    assert torch.equal(inv_freq, oracle.inv_freq)
    assert scaling == oracle.attention_scaling


@pytest.mark.parametrize(
    ("rope", "match"),
    [
        (None, r"^rope_parameters: expected a dict with 'rope_type'"),
        (dict(rope_type="spiral", rope_theta=1.0), r"^rope_parameters\['rope_type'\]: expected one of .*"
         r"default, .*llama3.*, got 'spiral'$"),
        (dict(rope_type="default"), r"^rope_parameters\['rope_theta'\]: expected a number > 0, got None$"),
        (dict(rope_type="llama3", rope_theta="abc"), r"^rope_parameters\['rope_theta'\]: expected a number > 0, "
         r"got 'abc'$"),
        (dict(rope_type="linear", rope_theta=1e4, factor=2.0, partial_rotary_factor=0.5),
         r"^rope_parameters\['partial_rotary_factor'\]: expected 1.0 \(whole heads rotate\), got 0.5$"),
    ],
    ids=["missing", "unknown-kind", "no-theta", "text-theta", "partial"],
)  # fmt: skip
def test_missing_or_unknown_rope_settings_are_one_line_naming_the_field(rope, match):
    config = LlamaConfig(hidden_size=64, num_attention_heads=2)
    config.rope_parameters = rope
    with pytest.raises(ValueError, match=match):
        rope_frequencies(config, 32)


def test_a_layer_type_without_settings_is_named():
    config = PRESETS["gemma-3-tiny"]()
    with pytest.raises(ValueError, match=r"^rope_parameters\['chunked_attention'\]: expected a dict"):
        rope_frequencies(config, head_dim(config), "chunked_attention")


def test_building_a_model_imports_no_transformers_modeling_code():
    """The point of the module: a model is built without transformers' modeling stack (``modeling_utils``)."""
    code = (
        "import sys, torch\n"
        "FAMILIES = ('llama', 'qwen3', 'gemma3')\n"
        "from reference.models.registry import build_model\n"
        "from reference.config import mode_config\n"
        "from reference.ops import CustomOpSelection\n"
        "for name in ('llama-tiny', 'qwen3-tiny', 'gemma-3-tiny'):\n"
        "    build_model(name, CustomOpSelection(mode_config('eager')), dtype=torch.float32, device='cpu')\n"
        "heavy = {'transformers.modeling_utils'} | {f'transformers.models.{f}.modeling_{f}' for f in FAMILIES}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]", run.stdout


def test_a_checkpoints_rope_settings_are_refused_when_its_config_is_read(tmp_path):
    """As every other config problem: one line naming the file and the field, before any weight is read."""
    from reference.models.registry import model_config

    config = PRESETS["llama-tiny"]()
    config.rope_parameters = dict(rope_type="spiral", rope_theta=1e4)
    config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"^model: {tmp_path / 'config.json'}: rope_parameters\['rope_type'\]: "):
        model_config(tmp_path)
