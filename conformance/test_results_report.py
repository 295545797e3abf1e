"""``python -m reference.report``: saved bench_latency and pytest-benchmark results as tables and a chart.

The inputs are the committed results in perf/results (real runs); expected cells are computed here from
the files' own numbers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import forked

from reference.benchmark.results import ResultsError, newest, read_rows
from reference.benchmark.startup_results import read_startup_rows
from reference.benchmark.summary import comparison_table, latency_table, sources, speedup_table, startup_table
from reference.benchmark.summary import IQR_WARNING
from reference.config import MODES
from reference.report import main as report_main

ROOT = Path(__file__).resolve().parents[1]
GENERATE = ROOT / "perf/results/llama-3.1-8b-20261130-045438.json"
STEP_OLD = ROOT / "perf/results/step-llama-3.1-8b-decode-old-20261201.json"
STEP_NEW = ROOT / "perf/results/step-llama-3.1-8b-decode-new-20261201.json"
# two runs of one model: the peers' newest rows and the modes' newest rows come from different runs
GEMMA_RUNS = (ROOT / "perf/results/gemma-3-4b-20261130-050617.json", ROOT / "perf/results/gemma-3-4b-20261201-141614.json")
STEP_FULL = ROOT / "perf/results/step-llama-3.1-8b-decode-full-20261201.json"  # breakable, no_inductor, *_full
STEP_LOOP = ROOT / "perf/results/step-llama-3.1-8b-decode-loop-20261201.json"  # six modes and torch-native
GENERATE_LOOP = ROOT / "perf/results/llama-3.1-8b-20261201-160646.json"  # six modes, no baselines

pytestmark = pytest.mark.requires("components")


def test_a_bench_latency_file_gives_one_row_per_mode_with_its_p50_and_floor():
    doc = json.loads(GENERATE.read_text())
    rows = read_rows(GENERATE)
    assert [r.mode for r in rows] == [r["mode"] for r in doc["results"]]
    for row, result in zip(rows, doc["results"]):
        assert row.latency_s == result["latency_s"]["p50"]
        assert row.x_floor == pytest.approx(result["x_floor"])


def test_a_pytest_benchmark_file_gives_the_step_medians_and_their_floor():
    doc = json.loads(STEP_NEW.read_text())
    rows = read_rows(STEP_NEW)
    assert [r.latency_s for r in rows] == [b["stats"]["median"] for b in doc["benchmarks"]]
    assert all(r.measure == "decode step B=8" and r.floor_s == pytest.approx(3.548e-3, rel=1e-3) for r in rows)


def test_a_round_of_back_to_back_steps_is_read_per_step(tmp_path):
    """perf/'s back-to-back benchmark times rounds of several decode steps; a row is one step."""
    doc = json.loads(STEP_NEW.read_text())
    for b in doc["benchmarks"]:
        b["name"] = b["name"].replace("test_decode_step_latency", "test_decode_steps_back_to_back")
        b["extra_info"]["steps_per_round"] = 16
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(doc))
    rows = read_rows(path)
    assert [r.latency_s for r in rows] == [b["stats"]["median"] / 16 for b in doc["benchmarks"]]
    assert [r.iqr_s for r in rows] == [b["stats"]["iqr"] / 16 for b in doc["benchmarks"]]
    assert all(r.measure == "decode step back to back B=8" for r in rows)


@pytest.mark.parametrize("p50", [0.0, -0.5, float("nan"), "0.2"], ids=["zero", "negative", "nan", "string"])
@pytest.mark.parametrize("source", ["bench_latency", "pytest-benchmark"])
def test_a_latency_that_is_not_positive_is_refused_with_the_file_and_mode(tmp_path, source, p50):
    """Ratios divide by latencies: a zero, negative or NaN p50 (a corrupt or hand-edited file) is an
    error naming the file and the mode, not a ZeroDivisionError or a NaN ratio in the report."""
    if source == "bench_latency":
        doc = json.loads(GENERATE.read_text())
        doc["results"][1]["latency_s"]["p50"] = p50
        mode = doc["results"][1]["mode"]
    else:
        doc = json.loads(STEP_NEW.read_text())
        doc["benchmarks"][1]["stats"]["median"] = p50
        mode = doc["benchmarks"][1]["extra_info"]["mode"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    expected = f"mode {mode!r}: latency {p50} s is not a positive number"
    if isinstance(p50, str) and source == "pytest-benchmark":  # divided by the steps per round first
        expected = "a results file with a field of the wrong type"
    with pytest.raises(ResultsError, match=f"bad.json: {expected}"):
        read_rows(path)


def test_step_files_alone_give_each_modes_start_up_from_its_first_test():
    doc = json.loads(STEP_LOOP.read_text())
    first = {}  # mode -> compile + capture of the first benchmark that records them
    for b in doc["benchmarks"]:
        info = b["extra_info"]
        if "compile_s" in info:
            first.setdefault(info["mode"], info["compile_s"] + info["capture_s"])
    table = startup_table(read_rows(STEP_LOOP))
    rows = table.splitlines()[2:]
    assert len(rows) == len(first) == 7  # six modes and torch-native
    for mode, startup in first.items():
        assert f"| llama-3.1-8b | NVIDIA H200 | {mode} | {startup:.2f} s |" in table


def test_graph_memory_that_came_out_negative_is_not_shown_as_a_figure():
    """Graph memory is free memory before capture minus after; torch-native's CUDA graph trees can hand
    cached memory back meanwhile (STEP_LOOP records -0.254 GiB), which measures no graph."""
    negative = [r for r in read_rows(STEP_LOOP) if r.graph_gib is not None and r.graph_gib < 0]
    assert {r.mode for r in negative} == {"torch-native"}
    row = next(line for line in startup_table(read_rows(STEP_LOOP)).splitlines() if "| torch-native |" in line)
    assert row.endswith(f"| not measured (free memory rose {-negative[0].graph_gib:.3f} GiB during capture) |")


def test_a_generate_row_gives_the_start_up_where_both_kinds_of_file_have_one():
    table = startup_table(read_rows(STEP_LOOP) + read_rows(GENERATE_LOOP))
    generate = {r.mode: r.startup_s for r in read_rows(GENERATE_LOOP)}
    assert f"| llama-3.1-8b | NVIDIA H200 | no_inductor | {generate['no_inductor']:.2f} s |" in table
    assert len(table.splitlines()) == 2 + 7  # one row per mode: six modes and torch-native


def test_the_table_has_a_row_per_model_and_measure_and_a_column_per_mode():
    rows = read_rows(GENERATE) + read_rows(STEP_NEW)
    lines = latency_table(rows).splitlines()
    modes = list(dict.fromkeys(r.mode for r in rows))
    assert lines[0] == "| model | device | measure | floor | " + " | ".join(modes) + " |"
    no_inductor = next(r for r in rows if r.mode == "no_inductor" and r.measure.startswith("decode"))
    step = next(line for line in lines if "decode step" in line)
    assert f"{no_inductor.latency_s * 1e3:.2f} ms ({no_inductor.x_floor:.2f}x)" in step
    assert step.endswith("| - | - |")  # no baselines timed per step


def test_a_spread_above_a_tenth_of_the_median_is_flagged():
    (row, *_) = read_rows(STEP_NEW)
    noisy = dataclasses.replace(row, iqr_s=0.2 * row.latency_s)
    quiet = dataclasses.replace(row, iqr_s=0.05 * row.latency_s)
    assert latency_table([noisy]).splitlines()[2].endswith("x)* |")
    assert latency_table([quiet]).splitlines()[2].endswith("x) |")


def test_the_newest_run_of_a_key_wins():
    (row,) = read_rows(STEP_NEW)[:1]
    older = dataclasses.replace(row, date="2020-01-01", latency_s=1.0)
    assert newest([row, older]) == [row] and newest([older, row]) == [row]


def test_compare_gives_the_change_per_row_in_percent():
    old, new = read_rows(STEP_OLD), read_rows(STEP_NEW)
    lines = comparison_table(old, new).splitlines()[2:]
    assert len(lines) == len(new)
    for line, o, n in zip(lines, old, new):
        assert line.endswith(f"| {100 * (n.latency_s / o.latency_s - 1):+.1f}% | - |")  # step files: no tokens


def _report(*args: str) -> SimpleNamespace:
    """``python -m reference.report ARGS`` from the repository's root, in this process (so that a mutation
    run sees which tests reach it): its exit status and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    here = os.getcwd()  # contextlib.chdir would do, from Python 3.11; the project supports 3.10
    os.chdir(ROOT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                status = report_main(list(args))
            except SystemExit as exit_info:
                status = exit_info.code
    finally:
        os.chdir(here)
    return SimpleNamespace(returncode=status, stdout=out.getvalue(), stderr=err.getvalue())


def test_the_module_runs_as_a_program_and_writes_its_report(tmp_path):
    """The tests above call its main() in this process; this one runs ``python -m reference.report`` itself."""
    pytest.importorskip("matplotlib")
    cmd = [sys.executable, "-m", "reference.report", str(STEP_NEW), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| llama-3.1-8b | NVIDIA H200 | decode step B=8 |" in (tmp_path / "report.md").read_text()


def test_the_cli_writes_the_markdown_and_a_png_chart(tmp_path):
    pytest.importorskip("matplotlib")
    proc = _report(str(GENERATE), str(STEP_NEW), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "out/latency.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "out/report.md").read_text()
    h200 = "| llama-3.1-8b | NVIDIA H200 |"
    assert f"{h200} generate B=8, 32+128 |" in text and f"{h200} decode step B=8 |" in text


def test_a_mode_has_one_colour_in_every_panel_of_the_chart(tmp_path, monkeypatch):
    """The step file lacks eager and inductor, so by position its modes would take other modes' colours."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from reference.benchmark.chart import latency_chart

    colours: dict[str, set] = {}
    real_bar = Axes.bar

    def bar(self, *args, color=None, label=None, **kwargs):
        if label is not None:
            colours.setdefault(label, set()).add(color)
        return real_bar(self, *args, color=color, label=label, **kwargs)

    monkeypatch.setattr(Axes, "bar", bar)
    latency_chart(newest(read_rows(GENERATE) + read_rows(STEP_FULL)), tmp_path / "chart.png")
    assert {"no_inductor", "breakable"} <= set(colours)
    assert all(len(c) == 1 for c in colours.values()), colours


@pytest.mark.parametrize(
    "args, message",
    [
        ([], "give RESULTS... and --out DIR, or --compare OLD NEW"),
        (["README.md", "--out", "x"], "README.md: not a readable JSON file"),
        (["pyproject.toml", "--out", "x"], "pyproject.toml: not a readable JSON file"),
        (["fixtures/tiny-llama/config.json", "--out", "x"], "neither bench_latency JSON"),
        (["--compare", str(STEP_OLD), str(STEP_NEW), "--out", "x"], "--compare OLD NEW takes no other results"),
        (["--compare", str(GENERATE), str(STEP_NEW)], "share no (model, GPU, measure, mode) row"),
        ([str(STEP_NEW), "--out", "README.md"], "--out: cannot make the folder README.md"),
        ([str(STEP_NEW), "--out", "/proc/no-such-dir"], "--out: cannot make the folder /proc/no-such-dir"),
        # a folder that exists but takes no files (root may write anywhere else, so /proc it is)
        ([str(STEP_NEW), "--out", "/proc"], "--out: cannot write in /proc"),
        ([str(STEP_NEW), "--out", ""], "argument --out: expected a folder path, got an empty one"),
    ],
)
def test_bad_input_is_one_line_with_exit_2(args, message):
    proc = _report(*args)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr  # no usage block, no traceback
    assert message in proc.stderr
    assert "[Errno" not in proc.stderr  # an OS error is named by its words (strerror), not by its repr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--out", "x"], "give RESULTS... and --out DIR, or --compare OLD NEW"),
        ([str(STEP_NEW)], "give RESULTS... and --out DIR, or --compare OLD NEW"),  # results but nowhere to write
        (["--compare", str(STEP_OLD), str(STEP_NEW), "--out", "x"], "--compare OLD NEW takes no other results and no --out"),
    ],
)
def test_a_usage_error_is_the_programs_name_and_the_whole_message(args, message):
    proc = _report(*args)
    assert (proc.returncode, proc.stderr) == (2, f"python -m reference.report: error: {message} (see --help)\n")


def test_help_names_the_program_and_says_what_each_argument_takes():
    help_text = _report("--help")
    assert help_text.returncode == 0
    text = " ".join(help_text.stdout.split())  # argparse wraps to the terminal's width
    assert text.startswith("usage: python -m reference.report [-h] [--out OUT] [--compare OLD NEW] [results ...]")
    assert "``python -m reference.report RESULTS... --out DIR [--compare OLD NEW]``: saved results as a report." in text
    for fragment in ("results bench_latency, pytest-benchmark, bench_startup or bench_throughput JSON",
                     "--out OUT folder for report.md and latency.png (created if missing)",
                     "--compare OLD NEW print the change per row"):  # fmt: skip
        assert fragment in text, fragment


def test_results_record_the_machine_state_that_moves_latencies():
    import torch

    from reference.benchmark.machine import machine_info

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        info = machine_info(torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert info["threads"] == 1 and info["cpu_count"] >= 1 and info["cpu"]
    assert len(info["load_avg"]) == 3 and all(x >= 0 for x in info["load_avg"])
    assert info["gpu"] is None and info["gpu_clocks"] is None


def _saved_runs() -> set[Path]:
    """The pytest-benchmark runs saved in the repository, where ``pytest perf/ --benchmark-compare`` looks."""
    return set((ROOT / ".benchmarks").rglob("*.json"))


@pytest.mark.slow
def test_a_saved_perf_run_records_its_command_commit_torch_version_and_date(tmp_path):
    out = tmp_path / "run.json"
    args = ["perf", "-k", "prefill and eager", "--benchmark-json", str(out), "-p", "no:cacheprovider", "-q",
            f"--benchmark-storage=file://{tmp_path / 'benchmarks'}"]  # fmt: skip
    # an xdist worker's variables would tell pytest-benchmark it runs under xdist, and it would time nothing
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["REFERENCE_COMMIT"] = "0123abc"  # a copied tree's .git may be another commit's: the caller names it
    saved = _saved_runs()
    proc = forked.run([sys.executable, "-m", "pytest", *args], env=env)
    assert proc.returncode == 0, proc.stdout[-2000:]
    # the user's next `pytest perf/ --benchmark-compare` must not compare against a run the suite made
    assert _saved_runs() == saved, "the test saved a benchmark run into the repository's .benchmarks/"
    doc = json.loads(out.read_text())
    info = doc["machine_info"]
    assert info["command"] == "python -m pytest " + shlex.join(args)  # what to type to run it again
    assert info["torch"] and info["threads"] >= 1 and doc["datetime"]
    assert [b["extra_info"]["mode"] for b in doc["benchmarks"]] == ["eager"]
    assert doc["commit_info"]["id"] == "0123abc"


def test_the_peer_table_gives_each_modes_speed_up_and_marks_ratios_across_runs():
    same_run = newest(read_rows(STEP_LOOP))  # six modes and torch-native, one file
    table = speedup_table(same_run)
    by = {(r.measure, r.mode): r for r in same_run}
    for measure in {r.measure for r in same_run}:
        peer = by[(measure, "torch-native")].latency_s
        (line,) = [x for x in table.splitlines() if f"| {measure} | torch-native |" in x]
        cells = [c.strip() for c in line.split("|")[5:-1]]
        assert cells == [f"{peer / by[(measure, m)].latency_s:.2f}x" for m in MODES]  # no mark: one run
    # hf baselines and three modes from 2026-11-30, all six modes again in a later run: a mode the
    # baselines' own run timed is compared within that run, the others with the later run, marked
    old, later = read_rows(GENERATE), read_rows(GENERATE_LOOP)
    every = old + later
    (line,) = [x for x in speedup_table(newest(every), every).splitlines() if "| hf-compile |" in x]
    cells = dict(zip(MODES, (c.strip() for c in line.split("|")[5:-1])))
    in_old = {r.mode: r for r in old}
    assert {m for m, c in cells.items() if not c.endswith("†")} == set(in_old) & set(MODES)
    for mode in set(in_old) & set(MODES):
        assert cells[mode] == f"{in_old['hf-compile'].latency_s / in_old[mode].latency_s:.2f}x"
    assert speedup_table(later) is None  # no peer, no table


def test_a_results_file_that_cannot_be_written_whole_leaves_no_truncated_file(tmp_path, monkeypatch):
    """A full disk under --results-dir left a 0-byte results file behind a traceback: files are written to a
    temporary name and renamed once complete, and the refusal is one OSError naming the file."""
    from reference.benchmark import report

    real_write_text = Path.write_text

    def disk_fills(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", disk_fills)
    doc = {"model": "llama-tiny", "results": []}
    with pytest.raises(OSError, match="No space left on device"):
        report.write_results(doc, tmp_path / "run.json", None)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its partial copy


def test_compare_prints_the_table_of_both_runs_newest_rows_and_nothing_else():
    proc = _report("--compare", str(STEP_OLD), str(STEP_NEW))
    expected = comparison_table(newest(read_rows(STEP_OLD)), newest(read_rows(STEP_NEW)))
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, expected + "\n", "")


def test_compare_of_unrelated_runs_names_both_files_in_order():
    proc = _report("--compare", str(GENERATE), str(STEP_NEW))
    assert proc.stderr == (
        f"python -m reference.report: error: --compare: {GENERATE} and {STEP_NEW} share no (model, GPU, measure, "
        "mode) row; compare two runs of the same benchmark on the same GPU (see --help)\n"
    )


def test_a_file_without_latency_rows_is_refused_in_so_many_words(tmp_path):
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"machine_info": {}, "commit_info": {}, "benchmarks": [], "datetime": "2026-12-01"}))
    assert read_rows(empty) == []  # a pytest-benchmark run that saved no benchmark
    proc = _report(str(empty), "--out", str(tmp_path / "out"))
    assert (proc.returncode, proc.stderr) == (2, "python -m reference.report: error: the files hold no latency, "
                                                 "start-up or throughput rows (see --help)\n")  # fmt: skip
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("with_peers", [True, False])
def test_the_report_is_its_sections_in_order_written_whole_and_printed(tmp_path, with_peers):
    """The peers' section comes from each peer's own run: in the two gemma runs the peers' newest rows and the
    modes' newest rows are from different runs, so it differs from a table of the newest rows alone."""
    pytest.importorskip("matplotlib")
    files = [*GEMMA_RUNS, STEP_NEW] if with_peers else [STEP_NEW]
    out = tmp_path / "made" / "for" / "it"  # folders made as needed
    proc = _report(*map(str, files), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    every_row = [row for path in files for row in read_rows(path)]
    rows = newest(every_row)
    peers = speedup_table(rows, every_row)
    assert bool(peers) == with_peers and (not peers or peers != speedup_table(rows))
    expected = [
        "# Latency by model and mode",
        "p50 per call (per step for 'back to back' rows: a timed round of several steps / its steps), with its "
        "multiple of the bandwidth floor (weights read / bandwidth); `*`: the timed calls' interquartile range "
        f"exceeds {IQR_WARNING:.0%} of the median. Chart: `latency.png`.",
        latency_table(rows),
        *(["## Speed-up over the peers",
           "Peer p50 / mode p50 for the same model, GPU and measure (with its overrides; above 1: the mode is "
           "faster), from the peer's own run where it timed the mode too; `†`: the mode's row comes from another "
           "run.",
           peers] if with_peers else []),
        "## Start-up and graph memory",
        startup_table(rows),
        "## From",
        sources(rows),
        f"Written by `python -m reference.report {' '.join(map(str, files))} --out {out}`.",
    ]  # fmt: skip
    text = (out / "report.md").read_text()
    assert text == "\n\n".join(expected) + "\n"
    assert proc.stdout == text and proc.stderr == f"wrote {out / 'report.md'} and {out / 'latency.png'}\n"


def _spoiled(tmp_path, spoil) -> Path:
    """A copy of the bench_latency file GENERATE with ``spoil(doc)`` applied."""
    doc = json.loads(GENERATE.read_text())
    spoil(doc)
    path = tmp_path / "spoiled.json"
    path.write_text(json.dumps(doc))  # json writes float('inf') as Infinity, which it also reads back
    return path


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda d: d["results"][0]["latency_s"].update(p50=float("inf")), "latency inf s is not a positive number"),
        (lambda d: d["results"][0].update(floor_s="abc"), "floor_s 'abc' is not a finite number or null"),
        (lambda d: d["results"][0].update(floor_s=float("nan")), "floor_s nan is not a finite number or null"),
        (lambda d: d["results"][0]["startup"].update(graph_gib=True), "graph_gib True is not a finite number or null"),
        (lambda d: d["results"][0].update(mode=["eager"]), "mode ['eager'] is not a string"),
        (lambda d: d.update(model=7), "model 7 is not a string"),
        (lambda d: d["env"].update(date=5), "date 5 is not a string"),
        (lambda d: d["env"].update(gpu=3), "gpu 3 is not a string or null"),
    ],
)
def test_a_field_of_the_wrong_kind_is_refused_naming_the_file_and_field(tmp_path, spoil, message):
    """Each reached the chart or a table and ended in a traceback (matplotlib's log scale, a sort, a hash)."""
    path = _spoiled(tmp_path, spoil)
    with pytest.raises(ResultsError) as err:
        read_rows(path)
    assert str(err.value).startswith(f"{path}: ") and str(err.value).endswith(message), str(err.value)
    proc = _report(str(path), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and message in proc.stderr


STARTUP_OLD = ROOT / "perf/results/startup-llama-3.1-8b-h200-20261202.json"  # before the compile cache
STARTUP_NEW = ROOT / "perf/results/startup-llama-3.1-8b-h200-20261203.json"  # with it


def test_a_startup_file_gives_each_modes_cold_and_warm_ready_and_whether_the_cache_served_it():
    doc = json.loads(STARTUP_NEW.read_text())
    rows = read_startup_rows(STARTUP_NEW)
    ready = {(r["mode"], r["start"]): r["ready_s"] for r in doc["rows"]}
    assert [r.mode for r in rows] == list(dict.fromkeys(r["mode"] for r in doc["rows"]))
    for row in rows:
        assert (row.cold_ready_s, row.warm_ready_s) == (ready[row.mode, "cold"], ready[row.mode, "warm"])
    hits = {r["mode"]: r["compile_cache_hits"] > 0 for r in doc["rows"] if r["start"] == "warm"}
    assert {r.mode: r.warm_hit for r in rows} == hits and not hits["breakable"] and hits["no_inductor"]
    assert {r.warm_hit for r in read_startup_rows(STARTUP_OLD)} == {None}  # no such field before the cache
    assert read_startup_rows(STEP_NEW) is None  # a latency file is not a start-up file


def test_the_report_puts_each_modes_cold_and_warm_start_beside_the_latencies_newest_run_first(tmp_path):
    pytest.importorskip("matplotlib")
    proc = _report(str(STARTUP_NEW), str(STARTUP_OLD), str(STEP_NEW), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "report.md").read_text()
    assert "| llama-3.1-8b | NVIDIA H200 | decode step B=8 |" in text and "## Cold and warm start" in text
    newest_row = next(r for r in read_startup_rows(STARTUP_NEW) if r.mode == "no_inductor")
    cold_warm = text.split("## Cold and warm start")[1]  # the step file's start-up table has the mode too
    line = next(l for l in cold_warm.splitlines() if l.startswith("| llama-3.1-8b | NVIDIA H200 | no_inductor |"))
    assert line.split(" | ")[3:5] == [f"{newest_row.cold_ready_s:.2f}", f"{newest_row.warm_ready_s:.2f}"]
    assert cold_warm.count("| llama-3.1-8b | NVIDIA H200 | no_inductor |") == 1
    assert str(STARTUP_NEW.relative_to(ROOT)) in text or str(STARTUP_NEW) in text


def test_start_up_files_alone_make_a_report_without_a_chart(tmp_path):
    proc = _report(str(STARTUP_NEW), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    assert "## Cold and warm start" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "latency.png").exists()


def test_a_start_with_config_overrides_is_its_own_row_named_with_them(tmp_path):
    """Inductor's graph partition timed with ``-O.use_inductor_graph_partition=true`` is another row than the
    plain inductor mode's, not a newer run of it that hides it."""
    doc = json.loads(STARTUP_NEW.read_text())
    doc["settings"]["compilation_config_overrides"] = {"use_inductor_graph_partition": True}
    doc["env"]["date"] = "2027-01-01T00:00:00+00:00"  # newer than STARTUP_NEW
    partition = tmp_path / "partition.json"
    partition.write_text(json.dumps(doc))
    rows = newest(read_startup_rows(STARTUP_NEW) + read_startup_rows(partition))
    labels = [r.label for r in rows if r.mode == "inductor"]
    assert sorted(labels) == ["inductor", 'inductor -O {"use_inductor_graph_partition":true}'], labels
    doc["settings"]["compilation_config_overrides"] = ["use_inductor_graph_partition"]
    partition.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match="compilation_config_overrides .* is not a dict$"):
        read_startup_rows(partition)


def test_a_start_up_file_with_a_mode_missing_its_warm_start_is_one_line_naming_it(tmp_path):
    doc = json.loads(STARTUP_NEW.read_text())
    doc["rows"] = [r for r in doc["rows"] if (r["mode"], r["start"]) != ("inductor", "warm")]
    broken = tmp_path / "startup.json"
    broken.write_text(json.dumps(doc))
    proc = _report(str(broken), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"{broken}: mode 'inductor' has starts ['cold']; expected cold and warm" in proc.stderr


def test_the_newest_latency_and_start_up_rows_are_the_later_instants_whatever_the_time_zone():
    """bench_latency and bench_startup record local time with its offset: 20:00 at UTC-5 ran after 23:00 UTC."""
    early, late = "2026-12-04T23:00:00+00:00", "2026-12-04T20:00:00-05:00"
    row = read_rows(GENERATE)[0]
    rows = [dataclasses.replace(row, date=late, latency_s=2.0), dataclasses.replace(row, date=early, latency_s=1.0)]
    assert [r.latency_s for r in newest(rows)] == [2.0]
    start = read_startup_rows(STARTUP_NEW)[0]
    starts = [dataclasses.replace(start, date=late, warm_ready_s=2.0), dataclasses.replace(start, date=early)]
    assert [r.warm_ready_s for r in newest(starts)] == [2.0]


def test_a_date_that_is_not_iso_8601_is_one_line_naming_it(tmp_path):
    doc = json.loads(GENERATE.read_text())
    doc["env"]["date"] = "last Tuesday"
    path = tmp_path / "dated.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ResultsError, match=r"date 'last Tuesday' is not an ISO 8601 date$"):
        read_rows(path)
