"""Weights in and out of transformers' names: errors name the tensor, fused params split and stack in
order, tied embeddings, single/sharded safetensors directories, and the committed tiny checkpoint.

Logits of the fixture against transformers are checked in ``test_llama_oracle.py``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from reference.config import CompilationConfig
from reference.models.llama import LlamaForCausalLM
from reference.models.loader import (
    CheckpointError,
    checkpoint_files,
    copy_from_hf,
    hf_state_dict,
    load_checkpoint,
    load_weights,
)
from reference.models.registry import build_model, model_config
from reference.ops import CustomOpSelection

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FIXTURE = FIXTURES / "tiny-llama"


def build(model: str | Path = "llama-tiny", seed: int = 0, dtype=torch.float32):
    return build_model(model, CustomOpSelection(CompilationConfig(level=0)), dtype=dtype, device="cpu", seed=seed)


def hf_model_for(config):
    return AutoModelForCausalLM.from_config(copy.deepcopy(config))


def assert_same_weights(a, b):
    a_sd, b_sd = a.state_dict(), b.state_dict()
    assert a_sd.keys() == b_sd.keys()
    for name in a_sd:
        torch.testing.assert_close(a_sd[name], b_sd[name], rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------- mapping
def test_hf_state_dict_has_exactly_transformers_names_and_shapes():
    ours = build()
    expected = {n: t.shape for n, t in hf_model_for(ours.config).state_dict().items()}
    assert {n: t.shape for n, t in hf_state_dict(ours).items()} == expected


def test_fused_projections_are_stacked_in_transformers_order():
    ours = build()
    hf = hf_state_dict(ours)
    attn, mlp = ours.model.layers[1].self_attn, ours.model.layers[1].mlp
    q, kv = attn.q_size, attn.kv_size
    qkv, gate_up = attn.qkv_proj.weight, mlp.gate_up_proj.weight
    torch.testing.assert_close(hf["model.layers.1.self_attn.q_proj.weight"], qkv[:q], rtol=0, atol=0)
    torch.testing.assert_close(hf["model.layers.1.self_attn.k_proj.weight"], qkv[q : q + kv], rtol=0, atol=0)
    torch.testing.assert_close(hf["model.layers.1.self_attn.v_proj.weight"], qkv[q + kv :], rtol=0, atol=0)
    i = ours.config.intermediate_size
    torch.testing.assert_close(hf["model.layers.1.mlp.gate_proj.weight"], gate_up[:i], rtol=0, atol=0)
    torch.testing.assert_close(hf["model.layers.1.mlp.up_proj.weight"], gate_up[i:], rtol=0, atol=0)


def test_hf_state_dict_views_share_memory_with_the_model():
    ours = build()
    k = hf_state_dict(ours)["model.layers.0.self_attn.k_proj.weight"]
    assert k.untyped_storage().data_ptr() == ours.model.layers[0].self_attn.qkv_proj.weight.untyped_storage().data_ptr()


def test_weights_round_trip_through_a_transformers_model():
    source, target = build(seed=0), build(seed=1)
    hf = hf_model_for(source.config)
    hf.load_state_dict(hf_state_dict(source))  # strict: every name present, none extra

    copy_from_hf(target, hf)

    assert_same_weights(target, source)


def test_load_weights_casts_dtype():
    source, target = build(seed=0), build(seed=1, dtype=torch.bfloat16)

    load_weights(target, hf_state_dict(source).items())

    for name, tensor in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[name], tensor.to(torch.bfloat16), rtol=0, atol=0, msg=name)


# ---------------------------------------------------------------------- errors name the tensor
def test_missing_tensor_is_named():
    tensors = hf_state_dict(build())
    del tensors["model.layers.1.mlp.up_proj.weight"]

    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): model\.layers\.1\.mlp\.up_proj\.weight"):
        load_weights(build(seed=1), tensors.items())


def test_unexpected_tensor_is_named():
    tensors = hf_state_dict(build())
    tensors["model.layers.7.mlp.up_proj.weight"] = tensors["model.layers.1.mlp.up_proj.weight"]

    with pytest.raises(CheckpointError, match=r"unexpected tensor 'model\.layers\.7\.mlp\.up_proj\.weight'"):
        load_weights(build(seed=1), tensors.items())


def test_wrong_shape_names_the_tensor_and_both_shapes():
    tensors = hf_state_dict(build())
    expected = tuple(tensors["model.layers.0.self_attn.k_proj.weight"].shape)
    tensors["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(5, expected[1])

    message = f"tensor 'model.layers.0.self_attn.k_proj.weight': expected shape {expected}, got (5, {expected[1]})"
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_weights(build(seed=1), tensors.items())


def test_tensor_given_twice_is_named():
    tensors = list(hf_state_dict(build()).items())
    tensors.append(tensors[3])

    with pytest.raises(CheckpointError, match=re.escape(f"tensor {tensors[3][0]!r} is given twice")):
        load_weights(build(seed=1), tensors)


def test_prefix_map_and_ignored_prefixes_adapt_checkpoint_names():
    """E.g. the language model inside a multimodal checkpoint, next to a vision tower."""

    class Wrapped(LlamaForCausalLM):
        hf_prefix_map = {"language_model.model.": "model.", "language_model.lm_head.": "lm_head."}
        hf_ignored_prefixes = ("vision_tower.",)

    source = build()
    tensors = {"language_model." + n: t for n, t in hf_state_dict(source).items()}
    tensors["vision_tower.patch_embed.weight"] = torch.zeros(3)
    target = Wrapped(source.config, CustomOpSelection(CompilationConfig(level=0)))

    load_weights(target, tensors.items())

    assert_same_weights(target, source)


def test_model_not_matching_transformers_is_a_structure_error():
    class Unfused(LlamaForCausalLM):
        stacked_params = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}  # forgets gate_up_proj

    model = Unfused(model_config("llama-tiny"), CustomOpSelection(CompilationConfig(level=0)))
    with pytest.raises(RuntimeError, match=r"model\.layers\.0\.mlp\.gate_up_proj\.weight has no transformers"):
        hf_state_dict(model)


# ---------------------------------------------------------------------- tied embeddings
def test_tied_lm_head_may_be_absent_or_present():
    source = build(FIXTURE)
    assert source.config.tie_word_embeddings
    with_head = hf_state_dict(source)
    without_head = {n: t for n, t in with_head.items() if n != "lm_head.weight"}

    for tensors in (without_head, with_head):
        target = build(FIXTURE)
        with torch.no_grad():
            target.model.embed_tokens.weight.zero_()
        load_weights(target, tensors.items())
        assert target.lm_head.weight is target.model.embed_tokens.weight
        assert_same_weights(target, source)


def test_tied_names_with_different_values_are_rejected():
    """transformers unties such a checkpoint (5.x); a tied model cannot, so it must not guess."""
    tensors = hf_state_dict(build(FIXTURE))
    tensors["lm_head.weight"] = torch.zeros_like(tensors["lm_head.weight"])

    with pytest.raises(CheckpointError, match=r"'lm_head\.weight' differs from 'model\.embed_tokens\.weight'.*tie"):
        load_weights(build(FIXTURE), tensors.items())


def test_untied_lm_head_is_required():
    source = build()
    assert not source.config.tie_word_embeddings
    tensors = {n: t for n, t in hf_state_dict(source).items() if n != "lm_head.weight"}

    with pytest.raises(CheckpointError, match=r"missing 1 tensor\(s\): lm_head\.weight"):
        load_weights(build(seed=1), tensors.items())


# ---------------------------------------------------------------------- checkpoint directories
def write_sharded(directory: Path, tensors: dict[str, torch.Tensor], config) -> None:
    """A transformers-style 2-shard checkpoint: two safetensors files and the index naming them."""
    directory.mkdir(parents=True, exist_ok=True)
    config.to_json_file(directory / "config.json")
    names = list(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2]}
    shards["model-00002-of-00002.safetensors"] = names[len(names) // 2 :]
    for file, shard_names in shards.items():
        save_file({n: tensors[n].contiguous() for n in shard_names}, directory / file, metadata={"format": "pt"})
    weight_map = {n: file for file, shard_names in shards.items() for n in shard_names}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_sharded_checkpoint_directory_round_trip(tmp_path):
    source = build()
    write_sharded(tmp_path, hf_state_dict(source), source.config)
    assert [f.name for f in checkpoint_files(tmp_path)] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]

    assert_same_weights(build(tmp_path), source)


def test_checkpoint_directory_written_by_transformers_loads(tmp_path):
    source = build()
    hf = hf_model_for(source.config)
    hf.load_state_dict(hf_state_dict(source))
    hf.save_pretrained(tmp_path, max_shard_size="200KB")  # several shards + index, as on the Hub
    assert len(checkpoint_files(tmp_path)) > 1

    target = build(seed=1)
    load_checkpoint(target, tmp_path)

    assert_same_weights(target, source)


def test_index_naming_a_missing_shard_is_rejected(tmp_path):
    source = build()
    write_sharded(tmp_path, hf_state_dict(source), source.config)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()

    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors"):
        load_checkpoint(build(seed=1), tmp_path)


def test_pickle_checkpoints_are_refused(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(b"not read")

    with pytest.raises(CheckpointError, match=r"pytorch_model\.bin.*never loaded.*safetensors"):
        load_checkpoint(build(), tmp_path)


# ---------------------------------------------------------------------- the committed fixture
def test_fixture_loads_the_same_weights_as_transformers():
    ours = build(FIXTURE)
    hf = AutoModelForCausalLM.from_pretrained(FIXTURE, dtype=torch.float32)
    expected = hf.state_dict()

    got = hf_state_dict(ours)

    assert got.keys() == expected.keys()
    for name in got:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=0, msg=name)


def test_fixture_is_small_and_tied_like_llama_3_2():
    size = sum(f.stat().st_size for f in FIXTURE.iterdir())
    assert size < 400_000, f"fixture is {size} bytes"
    with safe_open(FIXTURE / "model.safetensors", framework="pt") as f:
        assert "lm_head.weight" not in f.keys()
    config = model_config(FIXTURE)
    assert config.tie_word_embeddings and config.rope_parameters["rope_type"] == "llama3"


def load_fixture_script():
    spec = importlib.util.spec_from_file_location("make_tiny_llama", FIXTURES / "make_tiny_llama.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_fixture_script_reproduces_the_committed_fixture(tmp_path):
    load_fixture_script().write_tiny_llama(tmp_path)

    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in FIXTURE.iterdir())
    for name in ("config.json", "tokenizer_config.json", "tokenizer.json"):
        assert json.loads((tmp_path / name).read_text()) == json.loads((FIXTURE / name).read_text()), name
    with safe_open(tmp_path / "model.safetensors", "pt") as new, safe_open(FIXTURE / "model.safetensors", "pt") as old:
        assert sorted(new.keys()) == sorted(old.keys())
        for key in old.keys():
            torch.testing.assert_close(new.get_tensor(key), old.get_tensor(key), rtol=0, atol=0, msg=key)


def test_fixture_tokenizer_loads_offline_and_fits_the_vocabulary():
    tokenizer = AutoTokenizer.from_pretrained(FIXTURE, local_files_only=True)
    config = model_config(FIXTURE)
    text = "Hello world, the compiler splits tokens."

    ids = tokenizer(text)["input_ids"]

    assert ids[0] == config.bos_token_id == tokenizer.bos_token_id
    assert tokenizer.eos_token_id == config.eos_token_id
    assert tokenizer.unk_token_id not in ids
    assert max(ids) < config.vocab_size
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


# ---------------------------------------------------------------------- whole messages (./run mutate models.checkpoint)
def _refused(error_type, call, *args) -> str:
    with pytest.raises(error_type) as err:
        call(*args)
    return str(err.value)


def test_load_weights_messages_are_whole_lines_without_a_file_prefix():
    """From a stream of tensors (no file): each refusal starts at the tensor, says what is wrong, ends there."""
    source = build()
    expected = len(hf_state_dict(source))
    unexpected = {**hf_state_dict(source), "model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    assert _refused(CheckpointError, load_weights, build(seed=1), unexpected.items()) == (
        "unexpected tensor 'model.layers.9.mlp.up_proj.weight': LlamaForCausalLM for this config has no such "
        f"parameter (it expects {expected} tensors such as 'model.embed_tokens.weight')"
    )
    twice = [*hf_state_dict(source).items(), ("model.norm.weight", torch.ones(64))]
    assert _refused(CheckpointError, load_weights, build(seed=1), twice) == "tensor 'model.norm.weight' is given twice"
    quantized = {**hf_state_dict(source), "model.norm.weight": torch.ones(64, dtype=torch.int8)}
    assert _refused(CheckpointError, load_weights, build(seed=1), quantized.items()) == (
        "tensor 'model.norm.weight': dtype torch.int8 is not one of the floating-point dtypes loaded (F16, BF16, F32, "
        "F64); quantized checkpoints are not supported"
    )
    missing = {n: t for n, t in hf_state_dict(source).items() if n != "model.norm.weight"}
    assert _refused(CheckpointError, load_weights, build(seed=1), missing.items()) == (
        "missing 1 tensor(s): model.norm.weight"
    )


def test_a_checkpoint_files_refusals_start_with_the_file(tmp_path):
    """The same refusals from a directory name the file first: an unexpected tensor in it, and tied tensors
    that differ (found only while the data is read, so named by the file being read then)."""
    path = tmp_path / "model.safetensors"
    tensors = {n: t.clone() for n, t in hf_state_dict(build(FIXTURE)).items()}
    save_file({**tensors, "extra.weight": torch.zeros(2)}, path)
    message = _refused(CheckpointError, load_checkpoint, build(FIXTURE, seed=1), tmp_path)
    assert message.startswith(f"{path}: unexpected tensor 'extra.weight': LlamaForCausalLM for this config "), message
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1  # tied in this config, but different
    save_file(tensors, path)
    assert _refused(CheckpointError, load_checkpoint, build(FIXTURE, seed=1), tmp_path).startswith(
        f"{path}: tensor 'model.embed_tokens.weight' differs from 'lm_head.weight', but the model ties them"
    )  # a file's tensors are read in name order


def _llama_with(**stacked):
    class Restacked(LlamaForCausalLM):
        stacked_params = {**LlamaForCausalLM.stacked_params, **stacked}

    return Restacked(model_config("llama-tiny"), CustomOpSelection(CompilationConfig(level=0)))


def test_a_model_not_matching_transformers_says_which_model_and_what_differs():
    """Bugs of a model class (its stacking, its shapes), found before any checkpoint is read: one line naming
    the class, transformers' model type and the first tensor that does not line up."""
    head = "Restacked does not match transformers' 'llama' model: "
    misnamed = _llama_with(qkv_proj=("q_proj", "k_proj", "w_proj"))
    assert _refused(RuntimeError, hf_state_dict, misnamed) == head + (
        "model.layers.0.self_attn.qkv_proj.weight is stacked from model.layers.0.self_attn.w_proj.weight, which "
        "transformers does not have"
    )
    short = _llama_with(qkv_proj=("q_proj", "k_proj"))  # 64 + 32 rows of the 128 the layer has
    assert _refused(RuntimeError, hf_state_dict, short) == head + (
        "model.layers.0.self_attn.qkv_proj.weight has shape (128, 64) but its parts ['q_proj', 'k_proj'] stack to "
        "(96, 64)"
    )
    other_vocab = build()
    other_vocab.config.vocab_size = 300  # transformers' model for the changed config, against ours as built
    assert _refused(RuntimeError, hf_state_dict, other_vocab) == (
        "LlamaForCausalLM does not match transformers' 'llama' model: model.embed_tokens.weight: ours (256, 64), "
        "transformers (300, 64)"
    )


def test_transformers_tensors_with_no_place_in_our_model_are_listed_ten_at_most():
    """Biases our model was not built with: 2 layers x (q, k, v, o + gate, up, down) = 14, the first 10 shown."""
    model = build()
    model.config.attention_bias = model.config.mlp_bias = True
    names = [f"model.layers.{i}.{m}.bias" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")]  # fmt: skip
    assert _refused(RuntimeError, hf_state_dict, model) == (
        f"LlamaForCausalLM does not match transformers' 'llama' model: transformers tensors with no place in our "
        f"model: {names[:10]}"
    )


def test_a_tensor_parallel_shard_loads_its_part_of_each_whole_tensor_and_is_never_saved_as_whole():
    """Rank 1 of 2 takes transformers' whole tensors and keeps its half (o_proj splits its input columns); its
    own state cannot be written back under transformers' names, which hold whole tensors."""
    from reference.parallel import TensorParallel

    source = build()
    rank1 = build_model("llama-tiny", CustomOpSelection(CompilationConfig(level=0)), dtype=torch.float32, device="cpu",
                        tensor_parallel=TensorParallel(1, 2, "unused"))  # fmt: skip
    load_weights(rank1, hf_state_dict(source).items())
    theirs, ours = source.model.layers[0].self_attn.o_proj.weight, rank1.model.layers[0].self_attn.o_proj.weight
    torch.testing.assert_close(ours, theirs[:, 32:], rtol=0, atol=0)
    assert _refused(ValueError, hf_state_dict, rank1) == (
        "hf_state_dict: the model is one rank's shard of a tensor_parallel_size > 1 model (model.embed_tokens.weight "
        "and others); build it with tensor_parallel_size=1"
    )
