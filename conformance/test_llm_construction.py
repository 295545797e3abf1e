"""What ``LLM(...)`` does before it generates: its argument checks, its defaults, what it hands the memory
check, the runner and the weights, and the start-up progress it shows; then the progress ``generate`` shows
and ``min_tokens`` on the token a prefill samples (on a CPU, eager: seconds each)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from reference.engine import LLM, SamplingParams
from reference.engine import llm as llm_module
from reference.models import registry
from reference.ops import CustomOpSelection

pytestmark = [pytest.mark.requires("components"), pytest.mark.eager]  # enforce_eager, but where a test says

TINY = "llama-tiny"
CHECKPOINT = str(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama")  # config.json: bfloat16, EOS 2


def _llm(model: str = TINY, **kwargs) -> LLM:
    return LLM(model, **{"device": "cpu", "enforce_eager": True, "use_tqdm": False, **kwargs})


@pytest.mark.parametrize(
    "args, message",
    [
        ({"model": 123}, "model: expected a preset name or a checkpoint directory (a string), got 123"),
        ({"model": ""}, "model: expected a preset name or a checkpoint directory (a string), got ''"),
        ({"skip_tokenizer_init": True, "tokenizer": CHECKPOINT},
         "tokenizer and skip_tokenizer_init=True contradict: give one"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens: expected an int >= 1, got 0"),
        ({"enable_chunked_prefill": "yes"}, "enable_chunked_prefill: expected a bool, got 'yes'"),
        ({"scheduling": "fifo"}, "scheduling: expected one of ['continuous', 'static'], got 'fifo'"),
        ({"scheduling_policy": "lifo"}, "scheduling_policy: expected one of ['fcfs', 'priority'], got 'lifo'"),
        ({"scheduling_policy": np.array("fcfs")},
         "scheduling_policy: expected one of ['fcfs', 'priority'], got array('fcfs', dtype='<U4')"),
        ({"scheduling": np.array("static")},
         "scheduling: expected one of ['continuous', 'static'], got array('static', dtype='<U6')"),
        ({"max_num_seqs": 4, "max_num_batched_tokens": 3},
         "max_num_batched_tokens (3) must be >= max_num_seqs (4): a decode step feeds one token per sequence"),
        ({"tensor_parallel_size": 3}, "tensor_parallel_size=3 does not divide the model's num_attention_heads (4)"),
        ({"max_num_seqs": 2, "max_model_len": 64, "max_num_batched_tokens": 129},
         "max_num_batched_tokens (129) exceeds max_num_seqs x max_model_len (2 x 64 = 128): no step can hold more "
         "tokens than the KV cache; lower it or raise the others"),
    ],
    ids=["model-not-a-string", "model-empty", "tokenizer-and-skip", "no-tokens", "chunked-prefill-not-a-bool",
         "unknown-scheduling", "unknown-scheduling-policy", "policy-an-array", "scheduling-an-array",
         "fewer-tokens-than-seqs", "tp-size",
         "more-tokens-than-the-cache"],
)  # fmt: skip
def test_a_bad_argument_is_one_line_naming_it(args, message, monkeypatch):
    """Refused before the memory check and the weights (a checkpoint's would load first otherwise)."""
    monkeypatch.setattr(llm_module, "check_memory_before_build", lambda *a, **k: pytest.fail("checked memory"))
    args = {"model": TINY, **args}
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        _llm(args.pop("model"), **args)
    assert "\n" not in str(err.value)


def test_a_step_budget_of_exactly_one_token_per_sequence_is_enough():
    assert _llm(max_num_seqs=4, max_num_batched_tokens=4).runner.max_num_tokens == 4


def test_a_step_budget_of_exactly_the_whole_kv_cache_is_allowed():
    assert _llm(max_num_seqs=2, max_model_len=16, max_num_batched_tokens=32).runner.max_num_tokens == 32


def test_the_seed_gives_the_weights_and_another_seed_others():
    weights = [_llm(seed=seed).model.model.layers[0].mlp.down_proj.weight for seed in (0, 1, 1)]
    assert not torch.equal(weights[0], weights[1]) and torch.equal(weights[1], weights[2])


def test_an_explicit_tokenizer_is_loaded_for_a_preset_that_has_none():
    assert _llm().tokenizer is None
    assert _llm(tokenizer=CHECKPOINT).tokenizer.eos_token_id is not None


def test_the_language_models_own_dtype_wins_over_its_wrappers(tmp_path):
    """A multimodal config's text_config may carry a dtype of its own; without one the outer config's counts."""
    import json
    import shutil

    fixture = Path(CHECKPOINT).parent / "tiny-gemma3-multimodal"
    directory = Path(shutil.copytree(fixture, tmp_path / "mm"))
    config = json.loads((directory / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and "dtype" not in config["text_config"]
    assert _llm(str(directory)).dtype == torch.bfloat16  # the outer config's
    config["text_config"]["dtype"] = "float16"
    (directory / "config.json").write_text(json.dumps(config))
    assert _llm(str(directory)).dtype == torch.float16  # the language model's own


def test_the_defaults_are_eight_sequences_and_seed_0_weights():
    llm = _llm()
    assert llm.runner.max_num_seqs == 8 and llm.seed == 0
    seeded = registry.build_model(TINY, CustomOpSelection(llm.config), dtype=llm.dtype, device="cpu", seed=0)
    for (name, mine), theirs in zip(llm.model.state_dict().items(), seeded.state_dict().values()):
        assert torch.equal(mine, theirs), name


def test_dtype_auto_reads_the_checkpoints_dtype():
    assert _llm(CHECKPOINT).dtype == torch.bfloat16  # its config.json says bfloat16; a CPU's own is fp32


def test_skip_tokenizer_init_loads_none_even_where_the_checkpoint_has_one():
    assert _llm(CHECKPOINT).tokenizer is not None
    assert _llm(CHECKPOINT, skip_tokenizer_init=True).tokenizer is None


def test_eos_comes_from_the_model_config_and_the_tokenizer(tmp_path):
    """The fixture's config and tokenizer agree on EOS (2); a copy whose config says 3 shows both sources."""
    import json
    import shutil

    directory = Path(shutil.copytree(CHECKPOINT, tmp_path / "eos"))
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "eos_token_id": 3}))
    llm = _llm(str(directory))
    assert llm.tokenizer.eos_token_id == 2 and llm.eos_token_ids == llm.requests.eos_token_ids == {2, 3}
    assert _llm(str(directory), skip_tokenizer_init=True).eos_token_ids == {3}
    # a multimodal checkpoint's top-level ids (Gemma 3's <eos> and <end_of_turn>; its text_config says 1)
    multimodal = Path(CHECKPOINT).parent / "tiny-gemma3-multimodal"
    assert _llm(str(multimodal), skip_tokenizer_init=True).eos_token_ids == {1, 106}


def test_the_memory_check_sees_the_step_budget_and_the_weights_it_will_allocate(monkeypatch):
    seen = []
    monkeypatch.setattr(llm_module, "check_memory_before_build", lambda model, ops, **kwargs: seen.append(kwargs))
    first = _llm(max_num_seqs=2, max_model_len=16)
    _llm(max_num_seqs=2, max_model_len=16, max_num_batched_tokens=5, share_weights_with=first)
    assert seen[0]["max_num_tokens"] == 2 * 16 and seen[1]["max_num_tokens"] == 5  # default: every row full
    assert (seen[0]["max_num_seqs"], seen[0]["max_model_len"], seen[0]["device"]) == (2, 16, torch.device("cpu"))
    assert seen[0]["dtype"] == torch.float32 and seen[0]["tensor_parallel"].size == 1
    assert (seen[0]["weights_in_memory"], seen[1]["weights_in_memory"]) == (False, True)  # shared: none new


def test_the_model_is_built_for_the_engines_tensor_parallel_group(monkeypatch):
    """The group LLM joined reaches the model's layers (torchrun's ranks, conformance/test_tensor_parallel.py,
    show what a wrong one does; here, one process, the object handed over is checked)."""
    seen = []
    build = registry.build_model
    monkeypatch.setattr(registry, "build_model", lambda *args, **kwargs: seen.append(kwargs) or build(*args, **kwargs))
    llm = _llm()
    (built,) = [kwargs for kwargs in seen if kwargs["device"] != "meta"]  # the memory check builds shapes first
    assert built.get("tensor_parallel") is llm.tensor_parallel


def test_requests_are_built_for_the_models_device():
    """Their sampling generators are made there (on CUDA, a CPU generator could not sample a CUDA tensor)."""
    assert _llm().requests.device == torch.device("cpu")


def test_shared_weights_are_the_same_tensors():
    first = _llm()
    second = _llm(share_weights_with=first)
    for (name, mine), theirs in zip(second.model.state_dict().items(), first.model.state_dict().values()):
        assert mine.data_ptr() == theirs.data_ptr(), name


def test_a_compile_fn_compiles_the_model_in_place_of_the_pipeline():
    calls = []

    def compile_fn(model, config):
        calls.append(config.level)
        return model.forward

    llm = _llm(enforce_eager=False, compilation_config={"level": 3}, compile_fn=compile_fn)
    assert calls == [3] and llm.runner.compiled.__self__ is llm.model


def test_load_s_is_the_time_the_weights_took():
    start = time.perf_counter()
    llm = _llm()
    assert 0 <= llm.load_s <= time.perf_counter() - start
    assert llm.startup.compile_s >= 0


class _Bar:
    """tqdm, recorded: its arguments, its updates and its descriptions."""

    made: list["_Bar"] = []

    def __init__(self, **kwargs):
        self.kwargs, self.total, self.n, self.descriptions = kwargs, kwargs.get("total"), 0, [kwargs.get("desc")]
        _Bar.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_description_str(self, text: str) -> None:
        self.descriptions.append(text)


@pytest.mark.parametrize("use_tqdm, disable", [(True, None), (False, True), ("not given", None)])
def test_the_start_up_bar_names_each_stage_and_ends_ready(use_tqdm, disable, monkeypatch):
    """``disable=None``: tqdm shows the bar on a terminal and not in a log; ``use_tqdm=False`` never. Left out,
    ``use_tqdm`` is True, as vLLM's."""
    _Bar.made = []
    monkeypatch.setattr(llm_module, "tqdm", lambda **kwargs: _Bar(**kwargs))
    if use_tqdm == "not given":
        LLM(TINY, device="cpu", enforce_eager=True)
    else:
        _llm(use_tqdm=use_tqdm)
    (bar,) = _Bar.made
    assert bar.kwargs == {"total": 2, "desc": f"{TINY}: load weights", "disable": disable,
                          "bar_format": "{desc} [{elapsed}]"}  # fmt: skip
    assert bar.descriptions == [f"{TINY}: load weights", f"{TINY}: compile", f"{TINY}: ready"]
    assert bar.n == bar.total  # a CPU captures nothing: weights, compile


def test_with_cuda_graphs_the_bar_counts_a_stage_per_capture_size(monkeypatch):
    """On a CPU nothing is captured; the bar's arithmetic is checked with the runner's sizes as CUDA has them."""
    _Bar.made = []
    monkeypatch.setattr(llm_module, "tqdm", lambda **kwargs: _Bar(**kwargs))
    original = llm_module.ModelRunner

    class Captures(original):
        use_cuda_graphs = property(lambda self: True, lambda self, value: None)

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.piecewise_warm_up_sizes, self.full_sizes = (4, 2), (1,)

        def warm_up(self, progress=None):
            for stage in ("compile", "capture 4", "capture 2", "capture full 1"):
                progress(stage)
            return "stats"

    monkeypatch.setattr(llm_module, "ModelRunner", Captures)
    llm = _llm(enforce_eager=False, compilation_config={"level": 0})
    (bar,) = _Bar.made
    assert llm.startup == "stats" and bar.total == 2 + 2 + 1 and bar.n == bar.total
    assert bar.descriptions[-1] == f"{TINY}: ready"


@pytest.mark.parametrize("use_tqdm, disable", [(True, None), (False, True)])
def test_generate_counts_each_request_as_it_finishes(use_tqdm, disable, monkeypatch):
    llm = _llm(max_num_seqs=2)
    _Bar.made = []
    monkeypatch.setattr(llm_module, "tqdm", lambda **kwargs: _Bar(**kwargs))
    updates = []
    monkeypatch.setattr(_Bar, "update", lambda self, n=1: updates.append((n, len(llm.llm_engine.scheduler.waiting))))
    monkeypatch.setattr(_Bar, "__exit__", lambda self, *exc: updates.append("closed"))
    llm.generate([[1, 2]] * 5, SamplingParams(max_tokens=2, ignore_eos=True), use_tqdm=use_tqdm)
    (bar,) = _Bar.made
    assert bar.kwargs == {"total": 5, "desc": "Processed prompts", "disable": disable}
    # one update per request, the first while requests still wait for a row (2 rows for 5 requests)
    assert [u[0] for u in updates[:-1]] == [1] * 5 and updates[-1] == "closed"
    assert updates[0][1] > 0


def test_generate_shows_its_bar_unless_told_not_to(monkeypatch):
    llm = _llm()
    _Bar.made = []
    monkeypatch.setattr(llm_module, "tqdm", lambda **kwargs: _Bar(**kwargs))
    monkeypatch.setattr(_Bar, "close", lambda self: None, raising=False)
    llm.generate([[1, 2]], SamplingParams(max_tokens=1))
    assert _Bar.made[0].kwargs["disable"] is None  # vLLM's default: a bar, on a terminal


def test_min_tokens_1_bans_a_stop_token_from_the_token_the_prefill_samples():
    llm = _llm()
    greedy = {"temperature": 0.0, "ignore_eos": True}
    first = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=1, **greedy), use_tqdm=False)[0].outputs[0].token_ids
    params = SamplingParams(max_tokens=3, stop_token_ids=first, min_tokens=1, **greedy)
    tokens = llm.generate([[3, 4, 5]], params, use_tqdm=False)[0].outputs[0].token_ids
    assert tokens[0] != first[0]  # the prefill's token is the first generated: count 0 < min_tokens
