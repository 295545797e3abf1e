"""``python -m conformance.faults [--device cpu|cuda]``: run the suite against every faulty implementation.

For each fault of the catalogue visible on the device (``--device cpu``: the CPU-visible faults, gpu tests
deselected; ``cuda``: all of them, gpu tests included) this runs ``pytest conformance --impl fault:ID -k
TESTS -x`` in a fresh process and prints one line, ``FAULT_ID KIND caught TEST_ID`` or ``FAULT_ID KIND
survived``, then ``N caught, M survived``. Exit status 1 if any fault survived. A fault whose tests select
nothing, or whose run errors before any test fails, survives (the reason goes to stderr).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from conformance.faults.catalogue import FAULTS, Fault

ROOT = Path(__file__).resolve().parents[2]


def run_fault(fault: Fault, device: str) -> tuple[str | None, str]:
    """Run the fault's tests; returns (the first test that failed or None, a note for stderr)."""
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "conformance", "-q", "-x", "-p", "no:cacheprovider", "-p", "no:xdist"]
        cmd += ["--impl", f"fault:{fault.id}", f"--junitxml={junit}"]
        if fault.tests:
            cmd += ["-k", fault.tests]
        if device == "cpu":
            cmd += ["-m", "not gpu"]
        env = {**os.environ, "REFERENCE_REQUIRE_CUDA": "1" if device == "cuda" else "0"}
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        failed = _first_failure(junit) if junit.exists() else None
        if proc.returncode == 1 and failed:
            return failed, ""
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        return None, f"{fault.id}: pytest exit {proc.returncode}: " + " | ".join(tail)


def _first_failure(junit: Path) -> str | None:
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            return f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="faults run at once on cpu (default: %(default)s)")
    parser.add_argument("--only", default="", help="comma-separated fault ids (default: every fault for the device)")
    args = parser.parse_args(argv)
    only = {f for f in args.only.split(",") if f}
    unknown = only - {f.id for f in FAULTS}
    if unknown:
        parser.error(f"--only: unknown fault(s) {sorted(unknown)}")
    faults = [f for f in FAULTS if (args.device == "cuda" or f.device == "cpu") and (not only or f.id in only)]
    jobs = 1 if args.device == "cuda" else max(1, args.jobs)
    caught = survived = 0
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for fault, (test, note) in zip(faults, pool.map(lambda f: run_fault(f, args.device), faults)):
            if test:
                caught += 1
                print(f"{fault.id} {fault.kind} caught {test}", flush=True)
            else:
                survived += 1
                print(f"{fault.id} {fault.kind} survived", flush=True)
                print(note, file=sys.stderr)
    print(f"{caught} caught, {survived} survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
