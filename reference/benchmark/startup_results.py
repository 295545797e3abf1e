"""Saved ``bench_startup`` documents (``python -m reference.bench_startup --output-json``) for the report: each
mode's cold and warm start side by side.

A :class:`StartupRow` is one (model, GPU, mode, config overrides): its ``ready`` seconds (compile + capture,
weights excluded) cold and warm. Where several files give the same key, the newest run (by its recorded date)
is kept.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from reference.benchmark.results import (
    ResultsError,
    check_date,
    gpu_name,
    overrides_text,
    read_json,
    with_overrides,
)


@dataclass(frozen=True)
class StartupRow:
    """One mode's cold and warm start.

    Attributes:
        model, mode: as the tool ran them. overrides: its ``--compilation-config`` as compact JSON with sorted
            keys ('' without one). cold_ready_s, warm_ready_s: compile + capture, seconds.
        warm_hit: whether the warm start was served by the project's compile cache; None in files written
            before the cache existed (no ``compile_cache_hits`` field).
        gpu (None on a CPU), torch, date (ISO), source: where and when it ran, and the file.
    """

    model: str
    mode: str
    overrides: str
    cold_ready_s: float
    warm_ready_s: float
    warm_hit: bool | None
    gpu: str | None
    torch: str
    date: str
    source: str

    @property
    def key(self) -> tuple[str, str | None, str, str]:
        return self.model, self.gpu, self.mode, self.overrides

    @property
    def label(self) -> str:
        """The mode as the table shows it: with ``-O <overrides>`` where the run had them."""
        return with_overrides(self.mode, self.overrides)


def read_startup_rows(path: str | Path) -> list[StartupRow] | None:
    """The rows of a ``bench_startup`` file, or None for a file of another kind (a latency file).

    Raises:
        ResultsError: unreadable or not JSON, or a start-up file with a mode missing its cold or warm start,
            a ``ready_s`` that is not a finite number >= 0, or a field missing (one line naming the file).
    """
    doc = read_json(path)
    if not (isinstance(doc, dict) and {"model", "settings", "rows"} <= set(doc)):
        return None
    try:
        starts: dict[str, dict[str, dict]] = {}
        for row in doc["rows"]:
            starts.setdefault(row["mode"], {})[row["start"]] = row
        overrides = overrides_text(doc["settings"], path)
        rows = []
        for mode, by_start in starts.items():
            if sorted(by_start) != ["cold", "warm"]:
                raise ResultsError(f"{path}: mode {mode!r} has starts {sorted(by_start)}; expected cold and warm")
            cold, warm = by_start["cold"]["ready_s"], by_start["warm"]["ready_s"]
            for value in (cold, warm):
                number = isinstance(value, (int, float)) and not isinstance(value, bool)
                if not (number and math.isfinite(value) and value >= 0):
                    raise ResultsError(f"{path}: mode {mode!r}: ready_s {value!r} is not a finite number >= 0")
            hits = by_start["warm"].get("compile_cache_hits")
            env = doc["env"]
            rows.append(
                StartupRow(doc["model"], mode, overrides, cold, warm, None if hits is None else hits > 0,
                           gpu_name(env.get("gpu")), env["torch"], check_date(env["date"], path),
                           str(path))  # fmt: skip
            )
    except KeyError as err:
        raise ResultsError(f"{path}: a start-up file without the field {err}") from None
    except (TypeError, AttributeError) as err:
        raise ResultsError(f"{path}: a start-up file with a field of the wrong type ({err})") from None
    return rows


def cold_warm_table(rows: list[StartupRow]) -> str:
    """| model | device | mode | ready cold | ready warm | warm / cold | compile cache hit |, seconds."""
    lines = [
        "| model | device | mode | ready cold, s | ready warm, s | warm / cold | warm start served by the "
        "compile cache |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r.warm_ready_s / r.cold_ready_s:.2f}" if r.cold_ready_s > 0 else "-"
        hit = {True: "yes", False: "no", None: "(no cache yet)"}[r.warm_hit]
        ready = f"{r.cold_ready_s:.2f} | {r.warm_ready_s:.2f}"
        lines.append(f"| {r.model} | {r.gpu or 'cpu'} | {r.label} | {ready} | {ratio} | {hit} |")
    return "\n".join(lines)
