"""Faults of the compile cache: a key that misses a factor, an entry read or written as if whole when it is not."""

from __future__ import annotations

import hashlib
import json
from unittest import mock

from conformance.faults.fault import Fault, patches
from reference.compilation import cache_key, capture, compile_cache, inductor_passes, partition_graph
from reference.compilation.backend import PiecewiseBackend

_real_cache_factors = cache_key.cache_factors
_real_read_entry = compile_cache.read_entry
_real_loaded = PiecewiseBackend.loaded
_real_use_compile_cache = capture.CompiledModel._use_compile_cache


def _key_without(edit):
    """A plant: ``cache_factors`` (as the compiled model calls it) with ``edit`` applied to its result."""

    def factors(model, config, args):
        result = _real_cache_factors(model, config, args)
        edit(result)
        return result

    return patches(mock.patch.object(capture, "cache_factors", factors))


def _no_dtypes(factors):
    factors["model"]["tensors"] = [tensor[:2] for tensor in factors["model"]["tensors"]]  # names and shapes only


def _written_in_place(folder, key, factors, files, artifacts, refused=None):
    """``write_entry`` writing each file, the manifest last, straight under the entry's name: a process that
    starts meanwhile finds a folder with some of the files and takes it for a whole entry or a damaged one."""
    final = folder / key
    final.mkdir(parents=True, exist_ok=True)
    (final / compile_cache._FACTORS).write_text(json.dumps(factors, indent=1, sort_keys=True) + "\n")
    for name, data in files.items():
        (final / name).write_bytes(data)
    for name, artifact in artifacts.items():
        artifact.save(path=str(final / f"{name}.bin"))
    manifest = {f.name: [f.stat().st_size, hashlib.sha256(f.read_bytes()).hexdigest()] for f in final.iterdir()}
    (final / compile_cache._MANIFEST).write_text(json.dumps(manifest))
    return True


def _read_unwrapped(folder, key, factors, build):
    """``read_entry`` loading Inductor's artifacts with no partition wrapper installed."""
    with partition_graph.partition_wrappers(None):
        return _real_read_entry(folder, key, factors, build)


def _artifact_files_by_kind(self):
    """``CacheWriter._artifact_files`` telling artifacts apart by their class, not by which object each is, so
    every piece is stored as the first piece's artifact, and a warm start runs it for all of them."""
    files, by_kind = {}, {}
    for name in sorted(self._artifacts):
        files[name] = by_kind.setdefault(type(self._artifacts[name]), name)
    return files, {file: self._artifacts[file] for file in set(files.values())}


def _hit_taken_for_a_trace(self, args):
    """``CompiledModel._use_compile_cache`` that reports every first call as a trace, hit or not: the runner's
    kernel warm-up starts for a start the cache serves, which has no trace to hide it behind."""
    _real_use_compile_cache(self, args)
    return False


def _loaded_without_waiting(self, entry):
    """``PiecewiseBackend.loaded`` that leaves ``before_first_run`` uncalled: only a trace waits for the runner's
    kernel warm-up, so a start the compile cache serves runs (and, with no warm-up runs, captures) its pieces
    while the warm-up's thread still launches kernels."""
    hook, self.before_first_run = self.before_first_run, None
    try:
        return _real_loaded(self, entry)
    finally:
        self.before_first_run = hook


FAULTS = [
    Fault(
        id="cache-key-ignores-dtype",
        kind="cache",
        description="the compile cache's key leaves out the parameters' dtype, so a bf16 model is served the "
        "float32 model's graphs and kernels",
        plant=_key_without(_no_dtypes),
        tests="test_a_changed_factor_misses and dtype",
    ),
    Fault(
        id="cache-key-ignores-custom-ops",
        kind="cache",
        description="the compile cache's key leaves out the custom-op choice, so a model built with native norms "
        "is served the graph of one built with the custom ones",
        plant=_key_without(lambda f: [f["compilation"].pop("custom_ops"), f["model"].pop("modules")]),
        tests="test_a_changed_factor_misses and custom_ops",
    ),
    Fault(
        id="cache-key-ignores-capture-sizes",
        kind="cache",
        description="the compile cache's key leaves out the capture sizes",
        plant=_key_without(lambda f: f["compilation"].pop("cudagraph_capture_sizes")),
        tests="test_a_changed_factor_misses and capture_sizes",
    ),
    Fault(
        id="cache-key-ignores-compile-sizes",
        kind="cache",
        description="the compile cache's key leaves out compile_sizes, so a start that asks for static compiles is "
        "served an entry without them (or with other sizes')",
        plant=_key_without(lambda f: f["compilation"].pop("compile_sizes")),
        tests="test_a_warm_start_serves_the_static_compiles_of_compile_sizes_too",
    ),
    Fault(
        id="cache-key-ignores-splitting-ops",
        kind="cache",
        description="the compile cache's key leaves out the splitting ops, so a graph split elsewhere is served",
        plant=_key_without(lambda f: f["compilation"].pop("splitting_ops")),
        tests="test_a_changed_factor_misses and splitting_ops",
    ),
    Fault(
        id="cache-key-ignores-graph-partition",
        kind="cache",
        description="the compile cache's key leaves out use_inductor_graph_partition, so a start that asks for "
        "Inductor's own partitions is served the FX split's entry, or the other way round",
        plant=_key_without(lambda f: f["compilation"].pop("use_inductor_graph_partition")),
        tests="test_inductors_graph_partition_is_a_factor",
    ),
    Fault(
        id="cache-serves-entries-of-old-code",
        kind="cache",
        description="the compile cache's key leaves out the source files, so after an edit of the model's code "
        "the graph traced from the old code is served",
        plant=_key_without(lambda f: f.pop("source")),
        tests="test_the_key_follows_the_source",
        bug="vLLM #24915",
    ),
    Fault(
        id="cache-manifest-not-checked",
        kind="cache",
        description="the compile cache reads an entry without checking its files against the manifest, so a torn "
        "or mixed entry whose files still parse is served as whole",
        plant=patches(mock.patch.object(compile_cache, "_check_manifest", lambda path: None)),
        tests="test_an_unusable_entry_warns_once and file_of_another_entry",
    ),
    Fault(
        id="cache-entry-written-in-place",
        kind="cache",
        description="the compile cache writes an entry's files under the entry's own name, not a temporary one "
        "renamed when whole, so a process starting meanwhile reads part of an entry as the entry",
        plant=patches(mock.patch.object(compile_cache, "write_entry", _written_in_place)),
        tests="test_an_entry_is_written_under_a_temporary_name",
    ),
    Fault(
        id="inductor-key-ignores-partition-wrappers",
        kind="cache",
        description="Inductor's FX-graph cache key leaves out whether Inductor's partitions are wrapped, so a "
        "compile to be captured per partition may be served code made without partitions, and capture nothing",
        plant=patches(
            mock.patch.object(inductor_passes.PartitionWrappersKey, "uuid", lambda self: b"partition wrapper")
        ),
        tests="test_inductors_cache_keys_a_compile_with_partition_wrappers_apart_from_one_without",
        bug="pytorch#165471",
    ),
    Fault(
        id="cache-loads-partitions-unwrapped",
        kind="cache",
        description="a compile-cache hit loads Inductor's artifacts with no partition wrapper installed, so a warm "
        "start under use_inductor_graph_partition runs its partitions as compiled and captures no graph",
        plant=patches(mock.patch.object(capture, "read_entry", _read_unwrapped)),
        tests="test_a_warm_start_traces_and_compiles_nothing and inductor_graph_partition and cuda",
        device="cuda",
    ),
    Fault(
        id="cache-hit-runs-before-the-kernel-warm-up-ends",
        kind="cache",
        description="a start served by the compile cache runs its pieces without waiting for the kernel warm-up's "
        "thread (only a trace waits), so a capture can meet that thread's launches",
        plant=patches(mock.patch.object(PiecewiseBackend, "loaded", _loaded_without_waiting)),
        tests="test_the_backend_calls_before_first_run_once_after_compiling_and_before_any_piece_runs",
    ),
    Fault(
        id="kernel-warm-up-on-a-cache-hit",
        kind="cache",
        description="the compiled model calls before_trace on a compile-cache hit too, so a warm start runs the "
        "kernel warm-up's step with no trace to hide it and waits for it",
        plant=patches(mock.patch.object(capture.CompiledModel, "_use_compile_cache", _hit_taken_for_a_trace)),
        tests="test_the_runner_warms_up_kernels_only_for_a_start_that_traces",
    ),
    Fault(
        id="one-artifact-for-every-piece",
        kind="cache",
        description="the compile cache stores pieces that share a compile in one file, but tells them apart by the "
        "artifact's class, so every piece is stored, and served warm, as the first piece's compile",
        plant=patches(mock.patch.object(compile_cache.CacheWriter, "_artifact_files", _artifact_files_by_kind)),
        tests="test_piece_key or warm_start",
    ),
]
