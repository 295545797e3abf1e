"""End-to-end generation latency per compilation mode, like vLLM's ``benchmark_latency``: the CLI.

``python -m reference.bench_latency --model llama-3.1-8b --modes eager,no_inductor,no_inductor_full
--baselines hf-eager,hf-compile --results-dir``

The run itself is :mod:`reference.benchmark.latency` (what one iteration is, the floor), the tables and
files :mod:`reference.benchmark.report`. Each LLM gets ``max_num_seqs = batch_size`` and
``max_model_len = input_len + output_len`` and ``max_num_batched_tokens = batch_size * input_len`` (the
prefill, its largest step), so, unless ``--compilation-config`` says otherwise, its capture sizes are the
engine's default for those (:func:`reference.engine.arguments.engine_capture_sizes`): every decode step
runs at exactly ``batch_size`` tokens, and a prefill of up to 512 tokens replays piecewise graphs.

vLLM's spellings work too (:mod:`reference.benchmark.vllm_flags`): ``-O0`` .. ``-O3`` (or
``--optimization-level N``), vLLM's optimization level, pick the mode it stands for; ``-cc`` is
``--compilation-config``, and ``-O.FIELD=VALUE``, ``-cc.FIELD=VALUE`` or ``--compilation-config.FIELD=VALUE``
(or ``VALUE`` as the next argument) set one field (VALUE read as JSON or a Python literal, else as a string;
dots nest; several merge, with a whole ``--compilation-config`` too, each field given once).

Only argparse and reference.config are imported before the flags are parsed, so ``--help`` and usage
errors answer at once; torch, transformers and the models load after.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reference.benchmark.choices import BASELINES, DTYPE_NAMES, MODE_KWARGS
from reference.benchmark.cli import (
    OneLineParser,
    check_output_file,
    check_writable_dir,
    device_name,
    engine_sizes_hint,
    environment_help,
    mode_names,
    model_name,
    names_of,
    non_empty_path,
    non_negative_int,
    output_file,
    positive_int,
    seed,
    thread_count,
    usage_error,
)
from reference.benchmark.overrides import (
    add_compilation_flags,
    check_overrides,
    level_mode,
    parse_with_vllm_spellings,
)
from reference.config import ConfigError

DEFAULT_RESULTS_DIR = "perf/results"
# what the usage line calls the program: the console script's name, or how README runs the module
CONSOLE_SCRIPT = "reference-bench-latency"
PROG = CONSOLE_SCRIPT if Path(sys.argv[0]).name == CONSOLE_SCRIPT else "python -m reference.bench_latency"


# ---------------------------------------------------------------------- command line
def _check_output_paths(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse output paths that cannot be written before the run, not after its minutes of timing: a
    directory given as ``--output-json``, a file as ``--results-dir``, a place this process cannot write
    (missing folders are made when the files are written, not here)."""
    if args.output_json is not None:
        check_output_file(parser, "--output-json", args.output_json)
    if args.results_dir is not None:
        check_writable_dir(parser, "--results-dir", args.results_dir)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Latency of whole generate calls per compilation mode, over one set of weights, with the "
        "memory-bandwidth floor and optional transformers baselines.",
        epilog="Modes: eager = enforce_eager (level 0, custom ops on); breakable = level 0 with piecewise CUDA "
        "graphs (the eager model captured in segments broken at attention; no trace, no compile); no_inductor = "
        "level 3, use_inductor False, custom_ops ['all'], piecewise CUDA graphs; inductor = level 3, use_inductor "
        "True; no_inductor_full / inductor_full = the same plus a full CUDA graph per decode batch size "
        "(cudagraph_mode full_and_piecewise). Each LLM gets max_num_seqs = --batch-size and max_model_len = "
        "--input-len + --output-len and max_num_batched_tokens = --batch-size x --input-len (the prefill); unless "
        "--compilation-config sets them, capture sizes are 1, 2, 4, the multiples of 8 below --batch-size and "
        "--batch-size itself (decode), then 8, 16, 24, 32, 48, 64, ... below the prefill's tokens and those tokens "
        "themselves, at most 512. " + environment_help(),
    )
    default = " (default: %(default)s)"
    parser.add_argument(
        "--model",
        type=model_name,
        default="llama-tiny",
        help="preset name, gemma-3-270m (pretrained weights), a .gguf file or a checkpoint dir" + default,
    )
    parser.add_argument("--batch-size", type=positive_int, default=8, help="prompts per generate call" + default)
    parser.add_argument("--input-len", type=positive_int, default=32, help="prompt tokens" + default)
    parser.add_argument("--output-len", type=positive_int, default=128, help="generated tokens" + default)
    parser.add_argument(
        "--num-iters-warmup", type=non_negative_int, default=10, help="untimed calls per mode" + default
    )
    parser.add_argument("--num-iters", type=positive_int, default=30, help="timed calls per mode" + default)
    parser.add_argument(
        "--modes",
        type=mode_names,
        default=None,
        help=f"comma-separated, run in this order (default: {','.join(MODE_KWARGS)}; 'eager' with --enforce-eager)",
    )
    add_compilation_flags(parser)
    parser.add_argument("--enforce-eager", action="store_true", help="shorthand for --modes eager (vLLM's flag)")
    parser.add_argument("--dtype", choices=["auto", *DTYPE_NAMES], default="auto", help="as LLM(dtype=...)" + default)
    parser.add_argument("--device", type=device_name, default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of random weights and of the prompts" + default)
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=None,
        help="torch intra-op threads (default: 1 on a CPU, where more swing the tiny presets' latencies; "
        "torch's own count on CUDA)",
    )
    parser.add_argument(
        "--tensor-parallel-size",
        "-tp",
        type=positive_int,
        default=1,
        help="processes the model is sharded over (vLLM's flag); above 1, start one per device with "
        "torchrun --nproc-per-node N -m reference.bench_latency ...; rank 0 prints and writes" + default,
    )
    parser.add_argument(
        "--baselines",
        type=names_of(BASELINES, "baseline"),
        default=[],
        help=f"comma-separated baselines to run too: {', '.join(BASELINES)} (default and '': none); hf-*: "
        "transformers generate on the same weights; torch-native: torch's own piecewise path (Inductor graph "
        "partition + CUDA graph trees) in this engine, with the inductor mode's config",
    )
    parser.add_argument(
        "--num-iters-baseline", type=positive_int, default=None, help="timed calls per baseline (default: --num-iters)"
    )
    parser.add_argument(
        "--num-iters-warmup-baseline",
        type=non_negative_int,
        default=2,
        help="untimed calls per baseline; the first compiles hf-compile, the second records its CUDA graphs "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--output-json", type=output_file, default=None, help="write the results JSON here"
    )
    parser.add_argument(
        "--results-dir",
        type=non_empty_path("a directory"),
        nargs="?",
        const=Path(DEFAULT_RESULTS_DIR),
        default=None,
        help=f"write <model>-<date>-<time>.json and .md here (default without a value: {DEFAULT_RESULTS_DIR})",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the flags; errors exit with code 2 and name the flag."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parse_with_vllm_spellings(parser, given)
    mode = level_mode(parser, args)
    if args.enforce_eager and mode not in (None, "eager"):
        parser.error(f"--enforce-eager contradicts -O{args.optimization_level} (--modes {mode}); drop one of them")
    args.modes = [mode] if mode is not None else args.modes
    if args.enforce_eager:
        if args.modes not in (None, ["eager"]):
            parser.error(f"--enforce-eager contradicts --modes {','.join(args.modes)}; drop one of them")
        args.modes = ["eager"]
    args.modes = args.modes or list(MODE_KWARGS)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.tensor_parallel_size == 1 and world > 1:  # every process would run, print and write alone
        parser.error(
            f"--tensor-parallel-size 1 under {world} processes (WORLD_SIZE); pass --tensor-parallel-size {world}"
        )
    if args.tensor_parallel_size > 1 and args.baselines:
        parser.error(
            f"--baselines {','.join(args.baselines)}: the baselines run in one process, not with "
            f"--tensor-parallel-size {args.tensor_parallel_size}; drop one of them"
        )
    tokens = args.batch_size * args.input_len  # the prefill: the engine's max_num_batched_tokens (module doc)
    check_overrides(
        parser,
        args.compilation_config,
        args.modes,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=tokens,
        no_compiled_mode="--enforce-eager runs only eager" if args.enforce_eager else "--modes has none",
    )
    import torch

    from reference.models import registry

    max_positions = registry.model_config(args.model).max_position_embeddings
    if args.input_len + args.output_len > max_positions:
        parser.error(
            f"--input-len + --output-len = {args.input_len + args.output_len} exceeds the model's "
            f"max_position_embeddings ({max_positions})"
        )
    _check_output_paths(parser, args)
    if args.num_iters_baseline is None:
        args.num_iters_baseline = args.num_iters
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.argv, args.prog = given, PROG
    return args


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point; prints the table and writes the requested files.

    The JSON document: ``{"model", "settings", "weight_bytes_per_decode_step", "bandwidth_Bps",
    "bandwidth_method", "results": [{"mode", "kind" ('engine' | 'baseline'), "latency_s": {"avg", "p50",
    "p90"}, "iters", "startup": {"load_s", "compile_s", "compile_cache_hits" (entries the compile cache served:
    a warm start), "capture_s", "graph_gib", "capture_sizes", "full_capture_sizes"} (engine; a baseline's is
    {"first_call_s"}), "tokens_per_s", "floor_s", "x_floor", "speedup_vs" (engine),
    "same_tokens_as_first", ...}], "env": {"gpu", "cpu" (model name), "cpu_count", "threads" (torch's),
    "load_avg" (after the run) and "load_avg_at_start" (1, 5, 15 min), "gpu_clocks" (MHz, from nvidia-smi),
    "torch", "transformers", "custom_op_kernels" ('triton' | 'torch'), "date", "command"}}``.
    Times are seconds; ``x_floor`` and ``speedup_vs`` use p50. Ctrl-C keeps the finished modes: their
    table and files, ``"interrupted"`` saying where it stopped, exit status 130 (nothing finished: one line).
    """
    args = parse_args(argv)
    from reference.benchmark.latency import Interrupted, run
    from reference.benchmark.report import markdown_header, markdown_table, write_results
    from reference.models.loader import CheckpointError

    try:
        doc = run(args)
    except CheckpointError as err:  # the weights' files, which no flag fixes
        print(f"{PROG}: error: {err}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as err:  # found when a model is checked against memory or compiled: the flags' doing
        print(usage_error(PROG, engine_sizes_hint(str(err), "--input-len + --output-len")), file=sys.stderr)
        sys.exit(2)
    except Interrupted as err:  # Ctrl-C before any mode finished: nothing to show
        print(f"{PROG}: {err}", file=sys.stderr)
        sys.exit(130)
    except ValueError as err:
        if "tensor_parallel_size" not in str(err):
            raise
        if os.environ.get("RANK", "0") == "0":  # every rank finds the same error; one says it
            print(usage_error(PROG, str(err)), file=sys.stderr)
        sys.exit(2)
    if _leave_group():  # every rank ran the same steps; one speaks
        return
    print(markdown_header(doc))
    print(markdown_table(doc))
    try:
        written = write_results(doc, args.output_json, args.results_dir)
    except OSError as err:  # checked writable up front, but a disk can fill during the run
        where = f" {err.filename}" if err.filename else ""
        print(f"{PROG}: error: cannot write the results{where} ({err.strerror or err})", file=sys.stderr)
        sys.exit(2)
    for path in written:
        print(f"wrote {path}", file=sys.stderr)
    if "interrupted" in doc:  # Ctrl-C: the finished modes are above and in the files
        print(f"{PROG}: {doc['interrupted']}", file=sys.stderr)
        sys.exit(130)


def _leave_group() -> bool:
    """Leave the tensor-parallel group, if there is one; True on ranks other than 0."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return False
    rank = dist.get_rank()
    dist.destroy_process_group()
    return rank != 0


if __name__ == "__main__":
    main()
