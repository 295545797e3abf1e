"""Cold and warm start-up per compilation mode, each start in a fresh process, like vLLM's ``vllm bench startup``.

``python -m reference.bench_startup --model llama-3.1-8b --modes no_inductor,inductor --output-json startup.json``

``--compilation-config`` (``-O.FIELD=VALUE`` and vLLM's other spellings, as in ``bench_latency``) changes the
compiled modes' configs, e.g. ``--modes inductor -O.use_inductor_graph_partition=true`` times Inductor's graph
partition against the FX split; ``-O<n>`` picks the mode vLLM's optimization level stands for.

Per mode: a cold start (its compiler-cache folder emptied), then a warm start (the cache the cold one filled),
each split into import, weights, compile (trace, split, pieces), capture and first step; ``ready`` is compile
+ capture, the mode's own share (:mod:`reference.benchmark.startup` says what each phase holds). The caches
are the project's compile cache (levels 2-3: a warm start neither traces nor compiles) and torch's
(Inductor's FX-graph and AOTAutograd caches, Triton's kernels); ``eager`` and ``breakable`` trace nothing,
so only Triton's kernels can make their warm start faster. Each LLM-like runner gets
``max_num_seqs = --batch-size`` and a step budget of ``--batch-size x --input-len`` tokens, so its capture sizes
are ``bench_latency``'s.

Only argparse and the light parts of the project load before the flags are checked: ``--help`` and usage
errors answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Iterator

from reference.benchmark.choices import DTYPE_NAMES, MODE_KWARGS, mode_kwargs
from reference.benchmark.cli import (
    OneLineParser,
    check_output_file,
    check_writable_dir,
    device_name,
    engine_sizes_hint,
    environment_help,
    mode_names,
    model_name,
    non_empty_path,
    output_file,
    positive_int,
)
from reference.benchmark.overrides import add_compilation_flags, check_overrides, level_mode, parse_with_vllm_spellings
from reference.config import echo

PROG = "python -m reference.bench_startup"
COLUMNS = ("import_s", "weights_s", "compile_s", "capture_s", "ready_s", "first_step_s")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Cold and warm start-up per compilation mode, each start in a fresh process: import, "
        "weights, compile, capture, first step (seconds).",
        epilog="Each mode's starts keep the compile cache on, in a folder of its own under --cache-dir, whatever "
        "REFERENCE_COMPILE_CACHE and REFERENCE_DISABLE_COMPILE_CACHE say. " + environment_help(),
    )
    default = " (default: %(default)s)"
    parser.add_argument(
        "--model",
        type=model_name,
        default="llama-tiny",
        help="preset, pretrained name, .gguf file or checkpoint dir" + default,
    )
    parser.add_argument(
        "--modes",
        type=mode_names,
        default=None,
        help=f"comma-separated, run in this order (default: {','.join(MODE_KWARGS)})",
    )
    add_compilation_flags(parser)
    parser.add_argument("--batch-size", type=positive_int, default=8, help="sequences per step" + default)
    parser.add_argument("--input-len", type=positive_int, default=32, help="prompt tokens per sequence" + default)
    parser.add_argument("--dtype", choices=["auto", *DTYPE_NAMES], default="auto", help="as LLM(dtype=...)" + default)
    parser.add_argument("--device", type=device_name, default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument(
        "--cache-dir",
        type=non_empty_path("a directory"),
        default=None,
        help="where each mode's compiler caches live, one folder per mode, emptied before its cold start; a "
        "mode's folder that this tool did not make and that is not empty is refused, not emptied "
        "(default: a temporary folder, removed at the end)",
    )
    parser.add_argument(
        "--output-json", type=output_file, default=None, help="write the rows as JSON here"
    )
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised where it arrives as Ctrl-C's KeyboardInterrupt is (:func:`_sigterm_raises`)."""


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`_Terminated`, so ``timeout`` or a job scheduler stopping the run
    gets what Ctrl-C gets: the temporary cache folder removed (hundreds of MB), the running child killed by
    ``subprocess.run``, the finished modes printed and written. Elsewhere (a thread, an embedding program that
    set its own handler) the handler is left as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def terminated(signum, frame):
        raise _Terminated()

    before = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _check_before_any_start(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before minutes of starts, what would fail after them or inside a child: an output or cache
    folder that cannot be written, a cache path with a space, a mode's folder there that is not this tool's to
    empty, a prompt longer than the model's positions."""
    if args.cache_dir is not None:
        check_writable_dir(parser, "--cache-dir", args.cache_dir)
        if any(c.isspace() for c in str(args.cache_dir.resolve())):
            parser.error(
                f"--cache-dir: {echo(str(args.cache_dir))} has a space, which Inductor's C++ compile cannot take "
                "(torch passes the path unquoted); choose a path without one"
            )
        from reference.benchmark import startup  # no torch: its children import it

        for mode in args.modes:
            try:
                startup.check_mode_folder(args.cache_dir, mode)
            except startup.StartupError as err:
                parser.error(str(err))
    if args.output_json is not None:
        check_output_file(parser, "--output-json", args.output_json)
    from reference.models import registry  # transformers: after the cheap checks

    positions = registry.model_config(args.model).max_position_embeddings
    if args.input_len + 1 > positions:
        parser.error(
            f"--input-len {args.input_len}: a prompt and its decode token need {args.input_len + 1} positions; "
            f"{args.model} has {positions} (max_position_embeddings)"
        )


def table(rows: list[dict]) -> str:
    """The rows as a markdown table, seconds with 2 decimals."""
    head = ["mode", "start", *(c.removesuffix("_s") for c in COLUMNS)]
    head += ["compile cache hit", "inductor cache hits / misses"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["mode"], row["start"], *(f"{row[c]:.2f}" for c in COLUMNS)]
        cells.append("yes" if row.get("compile_cache_hits") else "no")
        cells.append(f"{row['inductor_cache_hits']} / {row['inductor_cache_misses']}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def warm_miss_note(mode: str, cold: dict, warm: dict) -> str | None:
    """Why ``mode``'s warm row is no warm start, or None: a start at level 2 or 3 (the levels the compile cache
    serves; bench_startup turns the cache on) whose warm start the cache did not serve. It names the compile cache's
    warnings of the cold start (an entry it could not write) and of the warm one (an entry it could not read), else
    says that none was printed. Rows as :func:`reference.benchmark.startup.measure_mode` gives them."""
    if warm["compilation_config"].get("level", 0) < 2 or warm["compile_cache_hits"]:
        return None
    said = [f"{start} start: {text}" for start, row in (("cold", cold), ("warm", warm))
            for text in row["compile_cache_warnings"]]  # fmt: skip
    reason = " | ".join(said) if said else "neither start printed a compile cache warning"  # messages hold "; "
    return f"{mode}'s warm start was not served by the compile cache, so its row is a second cold start ({reason})"


def _uses_inductor(mode: str, overrides: dict | None) -> bool:
    """Whether ``mode``'s starts compile with Inductor (``use_inductor``; the overrides cannot change it)."""
    config = mode_kwargs(mode, overrides).get("compilation_config", {})
    return bool(config.get("use_inductor"))


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: prints the table, writes ``--output-json``.

    The JSON document: ``{"model", "settings": {batch_size, input_len, dtype, device,
    compilation_config_overrides (only with --compilation-config)}, "rows": [{"mode",
    "start" ('cold' | 'warm'), "import_s", "weights_s", "compile_s", "capture_s", "ready_s", "first_step_s",
    "compile_cache_hits", "kernel_warm_up_s", "kernel_warm_up_wait_s" (the kernel warm-up's step and the part
    of it the trace did not hide, inside compile_s), "kernel_compile_s" (the step's first pass: its kernels
    compiled and readied on a pool, inside kernel_warm_up_s), "inductor_cache_hits", "inductor_cache_misses",
    "capture_sizes", "compilation_config" (the config the start ran, resolved), "dtype" (the one used),
    "compile_cache_warnings" (the compile cache's warnings the start printed)}],
    "env": {"cpu", "cpu_count", "threads", "load_avg", "gpu", "gpu_clocks", "torch", "bytecode" (whether the
    modules of the compilers the modes use, Dynamo's and, with an Inductor mode, Inductor's, had bytecode before
    the first start: ``machine.bytecode_at_hand``), "commit", "date",
    "command"}, "stopped" (only when a mode failed, or Ctrl-C or SIGTERM came: what stopped the run)}``; times in
    seconds.
    A warm start at level 2-3 that the compile cache did not serve gets a note on stderr naming the cache's
    warnings (:func:`warm_miss_note`). The modes that finished before a failure, Ctrl-C or SIGTERM are printed
    and written; exit status 2 (a start refused its settings, as ``bench_latency`` exits for them), 1 (another failed
    start), 130 (Ctrl-C) or 143 (SIGTERM).
    """
    parser = build_parser()
    args = parse_with_vllm_spellings(parser, list(sys.argv[1:] if argv is None else argv))
    args.modes = [mode] if (mode := level_mode(parser, args)) else args.modes or list(MODE_KWARGS)
    check_overrides(
        parser,
        args.compilation_config,
        args.modes,
        max_num_seqs=args.batch_size,
        max_num_batched_tokens=args.batch_size * args.input_len,
    )
    if "cache_dir" in (args.compilation_config or {}):  # it would replace the folder each cold start empties
        parser.error(
            "--compilation-config: cache_dir is where bench_startup keeps each mode's caches, emptied before its cold "
            "start; give --cache-dir instead"
        )
    _check_before_any_start(parser, args)
    import torch

    from reference.benchmark import startup
    from reference.benchmark.machine import bytecode_at_hand, machine_info, source_commit
    from reference.benchmark.report import write_whole
    from reference.engine.arguments import resolve_device

    device = resolve_device(args.device)
    start = {"batch_size": args.batch_size, "input_len": args.input_len, "dtype": args.dtype, "device": str(device)}
    settings = dict(start)
    if args.compilation_config is not None:
        settings["compilation_config_overrides"] = args.compilation_config
    inductor = any(_uses_inductor(mode, args.compilation_config) for mode in args.modes)
    compilers = ["dynamo", "inductor"] if inductor else ["dynamo"]
    bytecode = bytecode_at_hand(compilers)
    if not bytecode:
        print(
            f"{PROG}: note: torch's {' and '.join(compilers)} modules had no bytecode before the first start, so a "
            "start compiles their sources as it imports them (every start where it cannot write the bytecode, as on "
            "a read-only install; PYTHONPYCACHEPREFIX=<a writable folder> gives it what an installed torch has)",
            file=sys.stderr,
        )
    rows, stopped, status = [], None, 0
    with _sigterm_raises(), tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        cache_dir = args.cache_dir or Path(scratch)
        for mode in args.modes:
            spec = {"model": args.model, "mode": mode, **start, "overrides": args.compilation_config}
            try:
                rows += startup.measure_mode(spec, cache_dir)
            except startup.StartupSettingsError as err:  # the modes before it are kept
                stopped, status = f"error: {engine_sizes_hint(str(err), '--input-len + 1')}", 2
                break
            except startup.StartupError as err:
                stopped, status = f"error: {err}", 1
                break
            except _Terminated:
                stopped, status = f"terminated during {mode}; {_finished(rows)}", 128 + signal.SIGTERM
                break
            except KeyboardInterrupt:
                stopped, status = f"interrupted during {mode}; {_finished(rows)}", 130
                break
            print(f"{mode}: cold ready {rows[-2]['ready_s']:.2f} s, warm {rows[-1]['ready_s']:.2f} s", file=sys.stderr)
            if note := warm_miss_note(mode, *rows[-2:]):
                print(f"{PROG}: note: {note}", file=sys.stderr)
    root = Path(__file__).resolve().parents[1]
    env = {
        **machine_info(device),
        "torch": torch.__version__,
        "bytecode": bytecode,
        "commit": source_commit(root),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([PROG, *(sys.argv[1:] if argv is None else argv)]),
    }
    if rows:
        print(table(rows))
    if args.output_json is not None and rows:
        doc = {"model": args.model, "settings": settings, "rows": rows, "env": env}
        if stopped:
            doc["stopped"] = stopped
        try:
            args.output_json.parent.mkdir(parents=True, exist_ok=True)
            write_whole(args.output_json, json.dumps(doc, indent=2))
            print(f"wrote {args.output_json}", file=sys.stderr)
        except OSError as err:  # checked writable up front, but a disk can fill during the run
            print(f"{PROG}: error: cannot write {args.output_json} ({err.strerror or err})", file=sys.stderr)
            status = status or 1
    if stopped:
        print(f"{PROG}: {stopped}", file=sys.stderr)
    if status:
        sys.exit(status)


def _finished(rows: list[dict]) -> str:
    """What a stopped run's last line says of the modes before it."""
    return "the finished modes are above" if rows else "no mode had finished"


if __name__ == "__main__":
    main()
