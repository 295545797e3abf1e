"""The engine's argument checks and derived settings (reference.engine.arguments, step_inputs, memory_check):
errors name the argument, EOS ids come from every place a checkpoint keeps them, a tokenizer is read from
disk only, a decode step's ids are checked at both ends of the vocabulary, and the memory check counts
this rank's weights unless they already exist. No model runs; CPU."""

from __future__ import annotations

import os
import weakref
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import transformers

from reference import parallel
from reference.config import CompilationConfig, ConfigError
from reference.engine import arguments, kv_cache, memory_check
from reference.engine.arguments import SEED_LIMIT, eos_token_ids, load_tokenizer
from reference.engine.requests import RequestBuilder
from reference.engine.sampling import SamplingParams
from reference.engine.step_inputs import check_device_tokens, check_host_tokens
from reference.models import registry
from reference.ops import Attention, CustomOpSelection

pytestmark = pytest.mark.requires("components")

CPU = torch.device("cpu")


@pytest.mark.parametrize("name", ["max_num_seqs", "max_num_batched_tokens"])
def test_an_engine_size_below_one_is_one_line_naming_it(name):
    sizes = {"max_num_seqs": 8, "max_num_batched_tokens": 64, name: 0}
    with pytest.raises(ValueError) as err:
        arguments.engine_capture_sizes(**sizes)
    assert str(err.value) == f"{name}: expected an int >= 1, got 0"


def test_eos_ids_come_from_the_config_and_the_tokenizer():
    assert eos_token_ids(SimpleNamespace(eos_token_id=1), SimpleNamespace(eos_token_id=4)) == {1, 4}
    assert eos_token_ids(SimpleNamespace(eos_token_id=[2, 3]), None) == {2, 3}
    assert eos_token_ids(SimpleNamespace(eos_token_id=None), SimpleNamespace(eos_token_id=None)) == frozenset()
    assert eos_token_ids(SimpleNamespace(), None) == frozenset()


def test_a_tokenizer_is_read_from_disk_only_and_a_failure_is_one_line_naming_the_path(monkeypatch, tmp_path):
    """The engine runs offline: a path that is no local tokenizer must not turn into a download."""
    calls = []

    def from_pretrained(path, **kwargs):
        calls.append(kwargs)
        raise OSError("no tokenizer.json")

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", from_pretrained)
    with pytest.raises(ValueError) as err:
        load_tokenizer("llama-tiny", str(tmp_path))
    assert calls == [{"local_files_only": True}]
    assert str(err.value) == f"tokenizer: cannot load a tokenizer from {str(tmp_path)!r}: OSError: no tokenizer.json"


def test_every_seed_a_request_is_given_lies_in_the_seed_range():
    """SEED_LIMIT: torch.Generator takes the non-negative int64 range; half of 64-bit draws lie past it."""
    requests = RequestBuilder("toy", 10, 32, None, frozenset(), seed=0, device=CPU)
    made = requests.make([[1]] * 64, SamplingParams(temperature=1.0))
    assert all(0 <= r.generator.initial_seed() < SEED_LIMIT for r in made)


@pytest.mark.parametrize("tokens, index", [([0, 9], None), ([0, -1], 1), ([3, 10], 1), ([-2, 5], 0)])
def test_a_device_token_tensor_is_checked_at_both_ends_of_the_vocabulary_naming_the_first_bad_id(tokens, index):
    tensor = torch.tensor(tokens)
    if index is None:
        check_device_tokens(tensor, 2, 10, CPU)  # 0 and vocab_size - 1 are ids
        return
    with pytest.raises(ValueError, match=rf"^new_tokens\[{index}\]: token id {tokens[index]} is outside the vocabulary"):
        check_device_tokens(tensor, 2, 10, CPU)


def _weight_bytes_checked(monkeypatch, dtype=torch.float32, **kwargs) -> int:
    seen = []
    monkeypatch.setattr(memory_check, "check_fits", lambda *args, weight_bytes, **kw: seen.append(weight_bytes))
    memory_check.check_memory_before_build(
        "llama-tiny", CustomOpSelection(CompilationConfig()), dtype=dtype, device=CPU, max_num_seqs=2,
        max_model_len=16, max_num_tokens=16, **kwargs,
    )  # fmt: skip
    (weights,) = seen
    return weights


def test_the_memory_check_counts_this_ranks_weights_unless_they_exist_already(monkeypatch):
    whole = _weight_bytes_checked(monkeypatch)
    shard = _weight_bytes_checked(monkeypatch, tensor_parallel=parallel.TensorParallel(rank=0, size=2, group_name="g"))
    assert whole > 0 and whole / 2 <= shard < whole  # the norms are whole on every rank, the rest halved
    # bytes, not elements: half as many in bfloat16, but for the buffers, which count and stay float32 (the
    # rotary tables)
    assert whole / 2 < _weight_bytes_checked(monkeypatch, dtype=torch.bfloat16) < whole
    assert _weight_bytes_checked(monkeypatch, weights_in_memory=True) == 0


def test_host_token_ids_at_both_ends_of_the_vocabulary_pass_the_per_token_check_too():
    """A numpy int sends a sequence past the all-int fast path to the per-token check."""
    check_host_tokens([[0, np.int64(9)], [np.int64(0)]], 10)
    with pytest.raises(ValueError, match=r"^new_tokens\[0\]\[1\]: token id 10 is outside the vocabulary"):
        check_host_tokens([[0, np.int64(10)]], 10)


def test_a_seed_must_lie_below_the_seed_limit():
    arguments.check_seed(SEED_LIMIT - 1)
    with pytest.raises(ValueError, match=r"^seed: expected an int in \[0, 2\*\*63\), got 9223372036854775808$"):
        arguments.check_seed(SEED_LIMIT)


@pytest.mark.parametrize(
    "device, message",
    [
        ("meta", "engine device: expected a 'cpu' or 'cuda' device, got 'meta'"),
        ("gpu", "engine device: expected e.g. 'cpu', 'cuda' or 'cuda:1', got 'gpu'"),
        ("cuda:0", "engine device: 'cuda:0' requested but CUDA is not available"),
    ],
)
def test_a_device_the_engine_cannot_use_is_one_line_starting_with_the_arguments_name(device, message):
    if device.startswith("cuda") and torch.cuda.is_available():
        assert arguments.resolve_device(device, "engine device") == torch.device(device)
        return
    with pytest.raises(ValueError) as err:
        arguments.resolve_device(device, "engine device")
    assert str(err.value) == message


@pytest.mark.parametrize(
    "configured, on_cpu, on_cuda",
    [
        ("bfloat16", torch.bfloat16, torch.bfloat16),  # a checkpoint's config spells it as a string
        (torch.float16, torch.float16, torch.float16),  # transformers' config object holds a dtype
        ("int8", torch.float32, torch.bfloat16),  # none of ours: the device's default
        (None, torch.float32, torch.bfloat16),
    ],
)
def test_auto_takes_the_checkpoints_dtype_when_it_is_one_of_ours_else_the_devices_default(configured, on_cpu, on_cuda):
    assert arguments.resolve_dtype("auto", configured, CPU) == on_cpu
    assert arguments.resolve_dtype("auto", configured, torch.device("cuda")) == on_cuda


def test_an_unknown_dtype_is_one_line_listing_the_allowed_ones():
    with pytest.raises(ValueError) as err:
        arguments.resolve_dtype("fp8", None, CPU)
    assert str(err.value) == "dtype: expected one of ['auto', 'float32', 'bfloat16', 'float16'], got 'fp8'"


@pytest.mark.parametrize("max_model_len", [0, 1])
def test_max_model_len_below_two_is_one_line_naming_it(max_model_len):
    """A request holds at least one prompt token and one generated token, so an LLM of one token per sequence
    could serve nothing: every request would fail its own length check."""
    with pytest.raises(ValueError) as err:
        arguments.resolve_max_model_len(max_model_len, 128)
    assert str(err.value) == (
        f"max_model_len: expected an int >= 2 (one prompt token and one generated token), got {max_model_len}"
    )


def test_max_model_len_of_two_is_the_least_taken():
    assert arguments.resolve_max_model_len(2, 128) == 2


@pytest.mark.parametrize("cuda", [True, False])
def test_no_device_means_cuda_exactly_where_torch_sees_one(monkeypatch, cuda):
    """Both halves on any machine: torch.device('cuda') needs no device to exist."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert arguments.resolve_device(None) == torch.device("cuda" if cuda else "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_kv_cache_size_checked_is_the_size_allocated_and_freed_whole(dtype):
    """Checked against the device before allocation, so a wrong count refuses a cache that fits or lets one
    that cannot through (gemma-3-tiny: layers of different head counts and sizes); freed, no layer keeps one."""
    model = registry.build_model("gemma-3-tiny", CustomOpSelection(CompilationConfig()), dtype=dtype, device=CPU)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    kv_cache.allocate_kv_caches(layers, 3, 20, dtype, CPU)
    allocated = sum(layer.kv_cache.numel() * layer.kv_cache.element_size() for layer in layers)
    assert kv_cache.kv_cache_bytes(layers, 3, 20, dtype) == allocated
    caches = [weakref.ref(layer.kv_cache) for layer in layers]
    kv_cache.free_kv_caches(layers)
    assert [layer.kv_cache for layer in layers] == [None] * len(layers)
    assert [ref() for ref in caches] == [None] * len(layers)  # nothing else held them: the memory is free


GIB = 2**30
_SIZES = "max_num_seqs x max_model_len (1 x 1)"


@pytest.mark.parametrize(
    "weights, cache, message",
    [
        (8 * GIB, 1, f"the weights (8.0 GiB in bfloat16) and the KV cache and input buffers of {_SIZES} (0.0 GiB) "
         "need more than the 8.0 GiB of physical memory; lower max_num_seqs or max_model_len, or choose a smaller "
         "model or dtype"),
        (1, 8 * GIB, f"the weights (0.0 GiB in bfloat16) and the KV cache and input buffers of {_SIZES} (8.0 GiB) "
         "need more than the 8.0 GiB of physical memory; lower max_num_seqs or max_model_len, or choose a smaller "
         "model or dtype"),
        (8 * GIB + 1, 8 * GIB, "the weights (8.0 GiB in bfloat16) need more than the 8.0 GiB of physical memory; "
         "choose a smaller model or dtype, or more tensor-parallel ranks"),
    ],
    ids=["weights-fill-memory", "cache-fills-memory", "weights-beyond-cache-fills"],
)  # fmt: skip
def test_a_part_that_fills_memory_exactly_fits_alone_and_the_refusal_blames_the_two_together(
    monkeypatch, weights, cache, message
):
    """8 GiB of memory: weights or a cache of exactly 8 GiB fit alone, so beside anything more the refusal
    blames the sum; weights beyond 8 GiB are blamed alone, and a cache of exactly 8 GiB is not named beside them."""
    monkeypatch.setattr(kv_cache.os, "sysconf", lambda name: {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 2**21}[name])
    with pytest.raises(ConfigError) as err:
        kv_cache.check_fits(cache, CPU, 1, 1, weight_bytes=weights, dtype=torch.bfloat16)
    assert str(err.value) == message


def test_without_sysconf_the_physical_memory_is_unknown_and_nothing_is_refused(monkeypatch):
    """Where ``os`` has no ``sysconf`` (Windows), a CPU request is not bounded rather than failing."""
    monkeypatch.delattr(kv_cache.os, "sysconf")
    kv_cache.check_fits(2**62, CPU, 1, 1)


def test_the_kv_bytes_of_a_token_split_by_sliding_window():
    """gemma-3-tiny: a global layer between two local ones of window 4, each layer 2 kv heads of 16 in bf16,
    2 (keys and values) x 2 x 16 x 2 bytes = 128 a token."""
    model = registry.build_model("gemma-3-tiny", CustomOpSelection(CompilationConfig()), dtype=torch.float32,
                                 device=torch.device("meta"))  # fmt: skip
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    assert [layer.sliding_window for layer in layers] == [4, None, 4]
    assert kv_cache.kv_bytes_per_token_by_window(layers, torch.bfloat16) == {4: 256, None: 128}
    assert kv_cache.kv_bytes_per_token(layers, torch.bfloat16) == 384


def test_the_kv_cache_is_allocated_on_the_device_asked():
    """On the meta device here: a cache made on the default device instead would be a CPU tensor."""
    meta = torch.device("meta")
    model = registry.build_model("llama-tiny", CustomOpSelection(CompilationConfig()), dtype=torch.float32, device=meta)
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    kv_cache.allocate_kv_caches(layers, 2, 4, torch.float32, meta)
    assert {layer.kv_cache.device for layer in layers} == {meta}


@pytest.mark.parametrize(
    "mode, max_num_tokens, never",
    [("piecewise", 16, [2, 5, 6]), ("piecewise", 32, [2, 5, 6, 12, 16]), ("piecewise", 64, [2, 5, 6, 12, 16]),
     ("full", 16, [2, 5, 6]),
     ("none", 16, []), ("full_decode_only", 16, [])],
)  # fmt: skip
def test_the_compile_sizes_no_step_runs_at_are_those_below_a_capture_size_it_pads_to(mode, max_num_tokens, never):
    """Capture sizes 4, 8 and 32 under piecewise graphs or full graphs of every step: a step is padded to the
    next capture size within max_num_tokens, so 2, 5 and 6 never run, nor 12 and 16 once 32 is within reach
    (at 32 exactly too);
    8 is a capture size, 40 lies beyond every capture size (unpadded). Without padding (no graphs, or full
    graphs of decodes only with no piecewise ones) every size runs."""
    config = CompilationConfig(
        level=3, cudagraph_mode=mode, cudagraph_capture_sizes=[4, 8, 32], compile_sizes=[2, 5, 6, 8, 12, 16, 40]
    )
    assert arguments.compile_sizes_never_run(config, max_num_tokens) == never


def test_a_cpu_request_may_fill_physical_memory_exactly():
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    kv_cache.check_fits(physical, CPU, 1, 1)  # no weights to add by default
    with pytest.raises(ValueError, match=r"of physical memory; lower either$"):
        kv_cache.check_fits(physical + 1, CPU, 1, 1)


def test_on_cuda_the_memory_torchs_allocator_holds_unused_on_that_device_counts_as_free(monkeypatch):
    """On the engine's device, cuda:1 here, which need not be the current one (None: cuda:0)."""
    gib, cuda = 2**30, torch.device("cuda:1")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (1 * gib if device == cuda else 0, 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 5 * gib if device == cuda else 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 2 * gib if device == cuda else 0)
    kv_cache.check_fits(4 * gib, cuda, 1, 1)  # 1 GiB free + 3 GiB reserved and unused
    with pytest.raises(ValueError, match=r"more than the 4.0 GiB free on cuda:1; lower either$"):
        kv_cache.check_fits(4 * gib + 1, cuda, 1, 1)
