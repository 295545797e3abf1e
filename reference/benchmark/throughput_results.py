"""Saved ``bench_throughput`` documents (``python -m reference.bench_throughput --output-json``) for the report:
each (mode, graph kind, scheduling) row's throughput over its workload, side by side.

A :class:`ThroughputRow` is one row of one run. Rows are compared only within a workload: the same model, GPU,
requests (seed, count, length ranges), engine limits (``max_num_seqs``, ``max_num_batched_tokens``,
``max_model_len``), chunked prefill on or off, the scheduling policy and dtype, which
:attr:`ThroughputRow.workload` spells. Where several files give the same key, the newest run (by its recorded
date) is kept. Files written before a field existed (the graph kind asked for, the step times, the decode
floor) read that field as not measured, and the policy as ``fcfs``, the only one there was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from reference.benchmark.results import ResultsError, check_date, read_json


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
        interrupted: the run's own words when Ctrl-C stopped it before its last row, else None.
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
    interrupted: str | None = None

    @property
    def key(self) -> tuple:
        # what ran as well as what was asked: files from before the request was recorded asked with no field
        graphs = self.requested_cudagraph_mode, self.cudagraph_mode
        return self.model, self.gpu, self.workload, self.mode, graphs, self.scheduling


# bench_throughput's --scheduling-policy values (the engine's SCHEDULING_POLICIES), in the words of a table's line
POLICY_WORDS = {"fcfs": "scheduling_policy fcfs", "priority": "scheduling_policy priority (longest output first)"}


def _span(pair: list[int]) -> str:
    low, high = pair
    return str(low) if low == high else f"{low}:{high}"


class _Fields:
    """Typed reads of one document's fields: a wrong kind is a :class:`ResultsError` naming the file, the
    field and the value, not a traceback from a table, a sort or a hash much later."""

    def __init__(self, path: str | Path):
        self.path = path

    def _wrong(self, field: str, value, kind: str) -> ResultsError:
        return ResultsError(f"{self.path}: {field} {value!r} is not {kind}")

    def number(self, field: str, value, optional: bool = True) -> float | None:
        """``value`` as a finite number >= 0 (None allowed where ``optional``)."""
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise self._wrong(field, value, "a finite number >= 0" + " or null" * optional)
        return float(value)

    def text(self, field: str, value, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            raise self._wrong(field, value, "a string" + " or null" * optional)
        return value

    def table(self, field: str, value, optional: bool = False) -> dict:
        """``value`` as a JSON object ({} for None where ``optional``)."""
        if value is None and optional:
            return {}
        if not isinstance(value, dict):
            raise self._wrong(field, value, "an object" + " or null" * optional)
        return value


def read_throughput_rows(path: str | Path) -> list[ThroughputRow] | None:
    """The rows of a ``bench_throughput`` file, or None for a file of another kind.

    Raises:
        ResultsError: unreadable or not JSON, or a throughput file with a field missing or of the wrong kind
            (a name that is not a string, a measured number that is not finite and >= 0, a date that is not
            ISO 8601): one line naming the file and the field.
    """
    doc = read_json(path)
    if not (isinstance(doc, dict) and doc.get("benchmark") == "throughput"):
        return None
    f = _Fields(path)
    try:
        w, e, env = (f.table(name, doc[name]) for name in ("workload", "engine", "env"))
        chunked = "chunked prefill" if e["enable_chunked_prefill"] else "no chunked prefill"
        policy = e.get("scheduling_policy", "fcfs")  # files from before the flag: fcfs, the only policy then
        if not isinstance(policy, str) or policy not in POLICY_WORDS:  # a list is not hashable
            raise ResultsError(f"{path}: scheduling_policy {policy!r} is not one of {list(POLICY_WORDS)}")
        policy = POLICY_WORDS[policy]
        workload = (
            f"{w['num_prompts']} requests, input {_span(w['input_len'])}, output {_span(w['output_len'])}, seed "
            f"{w['seed']}; max_num_seqs {e['max_num_seqs']}, max_num_batched_tokens {e['max_num_batched_tokens']}, "
            f"max_model_len {e['max_model_len']}, {chunked}, {policy}, {e['dtype']}"
        )
        model, gpu = f.text("model", doc["model"]), f.text("gpu", env.get("gpu"), optional=True)
        torch, date = f.text("torch", env["torch"]), check_date(env["date"], path)
        interrupted = f.text("interrupted", doc.get("interrupted"), optional=True)
        if not isinstance(doc["rows"], list):
            raise ResultsError(f"{path}: rows {doc['rows']!r} is not a list")
        rows = []
        for r in (f.table("a row", row) for row in doc["rows"]):
            steps = f.table("step_ms", r.get("step_ms"), optional=True)
            decode, mixed = (f.table(f"step_ms {kind}", steps[kind])["mean_ms"] if kind in steps else None
                             for kind in ("decode", "mixed"))  # fmt: skip
            floor = f.table("decode_floor", r.get("decode_floor"), optional=True)
            rows.append(
                ThroughputRow(
                    model=model,
                    mode=f.text("mode", r["mode"]),
                    cudagraph_mode=f.text("cudagraph_mode", r.get("cudagraph_mode"), optional=True),
                    requested_cudagraph_mode=f.text(
                        "requested_cudagraph_mode", r.get("requested_cudagraph_mode"), optional=True
                    ),
                    scheduling=f.text("scheduling", r["scheduling"]),
                    workload=workload,
                    output_tokens_per_s=f.number("output_tokens_per_s", r["output_tokens_per_s"], optional=False),
                    speedup_vs_static=f.number("speedup_vs_static", r["speedup_vs_static"]),
                    decode_ms=f.number("decode mean_ms", decode),
                    mixed_ms=f.number("mixed mean_ms", mixed),
                    decode_x_floor=f.number("decode_floor x_floor", floor.get("x_floor")),
                    gpu=gpu,
                    torch=torch,
                    date=date,
                    source=str(path),
                    interrupted=interrupted,
                )
            )
    except KeyError as err:
        raise ResultsError(f"{path}: a throughput file without the field {err}") from None
    except (TypeError, ValueError) as err:  # a length range that is not [MIN, MAX]
        if isinstance(err, ResultsError):
            raise
        raise ResultsError(f"{path}: a throughput file with a workload of the wrong shape ({err})") from None
    return rows


def throughput_table(rows: list[ThroughputRow]) -> str:
    """One table per workload (its line over it): | model | device | mode | cudagraph_mode | scheduling |
    output tok/s | vs static | decode step ms | mixed step ms | decode x floor |; ``-`` where a row has no
    such number, ``‡`` on the rows of a run Ctrl-C stopped (a line under the table names it)."""
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
        stopped: dict[str, str] = {}  # file -> its words, for the runs Ctrl-C stopped
        for r in (r for r in rows if r.workload == workload):
            asked, ran = r.requested_cudagraph_mode, r.cudagraph_mode
            graphs = "(not recorded)" if ran is None else ran if asked in (None, ran) else f"{ran} (asked: {asked})"
            scheduling = r.scheduling + (" ‡" if r.interrupted else "")
            cells = [r.model, r.gpu or "cpu", r.mode, graphs, scheduling, f"{r.output_tokens_per_s:,.0f}"]
            cells += [fmt(r.speedup_vs_static, ".2f", "x"), fmt(r.decode_ms, ".2f"), fmt(r.mixed_ms, ".2f")]
            cells += [fmt(r.decode_x_floor, ".2f")]
            lines.append("| " + " | ".join(cells) + " |")
            if r.interrupted:
                stopped[r.source] = r.interrupted
        notes = [f"‡ from `{src}`, a run stopped early: {why}" for src, why in stopped.items()]
        lines += [""] * bool(notes) + notes
        parts.append("\n".join(lines))
    return "\n\n".join(parts)
