"""End-to-end generation latency per compilation mode, like vLLM's ``benchmark_latency``.

``python -m reference.bench_latency --model llama-3.1-8b --modes eager,no_inductor,inductor
--baselines hf-eager,hf-compile --results-dir``

One process, one set of weights: the first mode's :class:`~reference.engine.llm.LLM` builds the model
and every later mode (and the transformers baselines) uses the same weight tensors. Each mode is its own
``LLM`` with its own compilation, KV cache and CUDA graphs. One iteration is one whole ``generate`` call:
``batch_size`` dummy prompts of ``input_len`` random token ids (seeded, the same for every mode), greedy,
``ignore_eos``, exactly ``output_len`` new tokens each.

Each LLM gets ``max_num_seqs = batch_size`` and ``max_model_len = input_len + output_len``, so, unless
``--compilation-config`` says otherwise, its capture sizes go up to ``batch_size`` (every decode step
runs at exactly ``batch_size`` tokens; the prefill step runs compiled, without a graph).

The floor next to every latency: a run reads every weight once per generated token (one prefill step
and ``output_len - 1`` decode steps), so it cannot take less than
``output_len * weight_bytes_per_decode_step / bandwidth``, with the bandwidth measured once at start as
a device-to-device copy of 1 GiB, counting bytes read plus bytes written (measured this way on the
project's H200 on 2026-11-30: 4.23e12 B/s). On CPU there is no floor.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

from reference.baselines import BASELINES, build_hf_model, make_baseline
from reference.config import MODES as MODE_FIELDS
from reference.config import CompilationConfig, ConfigError, echo, mode_config
from reference.engine.llm import DTYPES, LLM, compilation_fields
from reference.engine.sampling import SamplingParams
from reference.models import registry
from reference.ops.custom_op import kernel_backend

# mode -> LLM keyword arguments (from reference.config.MODES). vLLM users know them as --enforce-eager
# and two -O configs.
MODES: dict[str, dict[str, Any]] = {
    mode: {"enforce_eager": True} if mode == "eager" else {"compilation_config": dict(fields)}
    for mode, fields in MODE_FIELDS.items()
}
# The config fields that tell the modes apart: --compilation-config may not change them, or a row
# labelled with one mode would run another.
MODE_DEFINING_FIELDS = ("level", "use_inductor", "cudagraph_mode")
DEFAULT_RESULTS_DIR = "perf/results"
EAGER_NOTE = (
    "- eager runs level 0: the use_inductor, splitting_ops and capture sizes in its JSON compilation_config "
    "are resolved defaults with no effect there (nothing is compiled or captured)"
)
COPY_BYTES = 2**30  # bandwidth probe: large enough that launch overhead is negligible


# ---------------------------------------------------------------------- command line
def _int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < minimum:
            raise argparse.ArgumentTypeError(f"expected an int >= {minimum}, got {echo(text)}")
        return value

    return parse


_positive_int, _non_negative_int = _int_at_least(1), _int_at_least(0)


def _names(allowed: tuple[str, ...], kind: str) -> Callable[[str], list[str]]:
    """Parser of a comma-separated list of ``kind`` names out of ``allowed``; '' gives []."""

    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {echo(unknown)}; choose from {', '.join(allowed)} (comma-separated)"
            )
        if len(set(names)) != len(names):
            raise argparse.ArgumentTypeError(f"{echo(text)} names a {kind} twice")
        return names

    return parse


def _mode_names(text: str) -> list[str]:
    names = _names(tuple(MODES), "mode")(text)
    if not names:  # an empty list would otherwise fall back to the default, all modes
        raise argparse.ArgumentTypeError(f"no mode given in {echo(text)}; choose from {', '.join(MODES)}")
    return names


def _config_fields(text: str) -> dict[str, Any]:
    try:
        fields = compilation_fields(text)
        CompilationConfig.parse(fields)  # validates keys and values, names the bad one
    except ConfigError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return fields


def _model(text: str) -> str:
    try:
        registry.model_config(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return text


def _device(text: str) -> str:
    try:
        device = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"expected e.g. 'cpu' or 'cuda', got {echo(text)}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{echo(text)} requested but CUDA is not available")
    if device.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"expected a cpu or cuda device, got {echo(text)}")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m reference.bench_latency",
        description="Latency of whole generate calls per compilation mode, over one set of weights, with the "
        "memory-bandwidth floor and optional transformers baselines.",
        epilog="Modes: eager = enforce_eager (level 0, custom ops on); no_inductor = level 3, use_inductor "
        "False, custom_ops ['all'], piecewise CUDA graphs; inductor = level 3, use_inductor True. Capture "
        "sizes go up to --batch-size unless --compilation-config sets them.",
    )
    default = " (default: %(default)s)"
    parser.add_argument("--model", type=_model, default="llama-tiny", help="preset name or checkpoint dir" + default)
    parser.add_argument("--batch-size", type=_positive_int, default=8, help="prompts per generate call" + default)
    parser.add_argument("--input-len", type=_positive_int, default=32, help="prompt tokens" + default)
    parser.add_argument("--output-len", type=_positive_int, default=128, help="generated tokens" + default)
    parser.add_argument(
        "--num-iters-warmup", type=_non_negative_int, default=10, help="untimed calls per mode" + default
    )
    parser.add_argument("--num-iters", type=_positive_int, default=30, help="timed calls per mode" + default)
    parser.add_argument(
        "--modes",
        type=_mode_names,
        default=None,
        help=f"comma-separated, run in this order (default: {','.join(MODES)}; 'eager' with --enforce-eager)",
    )
    parser.add_argument(
        "--compilation-config",
        type=_config_fields,
        default=None,
        help="JSON or Python-literal dict overriding fields of the compiled modes' configs, "
        "e.g. capture sizes or custom_ops; level and use_inductor are set by --modes",
    )
    parser.add_argument("--enforce-eager", action="store_true", help="shorthand for --modes eager (vLLM's flag)")
    parser.add_argument("--dtype", choices=["auto", *DTYPES], default="auto", help="as LLM(dtype=...)" + default)
    parser.add_argument("--device", type=_device, default=None, help="cpu or cuda (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of random weights and of the prompts" + default)
    parser.add_argument(
        "--baselines",
        type=_names(BASELINES, "baseline"),
        default=[],
        help=f"comma-separated transformers generate baselines to run too: {', '.join(BASELINES)} (default and '': "
        "none)",
    )
    parser.add_argument(
        "--num-iters-baseline", type=_positive_int, default=None, help="timed calls per baseline (default: --num-iters)"
    )
    parser.add_argument(
        "--num-iters-warmup-baseline",
        type=_non_negative_int,
        default=2,
        help="untimed calls per baseline; the first compiles hf-compile, the second records its CUDA graphs "
        "(default: %(default)s)",
    )
    parser.add_argument("--output-json", type=Path, default=None, help="write the results JSON here")
    parser.add_argument(
        "--results-dir",
        type=Path,
        nargs="?",
        const=Path(DEFAULT_RESULTS_DIR),
        default=None,
        help=f"write <model>-<date>.json and .md here (default when given without a value: {DEFAULT_RESULTS_DIR})",
    )
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and cross-check the flags; errors exit with code 2 and name the flag."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.enforce_eager:
        if args.modes not in (None, ["eager"]):
            parser.error(f"--enforce-eager contradicts --modes {','.join(args.modes)}; drop one of them")
        args.modes = ["eager"]
    args.modes = args.modes or list(MODES)
    compiled = [m for m in args.modes if "compilation_config" in MODES[m]]
    if args.compilation_config is not None:
        if not compiled:
            flag = "--enforce-eager runs only eager" if args.enforce_eager else "--modes has none"
            parser.error(f"--compilation-config applies only to compiled modes, and {flag}; drop one of them")
        changed = [f for f in MODE_DEFINING_FIELDS if any(_changes(args.compilation_config, m, f) for m in compiled)]
        if changed:
            parser.error(
                f"--compilation-config: sets {', '.join(changed)}, which --modes decides: choose modes instead "
                f"({'; '.join(map(_defining_fields, MODES))}); other fields (capture sizes, custom_ops, "
                "splitting_ops, ...) may be set"
            )
        for mode in compiled:
            try:
                CompilationConfig.parse(mode_kwargs(mode, args.compilation_config)["compilation_config"])
            except ConfigError as err:
                parser.error(f"--compilation-config: with mode {mode!r}: {err}")
    max_positions = registry.model_config(args.model).get_text_config().max_position_embeddings
    if args.input_len + args.output_len > max_positions:
        parser.error(
            f"--input-len + --output-len = {args.input_len + args.output_len} exceeds the model's "
            f"max_position_embeddings ({max_positions})"
        )
    if args.num_iters_baseline is None:
        args.num_iters_baseline = args.num_iters
    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def _defining_fields(mode: str) -> str:
    """``mode`` and its values of ``MODE_DEFINING_FIELDS``, e.g. 'inductor: level 3, use_inductor=True'."""
    if "enforce_eager" in MODES[mode]:
        return f"{mode}: level 0"
    fields = MODES[mode]["compilation_config"]
    return f"{mode}: level {fields['level']}, use_inductor={fields['use_inductor']}"


def _changes(overrides: dict[str, Any], mode: str, field: str) -> bool:
    """Whether ``overrides`` gives ``field`` a value other than compiled ``mode``'s (resolved) one."""
    return field in overrides and overrides[field] != getattr(mode_config(mode), field)


def mode_kwargs(mode: str, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """LLM keyword arguments of ``mode``, with ``overrides`` applied to a compiled mode's config."""
    kwargs = dict(MODES[mode])
    if overrides and "compilation_config" in kwargs:
        kwargs["compilation_config"] = {**kwargs["compilation_config"], **overrides}
    return kwargs


# ---------------------------------------------------------------------- measuring
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_bandwidth(device: torch.device, nbytes: int = COPY_BYTES, iters: int = 20) -> float | None:
    """Device memory bandwidth in bytes/s: ``iters`` copies of ``nbytes`` between two device buffers,
    timed with CUDA events, counting read + written bytes (2 x ``nbytes`` per copy). None on CPU."""
    if device.type != "cuda":
        return None
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        dst.copy_(src)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes * iters / seconds


def time_calls(fn: Callable[[], Any], device: torch.device, calls: int) -> tuple[list[float], Any]:
    """Run ``fn`` ``calls`` times, each timed between device synchronisations; returns (seconds per call,
    the last call's result). Warm-up calls are timed too: callers drop the first times."""
    times, result = [], None
    for _ in range(calls):
        _sync(device)
        start = time.perf_counter()
        result = fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return times, result


def latency_stats(times: list[float]) -> dict[str, float]:
    """avg, p50 and p90 (linear interpolation between order statistics) of ``times``, seconds."""
    if len(times) == 1:
        return {"avg": times[0], "p50": times[0], "p90": times[0]}
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    return {"avg": statistics.fmean(times), "p50": statistics.median(times), "p90": deciles[8]}


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------- the run
def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every mode and baseline of ``args``; returns the results document (see :func:`main`)."""
    device = torch.device(args.device)
    bandwidth = measure_bandwidth(device)
    vocab = registry.model_config(args.model).get_text_config().vocab_size
    generator = torch.Generator().manual_seed(args.seed)
    prompt_ids = torch.randint(0, vocab, (args.batch_size, args.input_len), generator=generator)  # [B, S]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    results: list[dict[str, Any]] = []
    reference_tokens = None  # the first mode's output, for the agreement column
    owner: LLM | None = None  # the LLM holding the weights
    weight_bytes = None
    for mode in args.modes:
        llm = LLM(
            args.model,
            dtype=args.dtype,
            device=device,
            seed=args.seed,
            max_num_seqs=args.batch_size,
            max_model_len=args.input_len + args.output_len,
            share_weights_with=owner,
            **mode_kwargs(mode, args.compilation_config),
        )
        if owner is None:
            owner, weight_bytes = llm, registry.weight_bytes_per_decode_step(llm.model)
        prompts = prompt_ids.tolist()
        times, outputs = time_calls(
            lambda: llm.generate(prompts, params, use_tqdm=False), device, args.num_iters_warmup + args.num_iters
        )
        times = times[args.num_iters_warmup :]
        tokens = [o.outputs[0].token_ids for o in outputs]
        reference_tokens = reference_tokens or tokens
        results.append(
            {
                "mode": mode,
                "kind": "engine",
                "latency_s": latency_stats(times),
                "iters": len(times),
                "startup": {
                    "load_s": llm.load_s,
                    "compile_s": llm.startup.compile_s,
                    "capture_s": llm.startup.capture_s,
                    "graph_gib": llm.startup.graph_gib,
                    "capture_sizes": list(llm.startup.capture_sizes),
                },
                "compilation_config": llm.config.describe(),
                "custom_ops": llm.custom_ops,
                "same_tokens_as_first": _agreement(tokens, reference_tokens),
            }
        )
        print(f"{mode}: p50 {results[-1]['latency_s']['p50']:.4f} s", file=sys.stderr)
        if llm is not owner:
            del llm
            _release(device)

    hf = build_hf_model(args.model, owner.model) if args.baselines else None  # one copy for all baselines
    for name in args.baselines:
        baseline = make_baseline(name, hf, args.output_len)
        input_ids = prompt_ids.to(device)
        warmup = args.num_iters_warmup_baseline
        times, out = time_calls(lambda: baseline(input_ids), device, warmup + args.num_iters_baseline)
        first_call_s, times = times[0], times[warmup:]  # the first call compiles hf-compile
        results.append(
            {
                "mode": name,
                "kind": "baseline",
                "latency_s": latency_stats(times),
                "iters": len(times),
                "startup": {"first_call_s": first_call_s},
                "same_tokens_as_first": _agreement(out.tolist(), reference_tokens),
            }
        )
        print(f"{name}: p50 {results[-1]['latency_s']['p50']:.4f} s", file=sys.stderr)
    del hf
    _release(device)

    floor = args.output_len * weight_bytes / bandwidth if bandwidth else None
    baseline_p50 = {r["mode"]: r["latency_s"]["p50"] for r in results if r["kind"] == "baseline"}
    for r in results:
        p50 = r["latency_s"]["p50"]
        r["tokens_per_s"] = args.batch_size * args.output_len / p50
        r["floor_s"] = floor
        r["x_floor"] = p50 / floor if floor else None
        if r["kind"] == "engine":
            r["speedup_vs"] = {name: b / p50 for name, b in baseline_p50.items()}
    return {
        "model": args.model,
        "settings": {
            "batch_size": args.batch_size,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "num_iters_warmup": args.num_iters_warmup,
            "num_iters": args.num_iters,
            "num_iters_baseline": args.num_iters_baseline,
            "num_iters_warmup_baseline": args.num_iters_warmup_baseline,
            "dtype": str(owner.dtype).removeprefix("torch."),
            "device": str(device),
            "compilation_config_overrides": args.compilation_config,
        },
        "weight_bytes_per_decode_step": weight_bytes,
        "bandwidth_Bps": bandwidth,
        "bandwidth_method": f"device-to-device copy of {COPY_BYTES} bytes, read + written bytes / time"
        if bandwidth
        else None,
        "results": results,
        "env": {
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
            "cpu": platform.processor() or platform.machine(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "custom_op_kernels": kernel_backend(device),
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "command": "python -m reference.bench_latency " + shlex.join(args.argv),
        },
    }


def _agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    """Fraction of sequences whose generated tokens equal the reference's."""
    return sum(a == b for a, b in zip(tokens, reference)) / len(reference)


# ---------------------------------------------------------------------- reporting
def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per mode and baseline: latencies (s), floor ratio, start-up costs, speedups."""
    baselines = [r["mode"] for r in doc["results"] if r["kind"] == "baseline"]
    first = doc["results"][0]["mode"]
    head = ["mode", "avg s", "p50 s", "p90 s", "tok/s", "floor s", "p50/floor", "compile s", "capture s", "graph GiB"]
    head += [f"vs {b}" for b in baselines] + [f"same tokens as {first}"]
    rows = []
    for r in doc["results"]:
        lat, st = r["latency_s"], r["startup"]
        row = [r["mode"], _fmt(lat["avg"]), _fmt(lat["p50"]), _fmt(lat["p90"]), _fmt(r["tokens_per_s"], ".1f")]
        row += [_fmt(r["floor_s"]), _fmt(r["x_floor"], ".2f")]
        if r["kind"] == "engine":
            row += [_fmt(st["compile_s"], ".2f"), _fmt(st["capture_s"], ".2f"), _fmt(st["graph_gib"], ".3f")]
            row += [f"{r['speedup_vs'][b]:.2f}x" for b in baselines]
        else:
            row += [f"{st['first_call_s']:.2f} (first call)", "-", "-"] + ["-"] * len(baselines)
        row.append(f"{r['same_tokens_as_first']:.0%}")
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def markdown_report(doc: dict[str, Any]) -> str:
    env, s = doc["env"], doc["settings"]
    bw = doc["bandwidth_Bps"]
    lines = [
        f"# {doc['model']}: generate latency, batch {s['batch_size']}, {s['input_len']} in, {s['output_len']} out",
        "",
        f"- date: {env['date']}; GPU: {env['gpu'] or 'none'}; torch {env['torch']}; transformers {env['transformers']}; "
        f"custom-op kernels: {env.get('custom_op_kernels', 'not recorded')}",
        f"- dtype {s['dtype']}; {s['num_iters']} timed calls per mode after {s['num_iters_warmup']} warm-up calls",
        f"- weights read per decode step: {doc['weight_bytes_per_decode_step']:,} bytes; bandwidth: "
        + (f"{bw:.3e} B/s ({doc['bandwidth_method']})" if bw else "not measured (no GPU), no floor"),
        "- floor = output_len x weight bytes / bandwidth; 'vs X' = X's p50 / this mode's p50",
        f"- command: `{env['command']}`",
        *([EAGER_NOTE] if any(r["mode"] == "eager" for r in doc["results"]) else []),
        "",
        markdown_table(doc),
        "",
    ]
    return "\n".join(lines)


def write_results(doc: dict[str, Any], output_json: Path | None, results_dir: Path | None) -> list[Path]:
    """Write the JSON to ``output_json`` and JSON + markdown to ``results_dir``; returns the paths."""
    written = []
    text = json.dumps(doc, indent=2)
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        output_json.write_text(text)
        written.append(output_json)
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        stem = f"{Path(doc['model']).name}-{stamp}"
        (results_dir / f"{stem}.json").write_text(text)
        (results_dir / f"{stem}.md").write_text(markdown_report(doc))
        written += [results_dir / f"{stem}.json", results_dir / f"{stem}.md"]
    return written


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point; prints the table and writes the requested files.

    The JSON document: ``{"model", "settings", "weight_bytes_per_decode_step", "bandwidth_Bps",
    "bandwidth_method", "results": [{"mode", "kind" ('engine' | 'baseline'), "latency_s": {"avg", "p50",
    "p90"}, "iters", "startup": {...}, "tokens_per_s", "floor_s", "x_floor", "speedup_vs" (engine),
    "same_tokens_as_first", ...}], "env": {"gpu", "cpu", "torch", "transformers", "custom_op_kernels" ('triton' | 'torch'), "date",
    "command"}}``.
    Times are seconds; ``x_floor`` and ``speedup_vs`` use p50.
    """
    args = parse_args(argv)
    doc = run(args)
    print(markdown_table(doc))
    for path in write_results(doc, args.output_json, args.results_dir):
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
