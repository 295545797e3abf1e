"""The report's markdown: the seed-style table (models x modes: latency and x floor), each mode's speed-up
over each peer, start-up and graph memory per mode, and the change per row between two sets of results."""

from __future__ import annotations

from reference.benchmark.choices import BASELINES
from reference.benchmark.results import Row, mode_order, with_overrides
from reference.config import MODES

IQR_WARNING = 0.10  # flag a row whose interquartile range exceeds this fraction of its median


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.3f} s"


def _device(row: Row) -> str:
    return row.gpu or "cpu"


def _cell(text: str) -> str:
    """``text`` as one markdown table cell: a ``|`` in it (an override's value) would start another."""
    return text.replace("|", "\\|")


def latency_table(rows: list[Row]) -> str:
    """| model | device | measure | floor | mode... |: one line per setting (model, GPU, measure, overrides; the
    measure shown with its ``-O`` overrides), p50 with its multiple of the floor; ``*`` marks a spread (IQR)
    above ``IQR_WARNING`` of the median."""
    modes = mode_order(rows)
    groups: dict[tuple, dict[str, Row]] = {}
    for r in rows:
        groups.setdefault(r.setting, {})[r.mode] = r
    head = "| model | device | measure | floor | " + " | ".join(modes) + " |"
    lines = [head, "|---" * (4 + len(modes)) + "|"]
    for by_mode in groups.values():
        first = next(iter(by_mode.values()))
        floors = {r.floor_s for r in by_mode.values() if r.floor_s}
        floor = _time(min(floors)) if floors else "-"
        cells = []
        for mode in modes:
            r = by_mode.get(mode)
            if r is None:
                cells.append("-")
                continue
            noisy = "*" if r.iqr_s is not None and r.iqr_s > IQR_WARNING * r.latency_s else ""
            cells.append(_time(r.latency_s) + (f" ({r.x_floor:.2f}x)" if r.x_floor else "") + noisy)
        where = f"| {first.model} | {_device(first)} | {_cell(first.measure_label)} | {floor} | "
        lines.append(where + " | ".join(cells) + " |")
    return "\n".join(lines)


def speedup_table(rows: list[Row], every_row: list[Row] | None = None) -> str | None:
    """| model | device | measure | peer | mode... |: how many times faster each project mode runs the same work
    (model, GPU, measure, overrides) than each peer (``BASELINES``: ``hf-eager``, ``hf-compile``,
    ``torch-native``), i.e. peer p50 / mode p50.

    ``rows`` holds one row per key (the newest); ``every_row`` (default ``rows``) all rows read, so that a
    mode is compared with the peer's own run (file) whenever that run timed it too. Otherwise the newest
    row of the mode is used and the cell is marked ``†``: a ratio of two runs, which the machine's state
    between them may move. None when no measure has both a peer and a project mode.
    """
    modes = [m for m in mode_order(rows) if m in MODES]
    newest_row = {r.key: r for r in rows}
    in_run = {(*r.key, r.source): r for r in every_row or rows}
    lines = []
    for base in (r for r in rows if r.mode in BASELINES):
        cells = []
        for mode in modes:
            key = (*base.setting, mode)
            same_run = in_run.get((*key, base.source))
            r = same_run or newest_row.get(key)
            if r is None:
                cells.append("-")
            else:
                cells.append(f"{base.latency_s / r.latency_s:.2f}x" + ("" if same_run else "†"))
        if any(c != "-" for c in cells):
            where = f"| {base.model} | {_device(base)} | {_cell(base.measure_label)} | {base.mode} | "
            lines.append(where + " | ".join(cells) + " |")
    if not lines:
        return None
    header = ["| model | device | measure | peer | " + " | ".join(modes) + " |", "|---" * (4 + len(modes)) + "|"]
    return "\n".join(header + lines)


def startup_table(rows: list[Row]) -> str:
    """| model | device | mode | start-up | graph memory |, one row per model, GPU, mode and overrides (the mode
    shown with its ``-O`` overrides): from a generate measure
    (bench_latency, where the engine starts) when there is one, else from perf/'s step benchmarks (whose
    first test per mode records the runner's start-up). A start-up whose compile the compile cache served is
    marked so. Graph memory that came out negative (a caching allocator handed memory back during the
    capture) is shown as not measured."""
    lines = [
        "| model | device | mode | start-up (compile + capture; baselines: first call) | graph memory |",
        "|---|---|---|---|---|",
    ]
    chosen: dict[tuple, Row] = {}
    for r in rows:
        if r.startup_s is None:
            continue
        key = (r.model, r.gpu, r.mode, r.overrides)
        if key not in chosen or (r.measure.startswith("generate") and not chosen[key].measure.startswith("generate")):
            chosen[key] = r
    for r in chosen.values():
        graph = f"{r.graph_gib:.3f} GiB" if r.graph_gib is not None else "-"
        if r.graph_gib is not None and r.graph_gib < 0:  # free memory before minus after: a pool shrank too
            graph = f"not measured (free memory rose {-r.graph_gib:.3f} GiB during capture)"
        cached = " (compile read from the compile cache)" if r.startup_cached else ""
        mode = with_overrides(r.mode, r.overrides)
        lines.append(f"| {r.model} | {_device(r)} | {_cell(mode)} | {r.startup_s:.2f} s{cached} | {graph} |")
    return "\n".join(lines)


def _same_tokens(old: Row, new: Row) -> str:
    """The share of sequences whose token digests agree between two runs' rows, '-' where either has none or
    they cover another number of prompts."""
    a, b = old.token_digests, new.token_digests
    if not a or not b or len(a) != len(b):
        return "-"
    return f"{sum(x == y for x, y in zip(a, b)) / len(a):.0%}"


def comparison_table(old: list[Row], new: list[Row]) -> str:
    """| model | device | measure | mode | old | new | change | same tokens |: rows of the same model, GPU, measure and
    mode in both (a run on another GPU has none in common: its timings do not compare), change = new / old - 1,
    and the share of sequences that generated the same tokens in both runs (:func:`_same_tokens`). Two runs with
    other ``-O`` overrides are an A/B of those overrides: the measure cell names both sets."""
    before = {(r.model, r.gpu, r.measure, r.mode): r for r in old}
    head = "| model | device | measure | mode | old | new | change | same tokens |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in new:
        o = before.get((r.model, r.gpu, r.measure, r.mode))
        if o is not None:
            change = 100 * (r.latency_s / o.latency_s - 1)
            measure = r.measure_label if o.overrides == r.overrides else f"{o.measure_label} → {r.measure_label}"
            lines.append(
                f"| {r.model} | {_device(r)} | {_cell(measure)} | {r.mode} | {_time(o.latency_s)} | "
                f"{_time(r.latency_s)} | {change:+.1f}% | {_same_tokens(o, r)} |"
            )
    return "\n".join(lines)


def sources(rows: list) -> str:
    """One line per results file used: its GPU, torch and date (rows: latency :class:`Row` s and start-up rows
    alike, anything with ``source``, ``gpu``, ``torch`` and ``date``)."""
    seen = dict.fromkeys((r.source, r.gpu or "cpu", r.torch or "?", r.date[:19]) for r in rows)
    return "\n".join(f"- `{src}`: {gpu}, torch {torch}, {date}" for src, gpu, torch, date in seen)
