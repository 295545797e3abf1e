"""The results of a latency run as a markdown table and report, and as files (JSON + markdown)."""

from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any

EAGER_NOTE = (
    "- eager runs level 0: the use_inductor, splitting_ops and capture sizes in its JSON compilation_config "
    "are resolved defaults with no effect there (nothing is compiled or captured)"
)


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(doc: dict[str, Any]) -> str:
    """One row per mode and baseline: latencies (s), floor ratio, start-up costs (a compile that the project's
    compile cache served reads "(cached)"), speedups."""
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
            compiles = r["compilation_config"]["level"] > 0  # eager compiles nothing: its first call is no compile
            captures = bool(st["capture_sizes"])
            cached = " (cached)" if st.get("compile_cache_hits") else ""  # files before 2026-12-03 lack the field
            row += [
                _fmt(st["compile_s"] if compiles else None, ".2f") + (cached if compiles else ""),
                _fmt(st["capture_s"] if captures else None, ".2f"),
            ]
            row += [_fmt(st["graph_gib"] if captures else None, ".3f")]
            row += [f"{r['speedup_vs'][b]:.2f}x" for b in baselines]
        else:
            row += [f"{st['first_call_s']:.2f} (first call)", "-", "-"] + ["-"] * len(baselines)
        row.append(f"{r['same_tokens_as_first']:.0%}")
        rows.append(row)
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def markdown_header(doc: dict[str, Any]) -> str:
    """The lines over the printed table: what ran (model, device, dtype, sizes), the ``-O`` overrides of the
    compiled modes' config if any, and on a CPU the notes that the compiled modes ran without CUDA graphs and
    that there is no floor."""
    env, s = doc["env"], doc["settings"]
    device = env["gpu"] or f"cpu ({env['cpu']})"
    lines = [
        f"{doc['model']} on {device}, {s['dtype']}: batch {s['batch_size']}, {s['input_len']} prompt + "
        f"{s['output_len']} generated tokens; {s['num_iters']} timed call(s) after {s['num_iters_warmup']} warm-up"
        + (f"; tensor parallel x{tp}" if (tp := s.get("tensor_parallel_size", 1)) > 1 else "")
    ]
    if overrides := s.get("compilation_config_overrides"):
        lines.append(f"compiled modes' config overrides (-O): {json.dumps(overrides)}")
    if not env["gpu"] and any(r.get("compilation_config", {}).get("level") == 3 for r in doc["results"]):
        lines.append("note: CUDA graphs need CUDA; on this CPU the modes with graphs ran without them")
    if not doc["bandwidth_Bps"]:
        lines.append("note: no floor on a CPU (the floor divides weight bytes by a GPU's measured bandwidth)")
    return "\n".join(lines)


def markdown_report(doc: dict[str, Any]) -> str:
    env, s = doc["env"], doc["settings"]
    bw = doc["bandwidth_Bps"]
    lines = [
        f"# {doc['model']}: generate latency, batch {s['batch_size']}, {s['input_len']} in, {s['output_len']} out",
        "",
        f"- date: {env['date']}; GPU: {env['gpu'] or 'none'}; torch {env['torch']}; transformers {env['transformers']}; "
        f"custom-op kernels: {env.get('custom_op_kernels', 'not recorded')}",
        f"- dtype {s['dtype']}; {s['num_iters']} timed calls per mode after {s['num_iters_warmup']} warm-up calls",
        f"- machine: {env.get('cpu')}, {env.get('threads', '?')} torch threads of {env.get('cpu_count', '?')} cores; "
        f"load average at start {env.get('load_avg_at_start', '?')}; GPU clocks {env.get('gpu_clocks') or 'not read'}",
        *(
            [f"- tensor parallel over {tp} processes: weights and floor are one rank's (the ranks read at once)"]
            if (tp := s.get("tensor_parallel_size", 1)) > 1
            else []
        ),
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


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file in the same folder, renamed over ``path`` once
    complete, so a write that fails (a full disk) leaves no truncated file behind.

    Raises:
        OSError: the write or the rename failed (the temporary file is removed).
    """
    partial = path.with_name(f".{path.name}.partial")
    try:
        partial.write_text(text)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_results(doc: dict[str, Any], output_json: Path | None, results_dir: Path | None) -> list[Path]:
    """Write the JSON to ``output_json`` and JSON + markdown to ``results_dir``, each file whole or not at
    all (:func:`write_whole`); returns the paths.

    Raises:
        OSError: a folder could not be made or a file written (a full disk, no permission).
    """
    written = []
    text = json.dumps(doc, indent=2)
    if output_json is not None:
        output_json.parent.mkdir(parents=True, exist_ok=True)
        write_whole(output_json, text)
        written.append(output_json)
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        stem = f"{Path(doc['model']).name}-{stamp}"
        write_whole(results_dir / f"{stem}.json", text)
        write_whole(results_dir / f"{stem}.md", markdown_report(doc))
        written += [results_dir / f"{stem}.json", results_dir / f"{stem}.md"]
    return written
