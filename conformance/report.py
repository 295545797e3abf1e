"""The per-rule summary of a conformance run (rule = test function), printed and, with
``--conformance-report PATH``, written as JSON with every test's outcome.

``python -m conformance.report REPORT.json ...`` puts saved reports side by side as one markdown table
(a column per report: implementation and device; a cell per rule: passed / failed / skipped / xfailed).
"""

from __future__ import annotations

import datetime
import json
import shlex
import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
import torch

from conformance.real_model import VERDICT_PREFIX, verdict_lines
from reference.benchmark.cli import OneLineParser
from reference.benchmark.report import write_whole

# The implementation under test, loaded from --impl by the root conftest.py.
IMPLEMENTATION = pytest.StashKey[object]()
# A test's outcome: a failed set-up or teardown counts as failed, a non-strict xpass as passed.
OUTCOMES = ("passed", "failed", "skipped", "xfailed")


def rule_of(nodeid: str) -> str:
    """``module.py::test_name`` without its parameters: one rule of the suite."""
    return nodeid.split("[", 1)[0].removeprefix("conformance/")


class ConformanceReport:
    """Collects every test's outcome (on the xdist controller too) and prints / writes the per-rule table."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.outcomes: dict[str, str] = {}
        self.real_model: dict[str, dict] = {}  # mode -> the real-model tests' verdict (conformance/real_model.py)

    def pytest_runtest_logreport(self, report):
        for name, value in report.user_properties:
            if name.startswith(VERDICT_PREFIX):
                self.real_model.setdefault(value["mode"], {}).update(value)
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            known = report.outcome == "skipped" and hasattr(report, "wasxfail")  # a known finding, xfailed
            self.outcomes[report.nodeid] = "xfailed" if known else report.outcome
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[report.nodeid] = "failed"

    def pytest_terminal_summary(self, terminalreporter):
        if hasattr(self.config, "workerinput"):
            return  # the xdist controller reports
        impl = self.config.stash[IMPLEMENTATION]
        rules: dict[str, Counter] = defaultdict(Counter)
        for nodeid, outcome in self.outcomes.items():
            if nodeid.startswith("conformance/"):  # a run of perf/ (or of anything else) is not a conformance run
                rules[rule_of(nodeid)][outcome] += 1
        every = self.config.getoption("conformance_table")
        shown = [rule for rule in sorted(rules) if every or rules[rule]["failed"]]
        if rules:
            terminalreporter.section(f"conformance: {impl.name}, per rule (passed / failed / skipped / xfailed)")
        for rule in shown:
            c = rules[rule]
            counts = " ".join(f"{c[k]:4d}" for k in OUTCOMES)
            terminalreporter.write_line(f"{counts}  {rule}")
        if rules:
            totals = sum(rules.values(), Counter())
            terminalreporter.write_line(
                f"{len(rules)} rules: " + ", ".join(f"{totals[k]} {k}" for k in OUTCOMES)
                + ("" if every else " (--conformance-table lists every rule)")
            )  # fmt: skip
        if self.real_model:
            terminalreporter.section("conformance: the real model, per mode (conformance/test_real_gemma3.py)")
            for line in verdict_lines(self.real_model):
                terminalreporter.write_line(line)
        path = self.config.getoption("conformance_report")
        if path:  # written even when nothing ran, so that no older report is mistaken for this run's
            doc = {
                "implementation": impl.name,
                "capabilities": sorted(impl.capabilities),
                "torch": torch.__version__,
                "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "command": shlex.join(sys.argv),
                "cwd": str(self.config.invocation_params.dir),
                "rules": {rule: dict(rules[rule]) for rule in sorted(rules)},
                "tests": dict(sorted(self.outcomes.items())),
                "real_model": self.real_model,
            }
            try:
                write_whole(Path(path), json.dumps(doc, indent=2))
            except OSError as err:  # the path was writable at the start; a disk can fill during the run
                why = err.strerror or err
                terminalreporter.write_line(f"conformance report: cannot write {path} ({why})", red=True)
            else:
                terminalreporter.write_line(f"conformance report: {path}")


def side_by_side(reports: list[dict]) -> str:
    """Markdown table of saved reports: one row per rule of any of them, one column per report.

    A cell is ``passed/failed/skipped/xfailed`` for that rule in that report (``-`` where the report has no
    such rule); the last row sums each column.
    """
    columns = [
        f"{r['implementation']} ({r.get('cuda_device') or 'cpu'}, torch {r['torch']}, {r.get('date', '?')[:10]})"
        for r in reports
    ]
    rules = sorted({rule for r in reports for rule in r["rules"]})
    totals = [Counter() for _ in reports]
    lines = ["| rule | " + " | ".join(columns) + " |", "|---" * (len(reports) + 1) + "|"]
    for rule in rules:
        cells = []
        for report, total in zip(reports, totals):
            counts = report["rules"].get(rule)
            if counts is None:
                cells.append("-")
                continue
            total.update(counts)
            cells.append("/".join(str(counts.get(k, 0)) for k in OUTCOMES))
        lines.append(f"| `{rule}` | " + " | ".join(cells) + " |")
    lines.append("| **all** | " + " | ".join("/".join(str(t[k]) for k in OUTCOMES) for t in totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m conformance.report", description=__doc__.splitlines()[-2])
    parser.add_argument("reports", nargs="+", help="JSON files written by pytest conformance --conformance-report")
    args = parser.parse_args(argv)
    docs = []
    for path in args.reports:
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as err:
            parser.error(f"{path}: not a readable JSON report ({err})")
        if not isinstance(doc, dict) or not isinstance(doc.get("rules"), dict):
            parser.error(f"{path}: not a conformance report (no 'rules' object)")
        missing = [k for k in ("implementation", "torch") if not isinstance(doc.get(k), str)]
        counts = [c for c in doc["rules"].values() if not isinstance(c, dict) or not set(c) <= set(OUTCOMES)]
        if missing or counts:
            what = f"no {missing[0]!r} string" if missing else f"a rule's counts are not {{outcome: n}}: {counts[0]!r}"
            parser.error(f"{path}: not a conformance report ({what})"[:300])
        docs.append(doc)
    print("outcomes per rule: passed/failed/skipped/xfailed; " + ", ".join(args.reports))
    print(side_by_side(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
