"""Saved benchmark results as rows: ``bench_latency`` JSON (whole ``generate`` calls) and pytest-benchmark
JSON from perf/ (one decode step or one prefill), read into one shape for the report.

A :class:`Row` is one latency of one mode on one GPU, for one measure and one set of config overrides, with its
floor, start-up and graph memory. Where several files give the same key, the newest run (by its recorded date) is
kept: a run on another GPU, or with other ``-O`` overrides, times other work and keeps its own rows.
"""

from __future__ import annotations

import datetime
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from reference.config import MODES

_Dated = TypeVar("_Dated")  # a row of any results kind: it has ``key`` and ``date`` (ISO 8601)

# pytest-benchmark test names in perf/test_step_latency.py -> the measure they time
STEP_MEASURES = {
    "test_decode_step_latency": "decode step",
    "test_decode_steps_back_to_back": "decode step back to back",
    "test_prefill_latency": "prefill",
}


class ResultsError(ValueError):
    """A results file that is not ``bench_latency`` or pytest-benchmark JSON; the message names it."""


@dataclass(frozen=True)
class Row:
    """One latency of one mode.

    Attributes:
        model: preset or checkpoint. measure: ``'generate B=8, 32+128'``, ``'decode step B=8'``, ...
        mode: an engine mode (``eager``, ``no_inductor``, ...) or a baseline (``hf-compile``, ...).
        latency_s: median (p50), seconds. floor_s: the bandwidth floor of the same work, seconds, or None
            (CPU runs). startup_s: compile + capture (engine modes), the first call (baselines), or None.
        graph_gib: device memory the CUDA graphs took, GiB, or None. iqr_s: interquartile range of the
            timed calls when the file has it (pytest-benchmark), seconds.
        gpu, torch, date: where and when it ran (ISO date). source: the file.
        startup_cached: the compile part of ``startup_s`` was read from the project's compile cache (a warm
            start; bench_latency's ``compile_cache_hits``), so it is no compile time.
        overrides: the run's ``--compilation-config`` overrides as compact JSON with sorted keys
            (:func:`overrides_text`), '' for none.
        token_digests: each sequence's generated tokens as a digest
            (:func:`~reference.benchmark.latency.token_digests`), or None (files before 2026-12-07, perf/'s steps).
    """

    model: str
    measure: str
    mode: str
    latency_s: float
    floor_s: float | None
    startup_s: float | None
    graph_gib: float | None
    iqr_s: float | None
    gpu: str | None
    torch: str | None
    date: str
    source: str
    startup_cached: bool = False
    overrides: str = ""
    token_digests: tuple[str, ...] | None = None

    @property
    def setting(self) -> tuple[str, str | None, str, str]:
        """What was timed and where, but for the mode: (model, GPU, measure, overrides)."""
        return self.model, self.gpu, self.measure, self.overrides

    @property
    def key(self) -> tuple[str, str | None, str, str, str]:
        return *self.setting, self.mode

    @property
    def measure_label(self) -> str:
        """The measure as the tables show it: with ``-O <overrides>`` where the run had them."""
        return with_overrides(self.measure, self.overrides)

    @property
    def x_floor(self) -> float | None:
        return self.latency_s / self.floor_s if self.floor_s else None


def with_overrides(label: str, overrides: str) -> str:
    """``label`` (a measure, a mode) as the report names a run with ``-O`` overrides: ``'<label> -O <overrides>'``,
    or ``label`` alone where there were none."""
    return f"{label} -O {overrides}" if overrides else label


def overrides_text(settings: dict, path: str | Path) -> str:
    """A run's ``compilation_config_overrides`` (its ``-O`` fields) as compact JSON with sorted keys, '' for
    none (null or ``{}``): one spelling per set of overrides, so that two runs with the same ones share rows.

    Raises:
        ResultsError: the field is neither a dict nor null (naming the file).
    """
    overrides = settings.get("compilation_config_overrides")
    if not isinstance(overrides, (dict, type(None))):
        raise ResultsError(f"{path}: compilation_config_overrides {overrides!r} is not a dict")
    return json.dumps(overrides, sort_keys=True, separators=(",", ":"), ensure_ascii=False) if overrides else ""


def gpu_name(value):
    """A file's GPU field with one spelling for none: bench_latency writes null on a CPU, perf/'s steps "cpu"; both
    (and "") are None, so that a CPU run's rows share one key."""
    return None if value in (None, "", "cpu") else value


def _digests(result: dict, source: str) -> tuple[str, ...] | None:
    """A bench_latency result's ``token_digests`` as a tuple, None where the file has none.

    Raises:
        ResultsError: the field is not a list of strings (naming the file and the mode).
    """
    digests = result.get("token_digests")
    if digests is None:
        return None
    if not (isinstance(digests, list) and all(isinstance(d, str) for d in digests)):
        raise ResultsError(f"{source}: mode {result['mode']!r}: token_digests {digests!r} is not a list of strings")
    return tuple(digests)


def _bench_latency_rows(doc: dict, source: str) -> list[Row]:
    s, env = doc["settings"], doc["env"]
    overrides = overrides_text(s, source)
    measure = f"generate B={s['batch_size']}, {s['input_len']}+{s['output_len']}"
    if s.get("tensor_parallel_size", 1) > 1:
        measure += f", TP={s['tensor_parallel_size']}"
    rows = []
    for r in doc["results"]:
        start = r["startup"]
        startup = start.get("first_call_s") if r["kind"] == "baseline" else start["compile_s"] + start["capture_s"]
        rows.append(
            Row(
                doc["model"],
                measure,
                r["mode"],
                r["latency_s"]["p50"],
                r.get("floor_s"),
                startup,
                start.get("graph_gib"),
                None,
                gpu_name(env.get("gpu")),
                env.get("torch"),
                env["date"],
                source,
                bool(start.get("compile_cache_hits")),  # files before 2026-12-03 lack it: compiled cold
                overrides,
                _digests(r, source),
            )
        )
    return rows


def _is_number(value) -> bool:
    """An int or float read from JSON; not a bool, which Python counts as an int."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pytest_benchmark_rows(doc: dict, source: str) -> list[Row]:
    rows = []
    for b in doc["benchmarks"]:
        test, info = b["name"].split("[", 1)[0], b.get("extra_info", {})
        if test not in STEP_MEASURES or "mode" not in info:
            continue  # not one of perf/'s step benchmarks
        measure = f"{STEP_MEASURES[test]} B={info['batch_size']}"
        # files written before 2026-12-02 (NOTES v12) timed a chain of back-to-back steps as one iteration
        steps = info.get("steps_per_round", 1)
        if not _is_number(steps) or steps < 1:
            raise ResultsError(f"{source}: {b['name']}: steps_per_round {steps!r} is not a count of steps (>= 1)")
        floor = info.get("floor_ms")
        rows.append(
            Row(
                info["model"],
                measure,
                info["mode"],
                b["stats"]["median"] / steps,
                floor / 1e3 if floor else None,
                # perf/ records start-up with each mode's first test only
                info["compile_s"] + info["capture_s"] if "compile_s" in info else None,
                info.get("graph_gib"),
                b["stats"]["iqr"] / steps,
                gpu_name(info.get("device")),
                doc.get("machine_info", {}).get("torch"),
                doc["datetime"],
                source,
            )
        )
    return rows


def read_json(path: str | Path):
    """The JSON document in results file ``path``, for every kind of results file.

    Raises:
        ResultsError: unreadable, not UTF-8, not JSON, or nested deeper than the JSON reader goes (one line
            naming the file).
    """
    try:
        return json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ResultsError(f"{path}: not a readable JSON file ({err})") from None
    except RecursionError:
        raise ResultsError(f"{path}: not a readable JSON file (nested too deep)") from None


def read_rows(path: str | Path) -> list[Row]:
    """The rows of one results file.

    Raises:
        ResultsError: unreadable, not JSON, neither format, a latency that is not a finite positive number,
            another number that is not finite or null, a name or date that is not a string, or a
            ``steps_per_round`` that is not a number >= 1 (one line naming the file).
    """
    doc = read_json(path)
    try:
        if isinstance(doc, dict) and "results" in doc and "settings" in doc:
            rows = _bench_latency_rows(doc, str(path))
        elif isinstance(doc, dict) and "benchmarks" in doc:
            rows = _pytest_benchmark_rows(doc, str(path))
        else:
            raise ResultsError(
                f"{path}: neither bench_latency JSON ('settings', 'results') nor pytest-benchmark JSON ('benchmarks')"
            )
    except KeyError as err:
        raise ResultsError(f"{path}: a results file without the field {err}") from None
    except (TypeError, AttributeError) as err:
        raise ResultsError(f"{path}: a results file with a field of the wrong type ({err})") from None
    for row in rows:
        _check_row(row, path)
    return rows


def _check_row(row: Row, path: str | Path) -> None:
    """Each field of ``row`` has the kind the tables and the chart take, or ResultsError names it: a wrong
    kind got through to a sort, a hash or matplotlib's log scale as a traceback."""
    for name in ("model", "measure", "mode", "date"):
        if not isinstance(getattr(row, name), str):
            raise ResultsError(f"{path}: {name} {getattr(row, name)!r} is not a string")
    check_date(row.date, path)
    where = f"{path}: mode {row.mode!r}:"
    # the report divides by latencies and draws them on a log scale
    if not (_is_number(row.latency_s) and math.isfinite(row.latency_s) and row.latency_s > 0):
        raise ResultsError(f"{where} latency {row.latency_s} s is not a positive number")
    for name in ("floor_s", "startup_s", "graph_gib", "iqr_s"):
        value = getattr(row, name)
        if value is not None and not (_is_number(value) and math.isfinite(value)):
            raise ResultsError(f"{where} {name} {value!r} is not a finite number or null")
    for name in ("gpu", "torch"):
        if getattr(row, name) is not None and not isinstance(getattr(row, name), str):
            raise ResultsError(f"{where} {name} {getattr(row, name)!r} is not a string or null")


def mode_order(rows: list[Row]) -> list[str]:
    """The rows' modes: the project's in ``reference.config.MODES`` order, then the others (baselines) in
    first-seen order. Tables take their columns and the chart its colours from this order."""
    seen = list(dict.fromkeys(r.mode for r in rows))
    return [m for m in MODES if m in seen] + [m for m in seen if m not in MODES]


def run_time(date: str) -> datetime.datetime:
    """A run's recorded ISO 8601 date as an instant (one without an offset is read as UTC): runs recorded on
    machines in different time zones compare by when they ran, not as strings.

    Raises:
        ValueError: not an ISO 8601 date.
    """
    when = datetime.datetime.fromisoformat(date)
    return when if when.tzinfo else when.replace(tzinfo=datetime.timezone.utc)


def check_date(date: object, path: str | Path) -> str:
    """``date`` if it is an ISO 8601 date string, or ResultsError naming the file and the value."""
    try:
        run_time(date)
    except (TypeError, ValueError):
        raise ResultsError(f"{path}: date {date!r} is not an ISO 8601 date") from None
    return date


def newest(rows: list[_Dated]) -> list[_Dated]:
    """One row per ``key`` (a latency :class:`Row`'s: model, GPU, measure, overrides, mode; a start-up or
    throughput row's own): the newest by date (the later file on a tie), in first-seen order."""
    kept: dict[tuple, _Dated] = {}
    for row in rows:
        if row.key not in kept or run_time(row.date) >= run_time(kept[row.key].date):
            kept[row.key] = row
    return list(kept.values())
