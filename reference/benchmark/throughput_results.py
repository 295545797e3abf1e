"""Saved ``bench_throughput`` documents (``python -m reference.bench_throughput --output-json``) for the report:
each (mode, graph kind, scheduling) row's throughput over its workload, side by side.

A :class:`ThroughputRow` is one row of one run. Rows are compared only within a workload: the same model,
GPU, requests (seed, count, length ranges) and engine limits (``max_num_seqs``, ``max_num_batched_tokens``),
which :attr:`ThroughputRow.workload` spells. Where several files give the same key, the newest run (by its
recorded date) is kept. Files written before a field existed (the graph kind asked for, the step times, the
decode floor) read that field as not measured.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from reference.benchmark.results import ResultsError


@dataclass(frozen=True)
class ThroughputRow:
    """One row of a throughput run.

    Attributes:
        model, mode, scheduling: as the tool ran them. cudagraph_mode: what ran (None in files from before
            the field). requested_cudagraph_mode: ``--cudagraph-mode``'s value, None for the mode's own.
        workload: the requests and the engine's limits, in words (rows of different workloads are not
            compared).
        output_tokens_per_s: generated tokens / elapsed seconds. speedup_vs_static: static's elapsed / this
            row's (None on static rows or without one).
        decode_ms, mixed_ms: the mean step time of each kind, ms (None where no such step ran, or the file
            predates step times). decode_x_floor: decode_ms / the decode steps' floor (weights and KV cache
            moved / bandwidth; None on a CPU or in older files).
        gpu (None on a CPU), torch, date (ISO), source: where and when it ran, and the file.
    """

    model: str
    mode: str
    cudagraph_mode: str | None
    requested_cudagraph_mode: str | None
    scheduling: str
    workload: str
    output_tokens_per_s: float
    speedup_vs_static: float | None
    decode_ms: float | None
    mixed_ms: float | None
    decode_x_floor: float | None
    gpu: str | None
    torch: str
    date: str
    source: str

    @property
    def key(self) -> tuple:
        # what ran as well as what was asked: files from before the request was recorded asked with no field
        graphs = self.requested_cudagraph_mode, self.cudagraph_mode
        return self.model, self.gpu, self.workload, self.mode, graphs, self.scheduling


def _span(pair: list[int]) -> str:
    low, high = pair
    return str(low) if low == high else f"{low}:{high}"


def _number(path, field: str, value, optional: bool = True) -> float | None:
    """``value`` checked as a finite number >= 0 (or None where ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ResultsError(f"{path}: {field} {value!r} is not a finite number >= 0")
    return float(value)


def read_throughput_rows(path: str | Path) -> list[ThroughputRow] | None:
    """The rows of a ``bench_throughput`` file, or None for a file of another kind.

    Raises:
        ResultsError: unreadable or not JSON, or a throughput file with a field missing, of the wrong type, or
            a measured number that is not finite and >= 0 (one line naming the file).
    """
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ResultsError(f"{path}: not a readable JSON file ({err})") from None
    if not (isinstance(doc, dict) and doc.get("benchmark") == "throughput"):
        return None
    try:
        w, e, env = doc["workload"], doc["engine"], doc["env"]
        workload = (
            f"{w['num_prompts']} requests, input {_span(w['input_len'])}, output {_span(w['output_len'])}, seed "
            f"{w['seed']}; max_num_seqs {e['max_num_seqs']}, max_num_batched_tokens {e['max_num_batched_tokens']}, "
            f"{e['dtype']}"
        )
        rows = []
        for r in doc["rows"]:
            steps = r.get("step_ms") or {}
            decode, mixed = (steps[kind]["mean_ms"] if kind in steps else None for kind in ("decode", "mixed"))
            floor = r.get("decode_floor") or {}
            rows.append(
                ThroughputRow(
                    model=doc["model"],
                    mode=r["mode"],
                    cudagraph_mode=r.get("cudagraph_mode"),
                    requested_cudagraph_mode=r.get("requested_cudagraph_mode"),
                    scheduling=r["scheduling"],
                    workload=workload,
                    output_tokens_per_s=_number(path, "output_tokens_per_s", r["output_tokens_per_s"], False),
                    speedup_vs_static=_number(path, "speedup_vs_static", r["speedup_vs_static"]),
                    decode_ms=_number(path, "decode mean_ms", decode),
                    mixed_ms=_number(path, "mixed mean_ms", mixed),
                    decode_x_floor=_number(path, "decode_floor x_floor", floor.get("x_floor")),
                    gpu=env.get("gpu"),
                    torch=env["torch"],
                    date=env["date"],
                    source=str(path),
                )
            )
    except KeyError as err:
        raise ResultsError(f"{path}: a throughput file without the field {err}") from None
    except (TypeError, AttributeError, ValueError) as err:
        raise ResultsError(f"{path}: a throughput file with a field of the wrong type ({err})") from None
    return rows


def newest_throughputs(rows: list[ThroughputRow]) -> list[ThroughputRow]:
    """One row per key (model, GPU, workload, mode, graph kind asked and run, scheduling): the newest by date
    (the later file on a tie), in first-seen order."""
    kept: dict[tuple, ThroughputRow] = {}
    for row in rows:
        if row.key not in kept or row.date >= kept[row.key].date:
            kept[row.key] = row
    return list(kept.values())


def throughput_table(rows: list[ThroughputRow]) -> str:
    """One table per workload (its line over it): | model | device | mode | cudagraph_mode | scheduling |
    output tok/s | vs static | decode step ms | mixed step ms | decode x floor |."""
    def fmt(value: float | None, spec: str, suffix: str = "") -> str:
        return "-" if value is None else f"{value:{spec}}{suffix}"

    parts = []
    for workload in dict.fromkeys(r.workload for r in rows):
        lines = [
            f"{workload}:",
            "",
            "| model | device | mode | cudagraph_mode | scheduling | output tok/s | vs static | decode step ms | "
            "mixed step ms | decode x floor |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in (r for r in rows if r.workload == workload):
            asked, ran = r.requested_cudagraph_mode, r.cudagraph_mode
            graphs = "(not recorded)" if ran is None else ran if asked in (None, ran) else f"{ran} (asked: {asked})"
            cells = [r.model, r.gpu or "cpu", r.mode, graphs, r.scheduling, f"{r.output_tokens_per_s:,.0f}"]
            cells += [fmt(r.speedup_vs_static, ".2f", "x"), fmt(r.decode_ms, ".2f"), fmt(r.mixed_ms, ".2f")]
            cells += [fmt(r.decode_x_floor, ".2f")]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
