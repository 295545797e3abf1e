"""Running the suite against one fault, in a process of its own: what the CLI and conformance/test_faults.py share.

:func:`run_fault` runs ``pytest conformance --impl fault:ID -k TESTS -x`` (gpu tests deselected on
``cpu``; conformance/test_faults.py, which runs this very function, ignored) and reads the first failing
test from its JUnit XML. Only a test that *failed* catches a fault: an error (a fixture, a set-up, the
plant itself breaking) or a run that selects nothing leaves it uncaught, with the reason.
:func:`selected_tests` collects, in one process, the tests each fault's ``-k`` expression selects; given
them, a fault's run collects only their files.

Each run is a fork of one server process per caller that has already imported torch, pytest, transformers,
hypothesis and the reference (conformance/forked.py): those imports were 4-5 s of a fault's 5 s on a 2-core
machine. On ``cuda`` too: the server leaves CUDA uninitialised, so the fork may use it.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple, Sequence
from xml.etree import ElementTree

from conformance import cores, forked
from conformance.faults.fault import Fault

SELF = "conformance/test_faults.py"  # runs run_fault itself: never part of a fault's run


def _pytest_args(device: str, *args: str, paths: Sequence[str] = ("conformance",)) -> list[str]:
    """The arguments of a pytest run of the suite on ``device`` (without ``python -m pytest``). Asserts stay as
    written (``--assert=plain``): a fault's verdict is which test failed, not its message, and rewriting the
    modules again in every run (no bytecode cache under ``PYTHONDONTWRITEBYTECODE``, as on CI's machines) was
    0.4 s of a fault's 1.5 s and 6 of the selection's 17 s on a 2-core AMD EPYC (2026-12-06). What it costs: a
    survived fault's note shows a failed assert without its operands (rerun its tests with pytest for them).
    No test of the suite reads an assert's rewritten message (no ``pytest.raises(AssertionError)``)."""
    argv = [*paths, "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "--assert=plain", f"--ignore={SELF}", *args]
    return argv + (["-m", "not gpu"] if device == "cpu" else [])


def _command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *argv]


def _environment(device: str, jobs: int) -> dict[str, str]:
    # PYTEST_XDIST_*: a run started from an xdist worker (test_faults.py) is a session of its own, not a worker
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["REFERENCE_REQUIRE_CUDA"] = "1" if device == "cuda" else "0"
    usable = len(os.sched_getaffinity(0))  # the cores this process may use (taskset, a container's cpuset)
    for name, value in cores.shared(max(1, usable // jobs), env).items():
        env.setdefault(name, value)  # share them (a share the caller set is kept)
    return env


def run_fault(
    fault: Fault, device: str, jobs: int = 1, selected: Sequence[str] | None = None
) -> tuple[str | None, str]:
    """Run the fault's tests; returns (the first test that failed, or None; a note saying why not).

    Args:
        jobs: faults running at once, which share the machine's cores (``OMP_NUM_THREADS`` and Inductor's
            compile workers, conformance/cores.py, unless set).
        selected: the node ids the fault's ``-k`` expression selects (:func:`selected_tests`), when known:
            only their files are collected, about half of a fault's run on a CPU (the ``-k`` still applies).
            None: the whole suite is collected.
    """
    if selected is not None and not selected:
        return None, f"{fault.id}: its -k expression {fault.tests!r} selects no test on {device}"
    paths = ("conformance",) if selected is None else sorted({node.split("::")[0] for node in selected})
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        args = ("-x", "--impl", f"fault:{fault.id}", f"--junitxml={junit}", "-k", fault.tests)
        args += ("--hypothesis-profile=faults",)  # a failure is the verdict; no shrinking of it (conftest.py)
        cmd, env = _command(_pytest_args(device, *args, paths=paths)), _environment(device, jobs)
        proc = forked.run(cmd, env=env)
        failed, errored = _first_failure(junit) if junit.exists() else (None, None)
        if proc.returncode == 1 and failed:
            return failed, ""
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        reason = f"error in {errored}" if errored else f"pytest exit {proc.returncode}"
        return None, f"{fault.id}: {reason}: " + " | ".join(tail)


def _first_failure(junit: Path) -> tuple[str | None, str | None]:
    """(first test that failed, first test that errored) of a JUnit XML report."""
    failed = errored = None
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        if failed is None and case.find("failure") is not None:
            failed = test
        if errored is None and case.find("error") is not None:
            errored = test
    return failed, errored


class Selection(NamedTuple):
    """What :func:`selected_tests` found in one collection.

    Attributes:
        tests: fault id -> the node ids its ``tests`` expression selects.
        long: the node ids among those that carry a marker of a long test (``selection_plugin.LONG_MARKERS``).
    """

    tests: dict[str, list[str]]
    long: frozenset[str]

    def is_long(self, fault_id: str) -> bool:
        """Whether any test the fault ``fault_id`` selects is a long one."""
        return any(node in self.long for node in self.tests[fault_id])


def selected_tests(faults: list[Fault], device: str) -> Selection:
    """The node ids each fault's ``tests`` expression selects on ``device``, from one collection."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "selected.json"
        env = {**_environment(device, 1), "FAULT_SELECTION_OUT": str(out)}
        env["FAULT_SELECTION_IDS"] = ",".join(f.id for f in faults)
        cmd = _command(_pytest_args(device, "--collect-only", "-p", "conformance.faults.selection_plugin"))
        proc = forked.run(cmd, env=env)
        if not out.exists():
            raise RuntimeError(f"collection failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        found = json.loads(out.read_text())
        return Selection(found["selected"], frozenset(found["long"]))
