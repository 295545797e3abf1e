"""The per-rule summary of a conformance run (rule = test function), printed and, with
``--conformance-report PATH``, written as JSON with every test's outcome."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
import torch

# The implementation under test, loaded from --impl by the root conftest.py.
IMPLEMENTATION = pytest.StashKey[object]()


def rule_of(nodeid: str) -> str:
    """``module.py::test_name`` without its parameters: one rule of the suite."""
    return nodeid.split("[", 1)[0].removeprefix("conformance/")


class ConformanceReport:
    """Collects every test's outcome (on the xdist controller too) and prints / writes the per-rule table."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.outcomes: dict[str, str] = {}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            known = report.outcome == "skipped" and hasattr(report, "wasxfail")  # a known finding, xfailed
            self.outcomes[report.nodeid] = "xfailed" if known else report.outcome
        elif report.when == "teardown" and report.outcome == "failed":
            self.outcomes[report.nodeid] = "failed"

    def pytest_terminal_summary(self, terminalreporter):
        if not self.outcomes or hasattr(self.config, "workerinput"):
            return
        impl = self.config.stash[IMPLEMENTATION]
        rules: dict[str, Counter] = defaultdict(Counter)
        for nodeid, outcome in self.outcomes.items():
            rules[rule_of(nodeid)][outcome] += 1
        terminalreporter.section(f"conformance: {impl.name}, per rule (passed / failed / skipped / xfailed)")
        for rule in sorted(rules):
            c = rules[rule]
            counts = " ".join(f"{c[k]:4d}" for k in ("passed", "failed", "skipped", "xfailed"))
            terminalreporter.write_line(f"{counts}  {rule}")
        path = self.config.getoption("conformance_report")
        if path:
            doc = {
                "implementation": impl.name,
                "capabilities": sorted(impl.capabilities),
                "torch": torch.__version__,
                "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
                "rules": {rule: dict(rules[rule]) for rule in sorted(rules)},
                "tests": dict(sorted(self.outcomes.items())),
            }
            with open(path, "w") as f:
                json.dump(doc, f, indent=2)
            terminalreporter.write_line(f"conformance report: {path}")
