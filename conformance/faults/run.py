"""Running the suite against one fault, in a fresh process: what the CLI and conformance/test_faults.py share.

:func:`run_fault` runs ``pytest conformance --impl fault:ID -k TESTS -x`` (gpu tests deselected on
``cpu``; conformance/test_faults.py, which runs this very function, ignored) and reads the first failing
test from its JUnit XML. Only a test that *failed* catches a fault: an error (a fixture, a set-up, the
plant itself breaking) or a run that selects nothing leaves it uncaught, with the reason.
:func:`selected_tests` collects, in one process, the tests each fault's ``-k`` expression selects; given
them, a fault's run collects only their files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Sequence
from xml.etree import ElementTree

from conformance.faults.fault import Fault

ROOT = Path(__file__).resolve().parents[2]
SELF = "conformance/test_faults.py"  # runs run_fault itself: never part of a fault's run


def _pytest(device: str, *args: str, paths: Sequence[str] = ("conformance",)) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    cmd += [f"--ignore={SELF}", *args]
    return cmd + (["-m", "not gpu"] if device == "cpu" else [])


def _environment(device: str, jobs: int) -> dict[str, str]:
    env = {**os.environ, "REFERENCE_REQUIRE_CUDA": "1" if device == "cuda" else "0"}
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))  # share the cores
    return env


def run_fault(
    fault: Fault, device: str, jobs: int = 1, selected: Sequence[str] | None = None
) -> tuple[str | None, str]:
    """Run the fault's tests; returns (the first test that failed, or None; a note saying why not).

    Args:
        jobs: faults running at once, which share the machine's cores (``OMP_NUM_THREADS`` unless set).
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
        cmd = _pytest(device, *args, paths=paths)
        proc = subprocess.run(cmd, cwd=ROOT, env=_environment(device, jobs), capture_output=True, text=True)
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


def selected_tests(faults: list[Fault], device: str) -> dict[str, list[str]]:
    """fault id -> the node ids its ``tests`` expression selects on ``device``, from one collection."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "selected.json"
        env = {**_environment(device, 1), "FAULT_SELECTION_OUT": str(out)}
        env["FAULT_SELECTION_IDS"] = ",".join(f.id for f in faults)
        cmd = _pytest(device, "--collect-only", "-p", "conformance.faults.selection_plugin")
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"collection failed (exit {proc.returncode}): {(proc.stdout + proc.stderr)[-2000:]}")
        return json.loads(out.read_text())
