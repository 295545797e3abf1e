"""The per-rule report: what ``--conformance-report`` writes, and ``python -m conformance.report`` side by side."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conformance import forked
from conformance.report import side_by_side

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference

RULE = "test_config.py::test_none_gives_the_defaults"


@pytest.mark.slow
def test_a_saved_report_has_each_rules_outcomes_and_what_made_it(tmp_path):
    path = tmp_path / "report.json"
    cmd = [sys.executable, "-m", "pytest", f"conformance/{RULE}", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    proc = forked.run([*cmd, f"--conformance-report={path}"])
    assert proc.returncode == 0, proc.stdout[-2000:]
    doc = json.loads(path.read_text())
    assert doc["implementation"] == "reference"
    assert doc["rules"] == {RULE: {"passed": 1}}
    assert doc["tests"] == {f"conformance/{RULE}": "passed"}
    assert doc["date"].startswith("20") and RULE in doc["command"]


def test_reports_side_by_side_have_a_cell_per_rule_and_report_and_column_totals():
    ours = {
        "implementation": "a",
        "torch": "2.11",
        "cuda_device": "H200",
        "date": "2026-12-01T12:00:00+00:00",
        "rules": {"x.py::r1": {"passed": 2}},
    }
    theirs = {
        "implementation": "b",
        "torch": "2.13",
        "cuda_device": None,
        "date": "2026-11-30T08:00:00+00:00",
        "rules": {"x.py::r1": {"failed": 1, "skipped": 1}, "x.py::r2": {"xfailed": 1}},
    }
    lines = side_by_side([ours, theirs]).splitlines()
    assert lines[0] == "| rule | a (H200, torch 2.11, 2026-12-01) | b (cpu, torch 2.13, 2026-11-30) |"
    assert lines[2:] == [
        "| `x.py::r1` | 2/0/0/0 | 0/1/1/0 |",
        "| `x.py::r2` | - | 0/0/0/1 |",
        "| **all** | 2/0/0/0 | 0/1/1/1 |",
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "text, why",
    [
        ("[1, 2]", "no 'rules' object"),
        ('{"rules": {}}', "no 'implementation' string"),
        ('{"implementation": "a", "torch": "2", "rules": {"x": [1]}}', "a rule's counts are not {outcome: n}: [1]"),
    ],
)
def test_a_file_that_is_not_a_report_is_one_usage_line(tmp_path, text, why):
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    proc = forked.run([sys.executable, "-m", "conformance.report", str(bad)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m conformance.report: error: "), proc.stderr
    assert f"{bad}: not a conformance report ({why})" in lines[0]


@pytest.mark.slow
def test_a_run_that_selects_nothing_still_writes_its_report_over_an_older_one(tmp_path):
    path = tmp_path / "report.json"
    path.write_text('{"stale": true}')
    cmd = [sys.executable, "-m", "pytest", "conformance/test_config.py", "-q", "-p", "no:cacheprovider"]
    env = {k: v for k, v in os.environ.items() if k != "REFERENCE_ALLOW_EMPTY_SELECTION"}  # tox -e gpu sets it
    proc = forked.run([*cmd, "-p", "no:xdist", "-k", "no_such_test", f"--conformance-report={path}"], env=env)
    assert proc.returncode == 5  # pytest: no tests ran
    assert json.loads(path.read_text())["rules"] == {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, message",
    [
        ("no-such-folder/report.json", "its folder does not exist"),
        (".", "is a folder; give a file path"),  # was a traceback after the whole run, the report lost
        ("/proc/report.json", "cannot write it"),  # a folder that takes no files, even as root
    ],
    ids=["missing_folder", "a_folder", "unwritable"],
)
def test_a_report_path_that_cannot_take_the_report_is_refused_before_any_test_runs(tmp_path, where, message):
    path = tmp_path / where
    cmd = [sys.executable, "-m", "pytest", "conformance/test_config.py", "-q", "-p", "no:cacheprovider"]
    proc = forked.run([*cmd, f"--conformance-report={path}"])
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]  # pytest: usage error
    assert message in proc.stderr and "passed" not in proc.stdout


FAILING = "test_config.py::test_a_maximum_that_is_not_a_multiple_of_8_is_kept"  # fails under the fault below


def _run_with_a_failure(*extra: str) -> str:
    """stdout of a run of one failing and one passing rule (the fault largest-capture-size-dropped planted)."""
    cmd = [sys.executable, "-m", "pytest", f"conformance/{FAILING}", f"conformance/{RULE}", "-q", "-p",
           "no:cacheprovider", "-p", "no:xdist", "--impl", "fault:largest-capture-size-dropped", *extra]  # fmt: skip
    proc = forked.run(cmd)
    assert proc.returncode == 1, proc.stdout[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_the_summary_lists_the_failing_rules_and_the_totals_and_the_whole_table_on_request():
    out = _run_with_a_failure()
    assert f"0    1    0    0  {FAILING}" in out  # the failing rule, with its counts
    assert RULE not in out.split("conformance: fault")[-1]  # a passing rule is left out of the summary
    assert "2 rules: 1 passed, 1 failed, 0 skipped, 0 xfailed (--conformance-table lists every rule)" in out
    assert f"1    0    0    0  {RULE}" in _run_with_a_failure("--conformance-table")


@pytest.mark.slow
def test_a_failure_report_holds_no_empty_torch_trace_log_lines():
    """torch's structured-trace logger logs empty DEBUG records while Dynamo compiles; captured, they buried
    each failure's report under a hundred lines."""
    test = "conformance/test_structure.py::test_level2_traces_once_for_every_size[use_inductor=False]"
    cmd = [sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "--impl", "fault:token-dimension-not-dynamic"]  # fmt: skip
    proc = forked.run(cmd)
    assert proc.returncode == 1 and "Captured log call" not in proc.stdout, proc.stdout[-3000:]


@pytest.mark.slow
def test_a_perf_run_prints_no_conformance_summary(tmp_path):
    cmd = [sys.executable, "-m", "pytest", "perf", "-k", "prefill and eager", "--benchmark-disable", "-q", "-p",
           "no:cacheprovider", f"--benchmark-storage=file://{tmp_path}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    proc = forked.run(cmd, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "conformance:" not in proc.stdout, proc.stdout[-2000:]
