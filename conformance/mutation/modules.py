"""Which code each mutation-testing module mutates, and which test files may kill its mutants.

A module is a name given to ``./run mutate``: a few source files and the narrow test files that exercise them,
so that one module's run fits a 2-core machine in minutes. mutmut then runs, for each mutant, only those of
these tests that called the mutated function while it collected its stats, so the lists may be generous
within a module's files, but never the whole suite.
"""

from __future__ import annotations

from dataclasses import dataclass


class UnknownModule(ValueError):
    """A name given to ``./run mutate`` is not a module of :data:`MODULES`."""


@dataclass(frozen=True)
class Module:
    """One unit of a mutation run.

    Attributes:
        sources: glob patterns of the files mutmut mutates, relative to the repository root.
        tests: the test files (relative to the repository root) whose tests may kill those mutants, or single
            tests of a file by pytest node id (``FILE::TEST``) where the file's others are too slow to run for
            every mutant.
    """

    sources: tuple[str, ...]
    tests: tuple[str, ...]


MODULES: dict[str, Module] = {
    "benchmark.results": Module(
        sources=("reference/benchmark/results.py", "reference/benchmark/summary.py"),
        tests=("conformance/test_results_report.py", "conformance/test_results_rules.py"),
    ),
    "benchmark.report": Module(
        sources=(
            "reference/benchmark/report.py",
            "reference/benchmark/chart.py",
            "reference/benchmark/throughput_results.py",
            "reference/report.py",
        ),
        tests=(
            "conformance/test_results_contents.py",
            "conformance/test_results_report.py",
            "conformance/test_results_rules.py",
            "conformance/test_throughput_report.py",
        ),
    ),
    "benchmark.cli": Module(
        # what every command line shares: the one-line parser, the flag types, the output-path checks
        sources=("reference/benchmark/cli.py",),
        tests=(
            "conformance/test_cli_types.py",
            "conformance/test_output_paths.py",
            "conformance/test_bench_cli.py",
            "conformance/test_bench_startup.py",
            "conformance/test_bench_throughput.py",
        ),
    ),
    "compilation": Module(
        # the CPU-reachable stages: trace, split, compile each piece, count; the CUDA-graph wrappers
        # (cuda_graph.py, full_graph.py, replays.py, stale_outputs.py, and breakable.py, whose code is its
        # capture) capture nothing on a CPU: their mutants would all count as reached by no test
        sources=(
            "reference/compilation/capture.py",
            "reference/compilation/backend.py",
            "reference/compilation/split.py",
            "reference/compilation/compile_piece.py",
            "reference/compilation/counters.py",
            "reference/compilation/inductor_passes.py",
            "reference/compilation/warning_site.py",
        ),
        tests=(
            "conformance/test_structure.py",
            "conformance/test_backend_pieces.py",
            "conformance/test_compiled_model.py",
            "conformance/test_what_ran.py",
            "conformance/test_inductor_passes.py",
            "conformance/test_graph_replays.py",
            "conformance/test_stale_outputs.py",
            "conformance/test_custom_ops.py",
            "conformance/test_compile_sizes.py",
            "conformance/test_stamp.py",  # the tracing call of a prefix, and the backend's stamping and its inputs
            # the compile cache's hooks in capture.py (lookup at the first call, the entry written after it);
            # the suite runs with the cache off, so no other file reaches them
            "conformance/test_compile_cache.py",
            # use_inductor_graph_partition's refusal and cache-key pass, by node id: the file's other tests
            # compile with Inductor, and every backend mutant that survives would run them all
            "conformance/test_inductor_graph_partition.py::test_an_op_inductor_cuts_at_must_write_into_buffers_under_"
            "piecewise_graphs",
            "conformance/test_inductor_graph_partition.py::test_the_mode_sets_inductors_partition_and_a_pass_that_keys_"
            "the_wrapper",
            "conformance/test_inductor_graph_partition.py::test_inductors_cache_keys_a_compile_with_partition_wrappers_"
            "apart_from_one_without",
            "conformance/test_inductor_graph_partition.py::test_the_cache_key_pass_says_whether_a_partition_wrapper_is_"
            "installed",
            # the FX split's one piece under the partition, and the splitting-op warning's partition branch (the
            # compilation run of 2026-12-07 left both alive: no selected test reached them)
            "conformance/test_inductor_graph_partition.py::test_with_inductors_partition_the_fx_split_keeps_the_graph_"
            "one_piece",
            "conformance/test_inductor_graph_partition.py::test_naming_an_op_the_graph_lacks_is_no_warning_where_"
            "inductor_still_cuts_at_attention",
            # what the backend hands Inductor's partitions and its pieces on CUDA (pool, stream, capture
            # settings), checked on a CPU with torch.cuda's pool handle and stream faked
            "conformance/test_inductor_graph_partition.py::test_on_cuda_each_partition_is_wrapped_with_the_configs_"
            "capture_settings",
            "conformance/test_inductor_graph_partition.py::test_partitions_get_no_graph_off_cuda_without_piecewise_"
            "graphs_or_partition",
            "conformance/test_inductor_graph_partition.py::test_either_the_pieces_or_the_partitions_get_graphs",
            "conformance/test_inductor_graph_partition.py::test_on_cuda_each_compiled_piece_is_wrapped_with_the_"
            "configs_capture_settings",
            # the backend's use of the key (identical pieces share one Inductor compile), by node id as above
            "conformance/test_piece_key.py::test_with_inductor_each_program_compiles_once_and_each_piece_computes_its_"
            "own_layer",
        ),
    ),
    "compilation.piece_key": Module(
        # the key that lets identical pieces share one Inductor compile: a key blind to a factor serves one piece
        # another's compile, so its rules compare keys and check shared compiles' arithmetic
        sources=("reference/compilation/piece_key.py",),
        tests=("conformance/test_piece_key.py",),
    ),
    "compilation.stamp": Module(
        # stamped layers: a copy that reads the wrong node, weight or layer name, or a check that lets a trace
        # through which stamping cannot serve; the rule compares each architecture's stamped graph to its whole
        # trace, the stack tests each refusal
        sources=("reference/compilation/stamp.py",),
        tests=("conformance/test_stamp.py",),
    ),
    "compilation.cache": Module(
        sources=(
            "reference/compilation/cache_key.py",
            "reference/compilation/compile_cache.py",
            "reference/compilation/key_prefetch.py",
        ),
        tests=("conformance/test_compile_cache.py", "conformance/test_key_prefetch.py"),
    ),
    "config": Module(
        sources=("reference/config/*.py",),
        tests=("conformance/test_config.py", "conformance/test_config_rules.py"),
    ),
    "engine.sampling": Module(
        sources=("reference/engine/sampling.py",),
        tests=(
            "conformance/test_sampling.py",
            "conformance/test_sampling_rules.py",
            "conformance/test_sampling_edges.py",
        ),
    ),
    "engine.requests": Module(
        sources=(
            "reference/engine/requests.py",
            "reference/engine/arguments.py",
            "reference/engine/step_inputs.py",
            "reference/engine/kv_cache.py",
            "reference/engine/memory_check.py",
        ),
        tests=(
            "conformance/test_requests.py",
            "conformance/test_engine_arguments.py",
            "conformance/test_llm.py",
            "conformance/test_runner.py",
            "conformance/test_generate_batching.py",
        ),
    ),
    "parallel": Module(
        # the layers' collectives run on threads of one process (SimulatedGroup): torchrun's processes, where
        # conformance/test_tensor_parallel.py runs whole models, are invisible to the tool
        sources=("reference/parallel/*.py",),
        tests=("conformance/test_parallel_layers.py",),
    ),
    "engine.runner": Module(
        # the step's host side and the offline engine; the CUDA-only parts (graph dispatch on the device, the
        # device-fed decode loop's stream work) are reached on a CPU only through their CPU fallbacks
        sources=("reference/engine/runner.py", "reference/engine/graph_plan.py", "reference/engine/llm.py"),
        tests=(
            "conformance/test_runner.py",
            "conformance/test_llm.py",
            "conformance/test_llm_construction.py",
            "conformance/test_runner_construction.py",
            "conformance/test_full_graphs.py",
            "conformance/test_full_graphs_of_every_step.py",
            "conformance/test_generate_batching.py",
            "conformance/test_engine_arguments.py",
            "conformance/test_requests.py",
        ),
    ),
    "engine.scheduler": Module(
        # continuous batching: which requests run in a step and the loop that issues and reads the steps
        sources=("reference/engine/scheduler.py", "reference/engine/llm_engine.py"),
        tests=(
            "conformance/test_continuous_batching.py",
            "conformance/test_generate_batching.py",
            "conformance/test_llm.py",
            "conformance/test_llm_construction.py",
        ),
    ),
    "ops.fused": Module(
        # the GEMM fusions' wiring and references, and the tuned-config table; the small-M kernel runs on CUDA
        # (or under Triton's interpreter), so its own lines are the hand-written CUDA mutants' business. Only
        # eager models: Dynamo cannot trace the tool's trampolines (they read a ContextVar)
        sources=("reference/ops/fused_linear.py", "reference/ops/linear_configs.py"),
        tests=(
            "conformance/test_fused_linear.py",
            "conformance/test_linear_configs.py",
            "conformance/test_custom_ops.py",
        ),
    ),
    "ops.launch": Module(
        # the programmatic-dependent-launch switch; on a CPU the capability and device lines are not reached (the
        # kernels' own wait is the PTX rule's and the catalogue's business on a GPU); the launcher and its
        # compile-only switch, against a stand-in for Triton's parallel compile
        sources=("reference/ops/dependent_launch.py", "reference/ops/kernel_launch.py"),
        tests=("conformance/test_dependent_launch.py", "conformance/test_kernel_launch.py"),
    ),
    "ops.metadata": Module(
        # what attention reads per step, built on the host: the step metadata and a full graph's tables (their
        # flat form, the gap entry over the decodes, the padding); the kernels that read them run on CUDA only
        sources=("reference/ops/attention_metadata.py",),
        tests=(
            "conformance/test_attention_metadata.py",
            "conformance/test_attention_masks.py",
            "conformance/test_full_graphs_of_every_step.py",
            "conformance/test_continuous_batching.py",
        ),
    ),
    "models.checkpoint": Module(
        sources=("reference/models/loader.py", "reference/models/safetensors_files.py"),
        tests=(
            "conformance/test_loader.py",
            "conformance/test_checkpoint_errors.py",
            "conformance/test_checkpoint_layouts.py",
            "conformance/test_checkpoint_files.py",
            "conformance/test_checkpoint_missing.py",
        ),
    ),
}


def resolve(names: list[str]) -> list[str]:
    """The modules to run: ``names`` in order, or every module when ``names`` is empty.

    Raises:
        UnknownModule: a name is not in :data:`MODULES` (the message names it and lists the allowed ones), or
            is given twice.
    """
    for index, name in enumerate(names):
        if name not in MODULES:
            raise UnknownModule(f"module: unknown {name!r}; expected one of {', '.join(MODULES)}")
        if name in names[:index]:  # a second run would overwrite the first's row with the same numbers
            raise UnknownModule(f"module: {name!r} given twice; give each module once")
    return list(names) or list(MODULES)
