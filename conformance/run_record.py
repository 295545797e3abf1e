"""``python -m conformance.run_record``: every step of the GPU check, each timed, and a record of the run.

What ``tox -e gpu`` runs. The steps, in this order, each in processes of its own:

1. ``suite``: ``pytest conformance`` on several xdist workers sharing the device (not the fault catalogue,
   not the tests that read the device's free memory);
2. ``device_memory``: those tests, alone on the device;
3. ``faults``: ``python -m conformance.faults`` over every fault of the catalogue visible on the device,
   one fault per process, as many at once as the machine has cores to spare (all but two);
4. ``perf``: one untimed pass over ``perf/`` (``--benchmark-disable``; its run is saved to a scratch
   folder, not ``.benchmarks/``), alongside ``faults``: neither times anything, and on the H200 the 59 s
   of ``perf`` after the 124 s of ``faults`` took ``tox -e gpu`` past its 8 minutes (2026-12-03). Their
   lines come as they are printed, each prefixed with its step's name.

Every step runs even when an earlier one failed (a GPU run is too dear to stop at the first red step);
the exit status is 1 if any step failed. Each step prints its wall time as it ends, and the record
(``--record PATH``, JSON) holds the commit, the device, torch, the CPU count and model (the same GPU's run
took 312 s on one host and over 600 s on another, perf/NOTES.md v47), and per step the command,
its seconds, its exit status and its counts (tests passed / failed / errors / skipped, or faults caught /
survived); a pytest step also has the sum of its tests' seconds and its five slowest tests. Arguments
after ``--`` go to the two pytest runs of the suite (``tox -e gpu -- -k attention``).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from xml.etree import ElementTree

from reference.benchmark.cli import OneLineParser
from reference.benchmark.machine import source_commit
from reference.benchmark.report import write_whole

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest"]
# seconds a step's processes have between SIGTERM and SIGKILL when the run is ended (a test shortens it)
TERM_GRACE_S = 10.0


def _pytest_counts(junit: Path) -> dict[str, int]:
    """passed / failed / errors / skipped of a JUnit XML report (all zero when pytest wrote none)."""
    counts = dict.fromkeys(("passed", "failed", "errors", "skipped"), 0)
    if not junit.exists():
        return counts
    for suite in ElementTree.parse(junit).getroot().iter("testsuite"):
        tests, failed, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        counts["failed"] += failed
        counts["errors"] += errors
        counts["skipped"] += skipped
        counts["passed"] += tests - failed - errors - skipped
    return counts


def _pytest_times(junit: Path, slowest: int = 5) -> tuple[float, list[list]]:
    """(the sum of every test's seconds, the ``slowest`` tests as [node id, seconds], longest first) of a JUnit
    XML report. Over several workers the sum against workers x wall time says how busy they were."""
    cases = [] if not junit.exists() else list(ElementTree.parse(junit).getroot().iter("testcase"))
    times = [(f"{c.get('classname', '').replace('.', '/')}.py::{c.get('name')}", float(c.get("time", 0)))
             for c in cases]  # fmt: skip
    times.sort(key=lambda t: -t[1])
    return round(sum(t for _, t in times), 1), [[node, round(t, 1)] for node, t in times[:slowest]]


def _stages(device: str, scratch: Path, pytest_args: list[str]) -> list[list[tuple[str, list[str]]]]:
    """The steps for ``device`` (``cuda`` or ``cpu``), as (name, command), in stages: the steps of a stage run
    at once, stages one after another."""
    cpus = os.cpu_count() or 1
    # Three workers for four cores, at most 12: a worker waiting on a subprocess it started (the peer's shards,
    # torchrun's launches, the CLIs' runs) leaves its cores idle; on the H200's 16 cores the step used 55-70% of
    # the CPU under 8 workers (perf/NOTES.md v16) and about 75% under 12, in 208 s instead of 325 s (v20)
    workers = str(max(2, min(12, cpus * 3 // 4)))
    jobs = str(max(1, cpus - 2))
    return [
        [("suite", [*PYTEST, "conformance", "-m", "not faults and not device_memory", "-n", workers,
                    "--durations=25", f"--junitxml={scratch / 'suite.xml'}", *pytest_args])],
        [("device_memory", [*PYTEST, "conformance", "-m", "device_memory and not faults",
                            f"--junitxml={scratch / 'device_memory.xml'}", *pytest_args])],
        [("faults", [sys.executable, "-m", "conformance.faults", "--device", device, "--jobs", jobs]),
         ("perf", [*PYTEST, "perf", "--benchmark-disable", f"--benchmark-storage=file://{scratch / 'benchmarks'}",
                   "-q", f"--junitxml={scratch / 'perf.xml'}"])],
    ]  # fmt: skip


def _run_stage(stage: list[tuple[str, list[str]]], scratch: Path) -> list[dict]:
    """Run a stage's steps at once, their output passed through (each line prefixed with its step's name when
    there are several); returns their entries of the record, in the stage's order.

    Each step runs in a process group of its own; if the driver is interrupted or terminated, every group
    is ended whole (its xdist workers, torchrun's processes). A step that cannot start (its program is
    missing) is an entry with exit status 127 and the reason, and the other steps run on.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # lines as they come, also when the run is cut short
    entries: list[dict] = [{"step": name, "command": shlex.join(command)} for name, command in stage]
    procs, readers, printing = [], [], threading.Lock()
    try:
        for (name, command), entry in zip(stage, entries):
            with printing:
                print(f"\n=== {name}: {entry['command']}", flush=True)
            try:
                proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, errors="backslashreplace", start_new_session=True)  # fmt: skip
            except OSError as err:
                entry.update(seconds=0.0, exit=127, error=f"cannot start: {err.strerror or err}")
                with printing:
                    print(f"=== {name}: cannot start ({err.strerror or err}), exit 127", flush=True)
                continue
            procs.append(proc)
            prefix = f"[{name}] " if len(stage) > 1 else ""
            reader = threading.Thread(target=_pass_through, args=(proc, prefix, printing, entry, scratch))
            reader.start()
            readers.append(reader)
        for reader in readers:
            while reader.is_alive():  # join in slices: a SIGTERM must reach the handler in main
                reader.join(timeout=0.5)
    except BaseException:  # Ctrl-C, SIGTERM (see main): no step may outlive the driver
        _end_groups(procs)
        raise
    return entries


def _pass_through(proc: subprocess.Popen, prefix: str, printing: threading.Lock, entry: dict, scratch: Path) -> None:
    """Copy one step's lines to stdout until it exits, then fill in ``entry`` (its part of the record): its
    seconds and exit status always, its counts when they can be read (else ``error`` says why)."""
    name, start, last_lines = entry["step"], time.perf_counter(), []
    try:
        for line in proc.stdout:  # read to the end whatever happens to our stdout, or the step would block on it
            try:
                with printing:
                    sys.stdout.write(prefix + line)
                    sys.stdout.flush()
            except OSError:
                pass
            last_lines = (last_lines + [line.rstrip()])[-5:]
    finally:
        exit_status = proc.wait()
        seconds = time.perf_counter() - start
        entry.update(seconds=round(seconds, 1), exit=exit_status)
    try:
        if name == "faults":
            totals = next((re.fullmatch(r"(\d+) caught, (\d+) survived", l) for l in reversed(last_lines)), None)
            entry["faults"] = {"caught": int(totals[1]), "survived": int(totals[2])} if totals else None
        else:
            entry["tests"] = _pytest_counts(scratch / f"{name}.xml")
            entry["test_seconds"], entry["slowest"] = _pytest_times(scratch / f"{name}.xml")
    except (OSError, ElementTree.ParseError) as err:
        entry["error"] = f"cannot read its counts: {err}"
    with printing:
        print(f"=== {name}: exit {exit_status} in {seconds:.0f} s", flush=True)


def _end_groups(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every step's process group at once, SIGKILL to what is left of them ``TERM_GRACE_S`` later;
    further SIGINT / SIGTERM are ignored meanwhile, so a second Ctrl-C cannot cut the clean-up short."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    for sig, grace in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, 5)):
        alive = [proc for proc in procs if proc.poll() is None]
        for proc in alive:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for proc in alive:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass


def cpu_model() -> str:
    """The host CPU's name: the first ``model name`` of Linux's ``/proc/cpuinfo``, else
    ``platform.processor()``, else ``"unknown"``."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _terminated(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through _run_stage, which ends the steps' processes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, pytest_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    parser = OneLineParser(prog="python -m conformance.run_record", description=__doc__.splitlines()[0])
    parser.add_argument("--record", required=True, metavar="PATH", help="where to write the run record (JSON)")
    args = parser.parse_args(own)
    record_path = Path(args.record)
    if not args.record.strip():
        parser.error("--record: empty; give a file path")
    if not record_path.parent.is_dir():
        parser.error(f"--record {args.record}: its folder does not exist")
    if record_path.is_dir():
        parser.error(f"--record {args.record}: is a folder; give a file path")
    import torch  # here: argument errors stay instant

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if os.environ.get("REFERENCE_REQUIRE_CUDA", "0") not in ("0", "") and device == "cpu":
        parser.error(
            f"REFERENCE_REQUIRE_CUDA={os.environ['REFERENCE_REQUIRE_CUDA']} but torch {torch.__version__} sees no "
            "CUDA device; run on a GPU machine, or set REFERENCE_REQUIRE_CUDA=0 for a CPU rehearsal"
        )
    signal.signal(signal.SIGTERM, _terminated)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        steps = [entry for stage in _stages(device, Path(tmp), pytest_args) for entry in _run_stage(stage, Path(tmp))]
    record = {
        "commit": source_commit(ROOT),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, "-m", "conformance.run_record", *argv]),
        "device": torch.cuda.get_device_name() if device == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model(),
        "steps": steps,
        "total_seconds": round(time.perf_counter() - start, 1),
        "ok": all(step["exit"] == 0 and "error" not in step for step in steps),
    }
    print("\n=== summary")  # printed before the record is written, so a failed write loses neither
    for step in steps:
        counts = step.get("tests") or step.get("faults") or {}
        details = [f"{v} {k}" for k, v in counts.items()] + ([step["error"]] if "error" in step else [])
        print(f"{step['step']:>14}: exit {step['exit']}, {step['seconds']:6.1f} s, " + ", ".join(details))
    print(f"{'total':>14}: {record['total_seconds']:.1f} s, {'ok' if record['ok'] else 'FAILED'}", flush=True)
    try:
        write_whole(record_path, json.dumps(record, indent=2) + "\n")
    except OSError as err:
        print(f"python -m conformance.run_record: cannot write the record {record_path} ({err.strerror or err})")
        return 1
    print(f"=== run record {record_path}", flush=True)
    return 0 if record["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
