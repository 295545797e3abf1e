"""The compile cache (``CompilationConfig.cache_dir``): warm starts, keys, damaged entries, concurrent starts.

A *start* here is a new model built with the same seeded weights and compiled in this process: it has
never been traced, so to it the cache is as warm as after a process restart (the Dynamo-free path is the
same; a fresh process is tested too, with two started at once). Counters say what a start did: a hit
traces nothing and compiles nothing. The suite runs with the cache off (the root conftest); these tests
turn it on with a folder of their own.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from conformance import forked
from conformance.driver import prefill_and_decode
from conformance.helpers import DEVICES, build_llama, make_runner, small_llama_config
from reference.compilation import backend, cache_key, compile_cache, compilation_counter, expect_counters
from reference.compilation.compile_piece import SizeDispatch
from reference.config import CompilationConfig, ConfigError, mode_config

pytestmark = pytest.mark.requires("compile_cache", "counters")
PROMPTS = [[3, 14, 15, 92, 65], [35, 89, 79]]
SIZES = {"max_num_seqs": 2, "max_model_len": 16, "max_cudagraph_capture_size": 16}


@pytest.fixture
def cache(monkeypatch, tmp_path) -> Path:
    """The cache turned on, in a folder of the test's own (the default folder is never touched)."""
    monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    monkeypatch.setenv(cache_key.FOLDER_ENV, str(tmp_path / "default-folder-unused"))
    return tmp_path / "cache"


def start(impl, mode, cache, *, device="cpu", dtype=torch.float32, hf=None, **overrides):
    """A start: a fresh model (seed 0) and runner, warmed up; its prefill + 3 decode steps' logits."""
    settings = {**SIZES, **overrides}
    hf = hf or small_llama_config()
    runner = make_runner(impl, mode, hf, device=device, dtype=dtype, cache_dir=str(cache), **settings)
    runner.warm_up()
    return prefill_and_decode({"run": runner}, PROMPTS, num_decode=3, leader="run")["run"]


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.iterdir() if not p.name.startswith(".")) if cache.exists() else []


# a warm start's mode -> (the engine mode, its overrides)
WARM_STARTS = {
    "no_inductor": ("no_inductor", {}),
    "inductor": ("inductor", {}),
    "no_inductor_full": ("no_inductor_full", {}),
    "inductor_graph_partition": ("inductor", {"use_inductor_graph_partition": True}),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "mode",
    [pytest.param(m, marks=[pytest.mark.requires("inductor_graph_partition"), pytest.mark.inductor])
     if "partition" in m else m for m in WARM_STARTS],
)  # fmt: skip
def test_a_warm_start_traces_and_compiles_nothing_and_gives_the_cold_starts_logits(mode, device, cache, impl):
    """Bitwise where the warm start runs the very code the cold one ran: the FX pieces, and Inductor's C++
    kernels on a CPU. Inductor's Triton kernels are the exception: a kernel with several launch configs picks
    one by timing them at its first launch in each start (the entry stores the kernels, not that choice), and
    a reduction launched with another block size adds in another order. Measured on the H200: one run differed
    by 1.2e-6 at the third decode step, another by nothing. So there the logits must agree to float32's
    reassociation error: assert_close's float32 defaults (rtol 1.3e-6, atol 1e-5), far below what a wrong
    entry gives (another dtype's or another graph's kernels). On CUDA a warm start captures as many graphs as
    the cold one: with Inductor's graph partition, the partitions of a loaded artifact must get their
    wrappers as it loads, or nothing is captured and the logits alone would not tell."""
    engine_mode, overrides = WARM_STARTS[mode]
    before = compilation_counter.snapshot()
    with expect_counters(num_cache_misses=1, num_cache_hits=0, num_graphs_seen=1, num_cache_entries_written=1):
        cold = start(impl, engine_mode, cache, device=device, **overrides)
    middle = compilation_counter.snapshot()
    with expect_counters(num_cache_misses=0, num_cache_hits=1, num_graphs_seen=0, num_backend_compilations=0):
        warm = start(impl, engine_mode, cache, device=device, **overrides)
    after = compilation_counter.snapshot()
    assert len(entries(cache)) == 1
    captured = [b.num_cudagraph_captured - a.num_cudagraph_captured for a, b in ((before, middle), (middle, after))]
    assert captured[1] == captured[0] and (captured[0] > 0) == (device == "cuda"), captured
    # a warm start counts the pieces it loaded as the trace counted them: all, and those to capture
    seen = [(b.num_piecewise_graphs_seen - a.num_piecewise_graphs_seen,
             b.num_piecewise_capturable_graphs_seen - a.num_piecewise_capturable_graphs_seen)
            for a, b in ((before, middle), (middle, after))]  # fmt: skip
    assert seen[1] == seen[0] and seen[0][0] >= seen[0][1] > 0, seen
    autotuned = engine_mode.startswith("inductor") and device == "cuda"
    for step, (c, w) in enumerate(zip(cold, warm)):
        if autotuned:
            torch.testing.assert_close(w, c, msg=lambda m: f"step {step}: {m}")
        else:
            assert torch.equal(c, w), f"step {step}: warm differs from cold by up to {(c - w).abs().max():.3g}"


# factor -> (the first start's overrides, the second's): each pair differs in that factor only
FACTORS = {
    "dtype": ({}, {"dtype": torch.bfloat16}),
    "custom_ops": ({"custom_ops": ["all"]}, {"custom_ops": ["all", "-rms_norm"]}),
    "capture_sizes": ({}, {"max_cudagraph_capture_size": 8}),
    "splitting_ops": ({}, {"splitting_ops": ["reference::attention"]}),
    "level": ({}, {"level": 2, "cudagraph_mode": "none"}),
    "model_config": ({}, {"hf": small_llama_config(rms_norm_eps=1e-3)}),
}


@pytest.mark.no_inductor
@pytest.mark.parametrize("factor", FACTORS)
def test_a_changed_factor_misses(factor, cache, impl):
    """The model config case changes only a constant of the graph (RMSNorm's epsilon): the weights, their
    shapes and every compilation field stay, so only a key that holds the model's config can tell."""
    first, second = FACTORS[factor]
    start(impl, "no_inductor", cache, **first)
    with expect_counters(num_cache_hits=0, num_cache_misses=1, num_cache_entries_written=1):
        start(impl, "no_inductor", cache, **{**first, **second})
    assert len(entries(cache)) == 2


@pytest.mark.inductor
@pytest.mark.requires("inductor_graph_partition")
def test_inductors_graph_partition_is_a_factor_so_neither_mode_is_served_the_others_entry(cache, impl):
    """The same Inductor compile with and without Inductor's own partition: the entry of one holds no FX split
    and partitions to wrap, the other's a split and no partitions. One layer (Inductor compiles take seconds)."""
    hf = small_llama_config(num_hidden_layers=1)
    start(impl, "inductor", cache, hf=hf)
    with expect_counters(num_cache_hits=0, num_cache_misses=1, num_cache_entries_written=1):
        start(impl, "inductor", cache, hf=hf, use_inductor_graph_partition=True)
    assert len(entries(cache)) == 2


@pytest.mark.inductor
@pytest.mark.requires("compile_sizes")
@pytest.mark.parametrize("device", DEVICES)
def test_a_warm_start_serves_the_static_compiles_of_compile_sizes_too(device, cache, impl):
    """Decode steps (2 sequences: 2 tokens) and the prefill (8 tokens) run at compile sizes. The warm start
    compiles nothing, so the static compiles it runs are the entry's; bitwise on a CPU, and on CUDA within
    float32's reassociation error for the autotuned Triton kernels (see the warm-start test above)."""
    sizes = {"compile_sizes": [2, 8]}
    pieces = small_llama_config().num_hidden_layers + 1  # around each layer's attention call
    with expect_counters(num_cache_misses=1, num_inductor_compiles=3 * pieces, num_cache_entries_written=1):
        cold = start(impl, "inductor", cache, device=device, **sizes)
    with expect_counters(num_cache_hits=1, num_graphs_seen=0, num_backend_compilations=0):
        warm = start(impl, "inductor", cache, device=device, **sizes)
    for step, (c, w) in enumerate(zip(cold, warm)):
        if device == "cuda":
            torch.testing.assert_close(w, c, msg=lambda m: f"step {step}: {m}")
        else:
            assert torch.equal(c, w), f"step {step}: warm differs from cold by up to {(c - w).abs().max():.3g}"
    with expect_counters(num_cache_hits=0, num_cache_misses=1, num_cache_entries_written=1):
        start(impl, "inductor", cache, device=device, compile_sizes=[2])  # another list: another key
    assert len(entries(cache)) == 2


@pytest.mark.inductor
@pytest.mark.requires("components")
def test_an_entry_holds_one_artifact_per_piece_and_compile_size_and_a_warm_start_dispatches_to_them(
    cache, impl, monkeypatch
):
    start(impl, "inductor", cache, compile_sizes=[2])
    (entry,) = entries(cache)
    meta = json.loads((entry / "entry.json").read_text())
    compiled = [p["name"] for p in meta["pieces"] if not p["splitting_op"]]
    assert [p["compile_sizes"] for p in meta["pieces"] if not p["splitting_op"]] == [[2]] * len(compiled)
    stored = sorted(f.name for f in entry.glob("*.bin"))
    assert stored == sorted([f"{name}.bin" for name in compiled] + [f"{name}@2.bin" for name in compiled])
    built = []

    class Recording(SizeDispatch):
        def __init__(self, generic, static, size_args):
            built.append(sorted(static))
            super().__init__(generic, static, size_args)

    monkeypatch.setattr(backend, "SizeDispatch", Recording)
    with expect_counters(num_cache_hits=1):
        start(impl, "inductor", cache, compile_sizes=[2])
    assert built == [[2]] * len(compiled)  # each piece's loaded static compile, dispatched at its size


@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_the_key_follows_the_source_so_an_edited_file_misses(cache, impl, tmp_path, monkeypatch):
    """An entry made before a source file changed must not be served after: the key hashes the package's
    files (here a copy of them, one file edited between the starts)."""
    package = tmp_path / "reference"
    shutil.copytree(cache_key._PACKAGE, package, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cache_key, "_PACKAGE", package)
    start(impl, "no_inductor", cache)
    with expect_counters(num_cache_hits=1):
        start(impl, "no_inductor", cache)
    with open(package / "models" / "llama.py", "a") as file:
        file.write("# edited\n")
    with expect_counters(num_cache_hits=0, num_cache_misses=1, num_cache_entries_written=1):
        start(impl, "no_inductor", cache)


def _damage(entry: Path, other: Path, how: str) -> None:
    if how == "truncated":
        data = (entry / "entry.json").read_bytes()
        (entry / "entry.json").write_bytes(data[: len(data) // 2])
    elif how == "a_byte_flipped":  # the same size: only the digest tells
        data = bytearray((entry / "entry.json").read_bytes())
        data[len(data) // 2] ^= 0x01
        (entry / "entry.json").write_bytes(bytes(data))
    elif how == "file_of_another_entry":  # valid, but the other config's graph
        shutil.copy(other / "entry.json", entry / "entry.json")
    elif how == "no_manifest":
        (entry / "manifest.json").unlink()
    elif how == "foreign":  # a whole entry of another config under this key
        shutil.rmtree(entry)
        shutil.copytree(other, entry)
    elif how == "missing_file":
        (entry / "entry.json").unlink()
    elif how == "manifest_listing_nothing":  # every file it lists checks out
        (entry / "manifest.json").write_text("{}")
    elif how == "code_that_does_not_run":  # the manifest rewritten to match: only running the code tells
        meta = json.loads((entry / "entry.json").read_text())
        meta["split"]["code"] = meta["split"]["code"].replace("def forward", "def forwrd")
        (entry / "entry.json").write_text(json.dumps(meta))
        files = [f for f in entry.iterdir() if f.name != "manifest.json"]
        manifest = {f.name: [f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()] for f in files}
        (entry / "manifest.json").write_text(json.dumps(manifest))
    elif how == "a_binding_to_a_missing_tensor":  # the manifest rewritten to match: only binding the model tells
        meta = json.loads((entry / "entry.json").read_text())
        tensor = next(b for b in meta["bindings"] if b[0] == "tensor")
        tensor[1] = "not_there"
        (entry / "entry.json").write_text(json.dumps(meta))
        files = [f for f in entry.iterdir() if f.name != "manifest.json"]
        manifest = {f.name: [f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()] for f in files}
        (entry / "manifest.json").write_text(json.dumps(manifest))
    elif how == "a_file_not_a_folder":
        shutil.rmtree(entry)
        entry.write_text("not an entry")


# what the warning says each damage is (the manifest's checks name the file, the listing or the foreign factors)
REASONS = {
    "truncated": r"\(ValueError: entry\.json is \d+ bytes and its SHA-256 is not the manifest's\)",
    "file_of_another_entry": r"\(ValueError: entry\.json is \d+ bytes and its SHA-256 is not the manifest's\)",
    "a_byte_flipped": r"\(ValueError: entry\.json is \d+ bytes and its SHA-256 is not the manifest's\)",
    "no_manifest": r"\(FileNotFoundError: .*manifest\.json",
    "foreign": r"\(ValueError: its factors\.json is not this start's \(a foreign entry\)\)",
    "missing_file": r"\(ValueError: the manifest lists \['entry\.json', 'factors\.json'\], the folder holds "
    r"\['factors\.json'\]\)",
    "manifest_listing_nothing": r"\(ValueError: the manifest lists \[\], the folder holds \['entry\.json', "
    r"'factors\.json'\]\)",
    "code_that_does_not_run": r"\(KeyError: 'forward'\)",
    "a_binding_to_a_missing_tensor": r"\(KeyError: 'not_there'\)",  # found after the pieces were built
    "a_file_not_a_folder": r"\(NotADirectoryError: ",
}


@pytest.mark.no_inductor
@pytest.mark.parametrize(
    "how",
    ["truncated", "a_byte_flipped", "file_of_another_entry", "no_manifest", "foreign", "missing_file",
     "manifest_listing_nothing", "code_that_does_not_run", "a_binding_to_a_missing_tensor", "a_file_not_a_folder"],
)  # fmt: skip
def test_an_unusable_entry_warns_once_recompiles_and_is_replaced(how, cache, impl):
    """The other entry is the same model with native custom ops: its graph takes the same inputs, so
    served in this entry's place it would run, and give other (if close) logits, without a word."""
    cold = start(impl, "no_inductor", cache)
    (entry,) = entries(cache)
    start(impl, "no_inductor", cache, custom_ops=["none"])
    (other,) = [e for e in entries(cache) if e != entry]
    _damage(entry, other, how)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with expect_counters(num_cache_hits=0, num_cache_misses=1, num_cache_entries_written=1):
            again = start(impl, "no_inductor", cache)
    said = [str(w.message) for w in caught if "compile cache" in str(w.message)]
    warned = [w for w in caught if "compile cache" in str(w.message)]
    assert {w.category for w in warned} == {RuntimeWarning}
    # the line names the entry and what was wrong with it, the error's kind first
    kinds = "ValueError|JSONDecodeError|FileNotFoundError|NotADirectoryError|KeyError"
    assert re.search(rf"entry \S+ is unusable \(({kinds}): ", said[0]), said
    assert len(said) == 1 and "unusable" in said[0] and "\n" not in said[0], said
    assert re.search(REASONS[how], said[0]), said  # what was wrong, in the words of the check that found it
    assert all(torch.equal(a, b) for a, b in zip(cold, again))
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]  # the refused entry is gone
    with expect_counters(num_cache_hits=1):  # replaced by a whole entry
        start(impl, "no_inductor", cache)


@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_an_entry_is_written_under_a_temporary_name_and_renamed_into_place(cache, impl, monkeypatch):
    """A reader must never see part of an entry under its key: every file is written in a temporary sibling
    folder, which one rename makes the entry."""
    written, renamed = [], []
    real_write, real_rename = Path.write_bytes, os.rename
    monkeypatch.setattr(Path, "write_bytes", lambda self, data: written.append(self) or real_write(self, data))
    monkeypatch.setattr(os, "rename", lambda a, b: renamed.append((Path(a), Path(b))) or real_rename(a, b))
    start(impl, "no_inductor", cache)
    (entry,) = entries(cache)
    assert written and not [p for p in written if entry in p.parents]
    ((temporary, final),) = renamed
    assert (temporary.parent, final) == (cache, entry) and temporary.name.startswith(".tmp-")
    assert not [p for p in cache.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_two_processes_starting_at_once_both_run_and_leave_one_whole_entry(cache, impl, tmp_path):
    env = {**os.environ, cache_key.DISABLE_ENV: "0"}
    # two processes started at once (forked: a fresh interpreter's imports were 8 of the 15 s on a CPU; the rank
    # variables run_ranks gives them go unread), from the repository's root (conformance/compile_cache_worker.py)
    argv = [sys.executable, "-m", "conformance.compile_cache_worker", str(cache)]
    children = forked.run_ranks(argv, 2, env=env, timeout=300)
    assert [child.returncode for child in children] == [0, 0], [child.stderr[-2000:] for child in children]
    sums = {line for child in children for line in child.stdout.splitlines() if line.startswith("LOGITS")}
    assert len(sums) == 1, sums
    assert len(entries(cache)) == 1 and not [p for p in cache.iterdir() if p.name.startswith(".")]
    with expect_counters(num_cache_hits=1):
        start(impl, "no_inductor", cache)


@pytest.mark.gpu
@pytest.mark.requires("components")
@pytest.mark.parametrize(
    "mode", ["no_inductor", "no_inductor_full", pytest.param("inductor", marks=pytest.mark.inductor)]
)
def test_a_warm_start_in_a_fresh_process_with_no_warm_up_runs_gives_the_cold_starts_logits(mode, cache, tmp_path):
    """``cudagraph_num_of_warmups=0`` (vLLM's default). A warm start in a fresh process has launched no kernel when
    its first step runs: a compile-cache hit runs no kernel warm-up (:mod:`reference.engine.kernel_warm_up`), so
    each Triton kernel is loaded onto the device at its first launch, and that launch must not be inside a capture
    (on an H100 the 8B's warm start exited with a CUDA error there when 0 captured a size at its first run,
    perf/NOTES.md v45). A start in this process would not tell: the cold start's kernels stay loaded in it.
    Logits as in the in-process warm-start rule: bitwise, or to float32's reassociation error for Inductor's
    autotuned Triton kernels."""
    env = {**os.environ, cache_key.DISABLE_ENV: "0", "PYTHONPATH": str(Path(__file__).parents[1])}
    runs = []
    worker = [sys.executable, "-m", "conformance.compile_cache_worker", str(cache), "--device", "cuda", "--mode", mode]
    for name in ("cold", "warm"):
        argv = [*worker, "--overrides", '{"cudagraph_num_of_warmups": 0}', "--save", str(tmp_path / name)]
        # a fresh interpreter each (a cold start: conformance/forked.py's rule)
        child = subprocess.run(argv, cwd=forked.ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert child.returncode == 0, f"the {name} start failed:\n{child.stderr[-3000:]}"
        runs.append(child.stdout)
    assert [re.findall(r"^HITS (\d+)$", out, re.M) for out in runs] == [["0"], ["1"]], runs
    cold, warm = (torch.load(tmp_path / name) for name in ("cold", "warm"))
    for step, (c, w) in enumerate(zip(cold, warm, strict=True)):
        if mode == "inductor":
            torch.testing.assert_close(w, c, msg=lambda m: f"step {step}: {m}")
        else:
            assert torch.equal(c, w), f"step {step}: warm differs from cold by up to {(c - w).abs().max():.3g}"


@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_factors_json_says_what_the_key_hashes(cache, impl):
    start(impl, "no_inductor", cache)
    (entry,) = entries(cache)
    factors = json.loads((entry / "factors.json").read_text())
    assert cache_key.cache_key(factors) == entry.name
    assert factors["compilation"]["custom_ops"] == ["all"] and factors["inputs"][0][0] == "torch.int64"
    assert factors["model"]["config"]["rms_norm_eps"] == small_llama_config().rms_norm_eps
    assert "impl=custom" in factors["model"]["modules"] and factors["environment"]["torch"] == torch.__version__


GLOBAL_SCALE = torch.ones(64)


class _ReadsAGlobalTensor(torch.nn.Module):
    """Its graph takes a module-level tensor as an input: no parameter, buffer or argument."""

    def forward(self, x):
        return x * GLOBAL_SCALE


@pytest.mark.requires("components")
def test_a_model_whose_inputs_cannot_be_bound_runs_uncached_with_one_warning(cache, impl):
    from reference.compilation import compile_model

    config = CompilationConfig(level=2, cache_dir=str(cache), use_inductor=False)
    compiled = compile_model(_ReadsAGlobalTensor(), config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = compiled(torch.full((3, 64), 2.0))
    said = [str(w.message) for w in caught if "compile cache" in str(w.message)]
    assert len(said) == 1 and "not cached" in said[0], said
    assert torch.equal(out, torch.full((3, 64), 2.0)) and entries(cache) == []


@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_the_switch_turns_the_cache_off(cache, impl, monkeypatch):
    monkeypatch.setenv(cache_key.DISABLE_ENV, "1")
    with expect_counters(num_cache_hits=0, num_cache_misses=0, num_cache_entries_written=0):
        start(impl, "no_inductor", cache)
    assert not cache.exists()


@pytest.mark.requires("components")
def test_cache_settings_are_checked(monkeypatch, tmp_path):
    monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    with pytest.raises(ConfigError, match=r"^cache_dir is set but level=1; .*level 2 or 3"):
        CompilationConfig(level=1, cache_dir="x")
    with pytest.raises(ConfigError, match=r"^cache_dir: expected str, got int 3$"):
        CompilationConfig(cache_dir=3)
    assert CompilationConfig(cache_dir=tmp_path).cache_dir == str(tmp_path)  # a path is a folder too
    assert cache_key.cache_folder(CompilationConfig(cache_dir=str(tmp_path))) == tmp_path
    monkeypatch.setenv(cache_key.FOLDER_ENV, str(tmp_path / "env"))
    assert cache_key.cache_folder(CompilationConfig()) == tmp_path / "env"
    monkeypatch.setenv(cache_key.DISABLE_ENV, "yes")
    with pytest.raises(ConfigError, match=r"^REFERENCE_DISABLE_COMPILE_CACHE: expected '0' or '1', got 'yes'$"):
        cache_key.cache_folder(CompilationConfig())


class _ArtifactTorchCannotSave:
    def save(self, *, path):
        raise RuntimeError("CompiledArtifact.save failed to save since there's no artifact to save")


@pytest.mark.requires("components")
def test_an_entry_that_cannot_be_written_is_one_warning_and_leaves_nothing_behind(tmp_path):
    """It was a traceback that ended the start (torch's artifact of a compile its own cache skipped)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        artifacts = {"p": _ArtifactTorchCannotSave()}
        written = compile_cache.write_entry(tmp_path, "key", {}, {"entry.json": b"{}"}, artifacts)
    said = [str(w.message) for w in caught]
    assert not written and len(said) == 1 and "this start is not cached" in said[0] and "no artifact" in said[0], said
    assert list(tmp_path.iterdir()) == []


@pytest.mark.requires("components")
def test_a_second_writer_of_a_key_keeps_the_first_ones_whole_entry(tmp_path):
    """Two processes that missed at once both write; the second must not swap out the first's entry under a
    third that is reading it."""
    first = compile_cache.write_entry(tmp_path, "key", {"a": 1}, {"entry.json": b"{}"}, {})
    inode = (tmp_path / "key").stat().st_ino
    second = compile_cache.write_entry(tmp_path, "key", {"a": 1}, {"entry.json": b"{}"}, {})
    assert (first, second) == (True, False) and (tmp_path / "key").stat().st_ino == inode
    assert sorted(p.name for p in tmp_path.iterdir()) == ["key"]


@pytest.mark.requires("components")
@pytest.mark.inductor
@pytest.mark.parametrize(
    "fields, said",
    [({"level": 2, "inductor_compile_config": {"max_autotune": False, "fx_graph_cache": False}},
      "inductor_compile_config['fx_graph_cache'] is False: Inductor keeps no artifact to store"),
     ({"level": 2, "inductor_compile_config": {"post_grad_custom_pre_pass": print}},
      "inductor_compile_config['post_grad_custom_pre_pass'] is builtin_function_or_method, which no key can name")],
    ids=["no_fx_graph_cache", "a_pass_as_a_function"],
)  # fmt: skip
def test_a_config_no_entry_can_hold_is_one_warning_before_any_compile(fields, said, cache, monkeypatch):
    from reference.compilation import compile_model

    config = CompilationConfig(cache_dir=str(cache), **fields)
    assert cache_key.uncachable(config) == said
    compiled = compile_model(_ReadsAGlobalTensor(), config)
    monkeypatch.setattr(compiled, "_compiled", lambda x: x)  # the compile itself is not what is tested
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with expect_counters(num_cache_hits=0, num_cache_misses=0):
            compiled(torch.ones(3, 64))
    messages = [str(w.message) for w in caught if "compile cache" in str(w.message)]
    assert messages == [f"compile cache: {said}; this start is not cached"]
    assert not cache.exists() or not any(cache.iterdir())


@pytest.mark.requires("components")
@pytest.mark.parametrize("value", ["a\x00b", "   "], ids=["nul", "spaces"])
def test_a_cache_dir_no_folder_can_have_is_refused_when_the_config_is_built(value):
    with pytest.raises(ConfigError, match=r"^cache_dir: expected a folder path .*not only spaces$"):
        CompilationConfig.parse({"cache_dir": value})


@pytest.mark.requires("components")
def test_an_empty_switch_reads_as_unset(monkeypatch, tmp_path):
    monkeypatch.setenv(cache_key.DISABLE_ENV, "")
    assert cache_key.cache_folder(CompilationConfig(cache_dir=str(tmp_path))) == tmp_path


class _ReturnsTwo(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.linspace(0.5, 1.5, 64))

    def forward(self, x):
        return x * self.weight, x + 1


class _ReturnsADict(_ReturnsTwo):
    def forward(self, x):
        return {"scaled": x * self.weight}


def _two_starts(model_cls, cache):
    """A cold and a warm start of a fresh ``model_cls()`` each, at level 2 without Inductor; their outputs."""
    from reference.compilation import compile_model

    config = CompilationConfig(level=2, use_inductor=False, cache_dir=str(cache))
    x = torch.arange(3 * 64, dtype=torch.float32).reshape(3, 64)
    return [compile_model(model_cls(), config)(x) for _ in range(2)]


@pytest.mark.requires("components")
def test_a_model_returning_a_tuple_is_served_the_same_tuple(cache, impl):
    with expect_counters(num_cache_misses=1, num_cache_hits=1, num_cache_entries_written=1):
        cold, warm = _two_starts(_ReturnsTwo, cache)
    assert isinstance(warm, tuple) and len(warm) == 2
    assert all(torch.equal(c, w) for c, w in zip(cold, warm))
    # the model's class lives outside the package: its own file is hashed into the key too
    (entry,) = entries(cache)
    sources = json.loads((entry / "factors.json").read_text())["source"]
    assert set(sources) == {"reference", str(Path(__file__).resolve())}, sources


@pytest.mark.requires("components")
def test_a_model_returning_what_is_not_graph_outputs_runs_uncached_with_one_warning(cache, impl):
    """Dynamo builds the dict outside the graph; a warm start, which runs only the graph, could not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with expect_counters(num_cache_misses=2, num_cache_hits=0, num_cache_entries_written=0):
            cold, again = _two_starts(_ReturnsADict, cache)
    said = [str(w.message) for w in caught if "compile cache" in str(w.message)]
    assert len(said) == 2 and all("the model returned dict" in s and "not cached" in s for s in said), said
    assert torch.equal(cold["scaled"], again["scaled"]) and entries(cache) == []


@pytest.mark.requires("components")
def test_a_graph_that_reads_its_own_attributes_is_not_stored_as_code():
    """Dynamo's graphs take parameters as inputs; a graph with a get_attr (here one FX traced itself) would
    need the attribute its stored code cannot hold."""
    traced = torch.fx.symbolic_trace(_ReturnsTwo())
    assert compile_cache.module_source(traced) == (
        "graph module reads get_attr 'weight', which the stored code cannot hold"
    )
    nested = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Sequential(torch.nn.ReLU())))
    assert compile_cache.module_source(nested) == (
        "graph module reads call_module '0.0', which the stored code cannot hold"
    )
    stored = compile_cache.module_source(torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1))
    assert torch.equal(compile_cache.StoredModule(stored)(torch.tensor([-1.0, 2.0])), torch.tensor([1.0, 3.0]))


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the key's device factor without a GPU."""

    is_cuda = True


def _factors(*args, config=None):
    return cache_key.cache_factors(torch.nn.Linear(3, 2), config or CompilationConfig(level=3), args)


@pytest.mark.requires("components")
def test_the_device_factor_names_the_gpu_and_its_compute_capability(monkeypatch):
    """An entry compiled for one GPU (its Triton and Inductor kernels target its architecture) must miss on
    another: the device factor holds the name and the compute capability of the first CUDA argument's GPU."""
    arg = torch.Tensor._make_subclass(_OnCuda, torch.zeros(4, 3))
    names, capability = [], {"value": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names.append(device) or "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: names.append(device) or capability["value"])
    hopper = _factors(torch.zeros(1), arg)["environment"]["device"]
    assert hopper == "NVIDIA H200 sm_90" and names == [arg.device, arg.device]  # the argument's own GPU
    capability["value"] = (8, 0)
    assert _factors(torch.zeros(1), arg)["environment"]["device"] == "NVIDIA H200 sm_80"
    assert _factors(torch.zeros(1))["environment"]["device"].startswith("cpu ")  # no CUDA argument: the CPU


@pytest.mark.requires("components")
def test_the_triton_factor_is_the_installed_version_or_null(monkeypatch):
    monkeypatch.setitem(sys.modules, "triton", type(sys)("triton"))
    sys.modules["triton"].__version__ = "3.6.0"
    assert _factors(torch.zeros(1))["environment"]["triton"] == "3.6.0"
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    assert _factors(torch.zeros(1))["environment"]["triton"] is None


@pytest.mark.requires("components")
def test_a_model_of_the_package_is_keyed_by_the_packages_sources_alone():
    """The package's hash covers its own model classes: their files are not hashed a second time."""
    from reference.models.toy_llama import ToyLlama

    assert list(cache_key.source_hashes(ToyLlama.__new__(ToyLlama))) == ["reference"]
    linear = Path(torch.nn.Linear.__module__.replace(".", "/")).with_suffix(".py")  # torch/nn/modules/linear.py
    outside = cache_key.source_hashes(torch.nn.Linear(3, 2))
    assert len(outside) == 2 and next(name for name in outside if name != "reference").endswith(str(linear))


class _Tied(torch.nn.Module):
    """Two names for one weight (a tied LM head), and a buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(4, 4, bias=False)
        self.head = torch.nn.Linear(4, 4, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(4))


@pytest.mark.requires("components")
def test_factors_json_names_each_factor_readably():
    """factors.json is for people: each factor under its documented name, with the values that shape a graph
    (a tied weight under both of its names, transformers' whole config, not only what differs from defaults)."""
    import platform

    hf = small_llama_config()
    model = torch.nn.Linear(3, 2)
    model.config = hf
    factors = cache_key.cache_factors(model, CompilationConfig(level=3), (torch.zeros(1, 3),))
    assert set(factors) == {"entry_format", "compilation", "model", "inputs", "source", "environment"}
    assert set(factors["model"]) == {"class", "config", "modules", "tensors", "rank_of_world"}
    assert factors["model"]["class"] == "torch.nn.modules.linear.Linear"
    assert factors["model"]["rank_of_world"] == [0, 1]  # one process
    assert factors["model"]["config"] == json.loads(hf.to_json_string(use_diff=False))
    env = factors["environment"]
    assert set(env) == {"python", "torch", "cuda", "triton", "device"}
    assert (env["python"], env["torch"]) == (platform.python_version(), torch.__version__)
    assert env["cuda"] == torch.version.cuda
    tied = cache_key.cache_factors(_Tied(), CompilationConfig(level=3), ())["model"]["tensors"]
    assert tied == [["embed.weight", [4, 4], "torch.float32"], ["head.weight", [4, 4], "torch.float32"],
                    ["scale", [4], "torch.float32"]]  # fmt: skip


@pytest.mark.requires("components")
def test_the_default_folder_is_under_the_users_cache_folder(monkeypatch, tmp_path):
    """Neither cache_dir nor $REFERENCE_COMPILE_CACHE: ~/.cache/piecewise-reference/torch_compile_cache (the
    folder README documents, beside vLLM's ~/.cache/vllm/torch_compile_cache)."""
    monkeypatch.setenv(cache_key.DISABLE_ENV, "0")
    monkeypatch.delenv(cache_key.FOLDER_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_key.cache_folder(CompilationConfig()) == tmp_path / ".cache/piecewise-reference/torch_compile_cache"


@pytest.mark.requires("components")
def test_only_fx_graph_cache_false_makes_a_config_uncachable_among_json_values():
    """Inductor keeps no artifact without its FX-graph cache; any other option set to False is an option."""
    assert cache_key.uncachable(CompilationConfig(inductor_compile_config={"fx_graph_cache": True})) is None
    assert cache_key.uncachable(CompilationConfig(inductor_compile_config={"max_autotune": False})) is None
    assert cache_key.uncachable(CompilationConfig(inductor_compile_config={"fx_graph_cache": False})) == (
        "inductor_compile_config['fx_graph_cache'] is False: Inductor keeps no artifact to store"
    )


def _a_pass(graph):  # an Inductor pass given as a function: no JSON spelling
    return graph


@pytest.mark.requires("components")
def test_the_inputs_factor_holds_each_arguments_dtype_device_and_shape_but_the_token_count():
    """Tensors by dtype, device and every dimension but the first (the token count, which varies per call);
    other arguments by type. A value JSON cannot hold (a pass given as a function) is written as its repr."""
    config = CompilationConfig(level=3, inductor_compile_config={"post_grad_custom_post_pass": _a_pass})
    factors = cache_key.cache_factors(torch.nn.Linear(3, 2), config, (torch.zeros(5, 3, 2), 7))
    assert factors["inputs"] == [["torch.float32", "cpu", [3, 2]], "int"]
    assert factors["compilation"]["inductor_compile_config"] == {"post_grad_custom_post_pass": repr(_a_pass)}
    assert re.fullmatch(r"[0-9a-f]{32}", cache_key.cache_key(factors))  # the folder name: 32 hex digits


def test_output_spec_is_a_lone_output_a_tuple_of_outputs_or_the_reason_neither_holds():
    """The stored form of the model's return value (``entry.json``'s ``outputs``): an index, or a tuple of
    indices; an empty tuple, a list, or a tuple holding a tensor no graph output is cannot be rebuilt."""
    a, b = torch.zeros(1), torch.ones(1)
    assert compile_cache.output_spec([a, b], b) == ("one", 1)
    assert compile_cache.output_spec([a, b], (b, a)) == ("tuple", [1, 0])
    reason = "the model returned {}, not graph outputs (a tensor or a tuple of them)"
    assert compile_cache.output_spec([a, b], ()) == reason.format("tuple")
    assert compile_cache.output_spec([a, b], [a, b]) == reason.format("list")
    assert compile_cache.output_spec([a, b], (a, torch.zeros(1))) == reason.format("tuple")


@pytest.mark.no_inductor
def test_an_entry_binds_each_graph_input_to_an_argument_a_parameter_or_an_arguments_size(cache, impl):
    """``entry.json``'s bindings, as a warm start reads them: the token ids and positions are the call's
    arguments, the weights (and the rotary tables) are named parameters (buffers), and the symbolic token count
    is dimension 0 of an argument."""
    start(impl, "no_inductor", cache)
    (entry,) = entries(cache)
    bindings = [tuple(b) for b in json.loads((entry / "entry.json").read_text())["bindings"]]
    kinds = {b[0] for b in bindings}
    assert kinds == {"arg", "tensor", "size"}, kinds
    model = build_llama(small_llama_config(), mode_config("no_inductor"))
    named = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    names = {name for name, _ in named}  # the rotary module is shared: each layer's name for it
    assert {b[1] for b in bindings if b[0] == "tensor"} <= names
    assert {b[2] for b in bindings if b[0] == "size"} == {0}


@pytest.mark.no_inductor
def test_a_model_with_tied_embeddings_is_served_from_its_entry(cache, impl):
    """One tensor under two parameter names (the embedding and the LM head): the entry binds it by one of
    them, and a warm start must find it by that name."""
    tied = small_llama_config(tie_word_embeddings=True)
    cold = start(impl, "no_inductor", cache, hf=tied)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with expect_counters(num_cache_hits=1, num_cache_misses=0):
            warm = start(impl, "no_inductor", cache, hf=tied)
    assert not [w for w in caught if "compile cache" in str(w.message)]
    assert all(torch.equal(a, b) for a, b in zip(cold, warm))


@pytest.mark.parametrize(
    "err, line",
    [(ValueError(""), "ValueError: "), (OSError("first\nsecond"), "OSError: first"),
     (KeyError("x" * 300), "KeyError: '" + "x" * 199)],
    ids=["empty", "two-lines", "long"],
)  # fmt: skip
def test_an_unusable_entrys_reason_is_the_errors_kind_and_first_line_cut_at_200_characters(err, line):
    assert compile_cache._first_line(err) == line


@pytest.mark.no_inductor
@pytest.mark.requires("components")
def test_a_warm_start_runs_a_splitting_op_with_no_direct_function_through_its_stored_code(cache, impl):
    """``reference::silly_attention`` has no function registered for direct calls: its pieces are kept as the
    trace made them, and a warm start must run their stored code (the mutation run of 2026-12-06 found no
    test that stored such a piece)."""
    from reference.compilation import compile_model
    from reference.models.silly import SILLY_SPLITTING_OPS, SillyModel, expected_output

    config = CompilationConfig(
        level=3, use_inductor=False, splitting_ops=list(SILLY_SPLITTING_OPS), cache_dir=str(cache)
    )
    x = torch.arange(4 * 8, dtype=torch.float32).reshape(4, 8)
    with expect_counters(num_cache_misses=1, num_cache_hits=1, num_cache_entries_written=1):
        cold, warm = [compile_model(SillyModel(), config)(x) for _ in range(2)]
    assert torch.equal(cold, expected_output(x)) and torch.equal(warm, cold)


@pytest.mark.no_inductor
def test_a_warm_start_calls_a_splitting_op_directly_where_the_cold_start_did(cache, impl, monkeypatch):
    """Attention has a direct function (``register_direct_call``): a trace installs it in place of the
    dispatcher's op, and a warm start must too, or every layer of every step pays the dispatcher's overhead
    again (an op call through it: 2.1 us against the function's 0.08 us on a CPU, perf/NOTES.md v13)."""
    from reference.ops import library
    from reference.ops.attention import ATTENTION_OP

    calls = {"direct": 0}
    direct = library.direct_call(ATTENTION_OP)

    def counted(*args):
        calls["direct"] += 1
        return direct(*args)

    monkeypatch.setitem(library._DIRECT_CALLS, ATTENTION_OP, counted)
    counts = []
    for _ in range(2):  # cold, then warm
        calls["direct"] = 0
        start(impl, "no_inductor", cache)
        counts.append(calls["direct"])
    assert counts[0] > 0 and counts[1] == counts[0], f"direct attention calls, cold and warm: {counts}"


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--overrides", "[1]"], "argument --overrides: expected a JSON object, got list '[1]'"),
        (["--overrides", "{bad"], "argument --overrides: expected a JSON object, got '{bad' ("),
        (["--overrides", '{"nope": 1}'], "--overrides / --mode: CompilationConfig.__init__() got an unexpected"),
        (["--mode", "bogus"], "--overrides / --mode: mode: expected one of"),
        (["--device", "tpu"], "argument --device: expected e.g. 'cpu', 'cuda' or 'cuda:1', got 'tpu'"),
    ],
    ids=["not-an-object", "not-json", "unknown-field", "unknown-mode", "unknown-device"],
)
def test_the_workers_bad_flags_are_one_line_not_a_traceback(tmp_path, flags, message):
    """The two-processes rule's worker gave tracebacks from deep in make_runner or torch (a new user's try)."""
    argv = [sys.executable, "-m", "conformance.compile_cache_worker", str(tmp_path / "cache"), *flags]
    run = subprocess.run(argv, cwd=forked.ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("python -m conformance.compile_cache_worker: error: " + message), run.stderr
    assert "Traceback" not in run.stderr
