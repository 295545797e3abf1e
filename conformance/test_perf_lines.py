"""The perf suite prints each benchmark's line when its test ends, not only in the summary at the end, so
a run cut short (a device call's time limit, a crash) keeps the numbers it measured."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference

BENCHMARK_THEN_DEATH = """
import os


def test_a_benchmark(perf_report):
    perf_report("test_a_benchmark", 0.00125, {"tokens_per_s": 6400.0})


def test_the_run_dies(perf_report):
    os._exit(3)  # no summary, no JSON: what a killed run leaves
"""


@pytest.mark.slow
def test_a_run_cut_short_keeps_the_lines_of_the_benchmarks_it_finished(tmp_path):
    (tmp_path / "test_cut_short.py").write_text(BENCHMARK_THEN_DEATH)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "perf.conftest", "-q", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_cut_short.py")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        # stdout is a pipe here, as under tox, `| tee` and CI logs: without PYTHONUNBUFFERED, Python buffers it,
        # and a line not flushed when its test ends dies with the process
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert run.returncode == 3, run.stdout + run.stderr
    assert "test_a_benchmark: 1.250 ms, 6,400 tokens/s" in run.stdout, run.stdout


@pytest.mark.slow
def test_the_back_to_back_row_reads_per_step_in_pytest_benchmarks_table_as_in_its_line(tmp_path):
    """One unit: pytest-benchmark's own table (and ``--benchmark-compare``) and the printed line both give
    the time of one decode step, not of a chain of them."""
    out = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # else nothing is timed
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "perf", "-k", "back_to_back and eager", "-q", "-p", "no:cacheprovider",
         "--benchmark-json", str(out), f"--benchmark-storage=file://{tmp_path / 'benchmarks'}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (bench,) = json.loads(out.read_text())["benchmarks"]
    line = next(x for x in run.stdout.splitlines() if x.startswith(bench["name"] + ":"))
    line_ms = float(re.search(r": ([0-9.]+) ms per step", line).group(1))
    assert bench["stats"]["median"] * 1e3 == pytest.approx(line_ms, abs=1e-3), line
