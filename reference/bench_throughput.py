"""Offline throughput per compilation mode and scheduling, like vLLM's ``vllm bench throughput``: the CLI.

``python -m reference.bench_throughput --model llama-tiny --modes eager,no_inductor --num-prompts 64
--input-len 8:64 --output-len 4:32 --output-json perf/results/throughput.json``

One workload of ``--num-prompts`` requests, handed to one ``generate`` call per (mode, scheduling):
``continuous`` (the engine's continuous batching with chunked prefill) and ``static`` (a batch of up to
``--max-num-seqs`` requests runs to its end before the next starts: the baseline). Each request is random
token ids (seeded) and greedy with ``ignore_eos``, so it generates exactly its drawn output length.
:mod:`reference.benchmark.throughput` runs it (what is timed, what a step is).

Lengths: ``--input-len`` and ``--output-len`` are each ``N`` (every request) or ``MIN:MAX`` (each request
draws an int uniformly from MIN..MAX inclusive). vLLM's random dataset takes a centre per length and one
``--random-range-ratio r`` for both, drawing each length between about ``L x (1 - r)`` and ``L x (1 + r)``;
so ``--input-len 8:64 --output-len 4:32`` is roughly vLLM's ``--input-len 36 --output-len 18
--random-range-ratio 0.78``, and ``N`` is vLLM's ratio 0. A range states the bounds that are drawn (a ratio
leaves them to rounding), lets prompts and outputs spread differently, and is what the limits are checked
against: ``--max-model-len`` defaults to MAX input + MAX output.

``--scheduling-policy`` is vLLM's ``scheduling_policy`` for the whole run, one value: ``fcfs`` (arrival order) or
``priority``, where each request's priority is its output length, negated, so the longest output starts first
(the bench knows the lengths, which it sets as ``max_tokens`` with ``ignore_eos``; a server would not). Both
schedulings of the run take the policy, so ``vs static`` compares them under it; comparing the two policies
takes two runs, which the report shows as two workloads.

``--max-num-seqs`` defaults to 16, not vLLM's 256: a quarter of the default ``--num-prompts``, so static
batching runs four batches and continuous batching has waiting requests to start in the rows that free up
(with every prompt in one batch the two schedulings run the same steps), and a CPU step stays small.

Only argparse and the light parts of the project load before the flags are checked: ``--help`` and usage
errors answer at once; torch, transformers and the models load after.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from reference.benchmark.choices import DTYPE_NAMES, MODE_KWARGS
from reference.benchmark.cli import (
    OneLineParser,
    check_output_file,
    device_name,
    environment_help,
    mode_names,
    model_name,
    names_of,
    output_file,
    positive_int,
    seed,
    usage_error,
)
from reference.benchmark.throughput_results import POLICY_WORDS
from reference.config import CUDAGRAPH_MODES, echo

PROG = "python -m reference.bench_throughput"
# reference.engine.scheduler's SCHEDULING and SCHEDULING_POLICIES, spelled here so that --help imports no torch
# (a test keeps them equal)
SCHEDULINGS = ("continuous", "static")
SCHEDULING_POLICIES = ("fcfs", "priority")


def length_range(text: str) -> tuple[int, int]:
    """argparse type: ``N`` or ``MIN:MAX`` token counts, ints >= 1 with MIN <= MAX, as ``(MIN, MAX)``."""
    parts = text.split(":")
    try:
        low, high = (int(p) for p in parts) if len(parts) == 2 else (int(text),) * 2
    except ValueError:
        low = high = None
    if low is None or low < 1 or high < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1 or MIN:MAX (ints >= 1, MIN <= MAX), got {echo(text)}")
    if low > high:
        raise argparse.ArgumentTypeError(f"MIN:MAX with MIN {low} above MAX {high} in {echo(text)}; give MIN <= MAX")
    return low, high


def scheduling_names(text: str) -> list[str]:
    """argparse type: comma-separated names of ``SCHEDULINGS``, at least one."""
    names = names_of(SCHEDULINGS, "scheduling")(text)
    if not names:
        raise argparse.ArgumentTypeError(f"no scheduling given in {echo(text)}; choose from {', '.join(SCHEDULINGS)}")
    return names


def graph_mode_names(text: str) -> list[str]:
    """argparse type: comma-separated ``cudagraph_mode`` values (lower case, or vLLM's capitals, as
    ``CompilationConfig.parse`` reads them), at least one, each once; returned in lower case."""
    allowed = f"choose from {', '.join(CUDAGRAPH_MODES)} (or vLLM's capitals; comma-separated)"
    given = [n.strip() for n in text.split(",")] if text.replace(",", "").strip() else []
    if not given:
        raise argparse.ArgumentTypeError(f"no mode given in {echo(text)}; {allowed}")
    unknown = [n for n in given if not (n in CUDAGRAPH_MODES or n.isupper() and n.lower() in CUDAGRAPH_MODES)]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {echo(unknown)} in {echo(text)}; {allowed}")
    names = [n.lower() for n in given]
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{echo(text)} names a cudagraph_mode twice")
    return names


def _spelled(span: tuple[int, int]) -> str:
    low, high = span
    return str(low) if low == high else f"{low}:{high}"


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog=PROG,
        description="Throughput of one generate call over a workload of random requests, per compilation mode "
        "and scheduling (continuous batching against static batches): requests/s and tokens/s.",
        epilog="Each request's prompt is random token ids in [3, vocab); it generates exactly its output length "
        "(greedy, ignore_eos). Per (mode, scheduling): the LLM is built (start-up, reported apart), one small "
        "untimed generate warms it up, then one generate of every request is timed. A range N:M draws each "
        "request's length uniformly from N..M with random.Random(--seed). " + environment_help(),
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
        default=["no_inductor"],
        help=f"comma-separated, run in this order, out of {','.join(MODE_KWARGS)} (default: no_inductor)",
    )
    parser.add_argument(
        "--scheduling",
        type=scheduling_names,
        default=list(SCHEDULINGS),
        help="comma-separated, run in this order for each mode: continuous (batching with chunked prefill), "
        f"static (the baseline: batches of --max-num-seqs run to their end) (default: {','.join(SCHEDULINGS)})",
    )
    parser.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default="fcfs",
        help="which waiting request starts first (vLLM's scheduling_policy): fcfs, in arrival order; priority, "
        "the longest output first (each request's priority is its output length, negated: the bench knows it, "
        "since it sets max_tokens with ignore_eos) (default: fcfs)",
    )
    parser.add_argument(
        "--cudagraph-mode",
        type=graph_mode_names,
        default=None,
        metavar="MODE[,MODE...]",
        help="comma-separated cudagraph_mode values, each run for every mode of --modes in place of the mode's own "
        f"(out of {','.join(CUDAGRAPH_MODES)}; vLLM's capitals too), e.g. full_and_piecewise,full; the row says "
        "what ran, after the engine lowered what the attention cannot serve (default: each mode's own)",
    )
    parser.add_argument("--num-prompts", type=positive_int, default=64, help="requests in the workload" + default)
    parser.add_argument(
        "--input-len", type=length_range, default=(8, 64), metavar="N|MIN:MAX", help="prompt tokens (default: 8:64)"
    )
    parser.add_argument(
        "--output-len", type=length_range, default=(4, 32), metavar="N|MIN:MAX", help="generated tokens (default: 4:32)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=positive_int,
        default=16,
        help="requests running at once (KV-cache rows; vLLM's default is 256, see the module doc)" + default,
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=positive_int,
        default=None,
        help="tokens per step at most (default: the LLM's, --max-num-seqs x --max-model-len)",
    )
    parser.add_argument(
        "--max-model-len",
        type=positive_int,
        default=None,
        help="tokens per sequence (default: MAX of --input-len + MAX of --output-len)",
    )
    parser.add_argument(
        "--enable-chunked-prefill",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="cut prompts into chunks that fill each step's budget (vLLM's default); --no-enable-chunked-prefill "
        "runs a prompt only in a step it fits whole (default: on)",
    )
    parser.add_argument("--dtype", choices=["auto", *DTYPE_NAMES], default="auto", help="as LLM(dtype=...)" + default)
    parser.add_argument("--device", type=device_name, default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of the lengths, the prompts and the random weights" + default
    )
    parser.add_argument(
        "--output-json", type=output_file, default=None, help="write the rows as JSON here"
    )
    return parser


def _check_workload_fits_the_host(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 where the workload's requests could not fit the machine's physical memory (drawn, they would take
    minutes and then exhaust it); where the OS does not say how much it has, no check."""
    from reference.benchmark.throughput import workload_host_bytes

    if not (hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names):
        return
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    need = workload_host_bytes(args.num_prompts, args.input_len, args.output_len)
    if need > physical:
        parser.error(
            f"--num-prompts {args.num_prompts} with --input-len {_spelled(args.input_len)} + --output-len "
            f"{_spelled(args.output_len)}: the workload needs about {need / 2**30:,.1f} GiB of host memory at its "
            f"longest, more than the {physical / 2**30:,.1f} GiB this machine has; lower --num-prompts or the lengths"
        )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the flags, before any model is built; errors exit with code 2 and name the flag."""
    parser = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(given)
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens < args.max_num_seqs:
        parser.error(
            f"--max-num-batched-tokens {args.max_num_batched_tokens} is below --max-num-seqs {args.max_num_seqs}: "
            "a step decodes one token of every running request"
        )
    if args.cudagraph_mode is not None and "eager" in args.modes:  # every other mode takes any cudagraph_mode
        parser.error("--cudagraph-mode replaces each mode's graph kind, and eager runs enforce_eager, which takes "
                     "none; drop eager from --modes or drop --cudagraph-mode")  # fmt: skip
    if args.output_json is not None:
        check_output_file(parser, "--output-json", args.output_json)
    from reference.models import registry  # transformers: after the cheap checks

    positions = registry.model_config(args.model).max_position_embeddings
    longest = args.input_len[1] + args.output_len[1]
    if longest > positions:
        parser.error(
            f"--input-len {_spelled(args.input_len)} + --output-len {_spelled(args.output_len)}: the longest request "
            f"needs {longest} positions; {args.model} has {positions} (max_position_embeddings)"
        )
    _check_workload_fits_the_host(parser, args)
    if args.max_model_len is None:
        args.max_model_len = longest
    elif args.max_model_len < longest:
        parser.error(
            f"--max-model-len {args.max_model_len} is below the longest request: --input-len "
            f"{_spelled(args.input_len)} + --output-len {_spelled(args.output_len)} = {longest} tokens"
        )
    elif args.max_model_len > positions:
        parser.error(
            f"--max-model-len {args.max_model_len} exceeds {args.model}'s {positions} positions "
            "(max_position_embeddings)"
        )
    cache_tokens = args.max_num_seqs * args.max_model_len
    if args.max_num_batched_tokens is not None and args.max_num_batched_tokens > cache_tokens:
        parser.error(
            f"--max-num-batched-tokens {args.max_num_batched_tokens} exceeds --max-num-seqs x --max-model-len "
            f"({args.max_num_seqs} x {args.max_model_len} = {cache_tokens}): no step holds more than the KV cache"
        )
    budget = cache_tokens if args.max_num_batched_tokens is None else args.max_num_batched_tokens
    if not args.enable_chunked_prefill and args.input_len[1] > budget:
        parser.error(
            f"--input-len {_spelled(args.input_len)} with --no-enable-chunked-prefill: a prompt of {args.input_len[1]} "
            f"tokens never fits a step of --max-num-batched-tokens {budget}; raise it or allow chunked prefill"
        )
    args.argv, args.prog = given, PROG
    return args


def table(rows: list[dict]) -> str:
    """The rows as a markdown table: throughput, steps, the decode steps' multiple of their floor, the speed-up
    over static batching, token agreement."""
    first = rows[0]["mode"]
    head = ["mode", "cudagraph_mode", "scheduling", "start-up s", "elapsed s", "req/s", "output tok/s", "total tok/s"]
    head += ["steps"]
    head += ["tokens/step", "decode / mixed / prefill step ms (count)", "decode x floor", "vs static"]
    head += [f"same tokens as {first} (same scheduling)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        speedup = r["speedup_vs_static"]
        asked, ran = r["requested_cudagraph_mode"], r["cudagraph_mode"]
        graphs = ran if asked in (None, ran) else f"{ran} (asked: {asked})"
        cells = [r["mode"], graphs, r["scheduling"], f"{r['startup_s']:.2f}", f"{r['elapsed_s']:.3f}"]
        cells += [f"{r['requests_per_s']:.1f}", f"{r['output_tokens_per_s']:.1f}", f"{r['total_tokens_per_s']:.1f}"]
        cells += [str(r["num_steps"]), f"{r['tokens_run'] / r['num_steps']:.1f}", _step_times(r["step_ms"])]
        cells += [_x_floor(r["decode_floor"])]
        cells += ["-" if speedup is None else f"{speedup:.2f}x", f"{r['same_tokens_as_first_mode']:.0%}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _step_times(step_ms: dict[str, dict[str, float]]) -> str:
    kinds = ("decode", "mixed", "prefill")
    return " / ".join(
        f"{step_ms[k]['mean_ms']:.2f} ({step_ms[k]['count']})" if k in step_ms else "-" for k in kinds
    )


def _x_floor(floor: dict | None) -> str:
    if floor is None or floor["x_floor"] is None:  # no decode step, or no bandwidth (a CPU)
        return "-"
    return f"{floor['x_floor']:.2f} (floor {floor['floor_ms']:.3g} ms)"


def header(doc: dict) -> str:
    """The line over the table: model, device, dtype, the workload and the engine's limits."""
    w, e, env = doc["workload"], doc["engine"], doc["env"]
    device = env["gpu"] or f"cpu ({env['cpu']})"
    line = (
        f"{doc['model']} on {device}, {e['dtype']}: {w['num_prompts']} request{'s' * (w['num_prompts'] != 1)}, input "
        f"{_spelled(w['input_len'])} ({w['prompt_tokens']} tokens), output {_spelled(w['output_len'])} "
        f"({w['output_tokens']} tokens), seed {w['seed']}; max_num_seqs {e['max_num_seqs']}, max_num_batched_tokens "
        f"{e['max_num_batched_tokens']}, max_model_len {e['max_model_len']}, {POLICY_WORDS[e['scheduling_policy']]}"
    )
    if not env["gpu"] and any(m != "eager" for m in {r["mode"] for r in doc["rows"]}):
        line += "\nnote: CUDA graphs need CUDA; on this CPU the modes with graphs ran without them"
    if doc["bandwidth_Bps"] is None:
        line += "\nnote: no floor on a CPU (the floor divides a decode step's bytes by a GPU's bandwidth)"
    else:
        windows = "".join(
            f", of which {nbytes:,} B in layers that read at most the last {window} tokens"
            for window, nbytes in doc["kv_sliding_windows"]
        )
        line += (
            f"\nfloor of a decode step: (weights {doc['weight_bytes_per_decode_step'] / 1e9:.3g} GB + the KV cache "
            f"read and written, {doc['kv_bytes_per_token']:,} B a token{windows}) / {doc['bandwidth_Bps']:.3e} B/s"
        )
    return line


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point: prints the table, writes ``--output-json``.

    The JSON document: ``{"benchmark": "throughput", "model", "workload": {"seed", "num_prompts",
    "input_len" and "output_len" ([MIN, MAX]), "token_range" ([first, end) of the prompts' ids), "input_lens",
    "output_lens" (drawn, per request), "prompt_tokens", "output_tokens" (their sums)}, "engine":
    {"max_num_seqs", "max_num_batched_tokens" (the one used), "max_model_len", "enable_chunked_prefill",
    "dtype" (the one used), "device"}, "rows": [{"mode", "requested_cudagraph_mode" (``--cudagraph-mode``'s
    value for the row, null for the mode's own), "cudagraph_mode" (what the engine ran, after lowering what
    the attention cannot serve; "none" for eager), "scheduling", "startup_s" (building the LLM),
    "elapsed_s", "requests_per_s", "output_tokens_per_s", "total_tokens_per_s" (prompt + output),
    "output_tokens" (generated), "num_steps" (model steps run), "tokens_run" (tokens those steps fed the
    model), "step_ms" ({kind: {"count", "mean_ms"}} for the kinds ``decode``, ``mixed``, ``prefill`` that
    ran: :class:`reference.benchmark.throughput._StepClock`), "speedup_vs_static" (static's elapsed /
    continuous's, same mode and requested cudagraph_mode; null on static rows or without a static row),
    "same_tokens_as_first_mode" (the fraction of requests whose tokens equal those of the first mode's row
    of the same scheduling: :mod:`reference.benchmark.throughput` says why not across schedulings),
    "decode_floor" (null when no decode step ran, else {"seqs_per_step", "bytes_per_step", "kv_bytes_per_step"
    (means over the decode steps), "floor_ms", "x_floor" (null on a CPU)}: :mod:`reference.benchmark.throughput`)}],
    "weight_bytes_per_decode_step", "kv_bytes_per_token" (every layer's), "kv_sliding_windows" ([window,
    bytes per token] of the layers with each sliding window), "bandwidth_Bps", "bandwidth_method" and
    "bandwidth_measured_Bps" (the floor's figures, the last three null on a CPU:
    :mod:`reference.benchmark.floor`),
    "env": {"cpu", "cpu_count", "threads", "load_avg", "gpu", "gpu_clocks", "torch", "commit", "date",
    "command"}, "interrupted" (only when Ctrl-C stopped the run)}``.
    Ctrl-C keeps the finished rows (printed and written; exit status 130).
    """
    args = parse_args(argv)
    from reference.benchmark.report import write_whole
    from reference.benchmark.throughput import Interrupted, run
    from reference.config import ConfigError

    try:
        doc = run(args)
    except ConfigError as err:  # the memory check: the flags' doing (--max-num-seqs, --max-model-len)
        print(usage_error(PROG, str(err)), file=sys.stderr)
        sys.exit(2)
    except Interrupted as err:  # Ctrl-C before any row finished
        print(f"{PROG}: {err}", file=sys.stderr)
        sys.exit(130)
    print(header(doc))
    print(table(doc["rows"]))
    if args.output_json is not None:
        import json

        try:
            Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
            write_whole(args.output_json, json.dumps(doc, indent=2))
            print(f"wrote {args.output_json}", file=sys.stderr)
        except OSError as err:  # checked writable up front, but a disk can fill during the run
            print(f"{PROG}: error: cannot write {args.output_json} ({err.strerror or err})", file=sys.stderr)
            sys.exit(1)
    if "interrupted" in doc:
        print(f"{PROG}: {doc['interrupted']}", file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
