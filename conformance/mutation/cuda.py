"""``python -m conformance.mutation.cuda [--jobs N] [--only NAMES] [--list]``: the CUDA mutation score.

mutmut cannot reach the code that runs only on CUDA. Triton compiles a ``@triton.jit`` kernel from its source
text, while mutmut switches its mutants at run time through trampolines that Triton cannot compile; and CI has no
GPU to run the CUDA-graph paths. So that code has a hand-written set (conformance/mutation/cuda_mutants.py), run
on a GPU machine: for each mutant, a copy of the tree in a temporary folder, the one edit applied, and the
mutant's test files run there with ``-m MARKER -x`` (their CUDA cases; not the device-memory ones, which need
the device to themselves) in a process of their own, ``--jobs`` mutants at once. An unmutated copy runs each
selection of test files beside them (the first run, 2026-12-03, failed there on a device-memory test that the
mutants' runs disturbed: nothing was counted); if one fails, nothing is counted. Verdicts as
mutmut's: killed (a test failed), survived (every test passed), timeout, no tests (the selection was
empty), other (pytest could not run, or the edit's text is not in the file once). The row goes to
results.json and RESULTS.md as module ``cuda (hand-written)`` (conformance/mutation/summary.py), with the
surviving mutants named; a run of some of them (``--only``) prints its verdicts and records nothing.

Exit status 2 for bad arguments or no CUDA device, 1 when the unmutated tree fails its tests.
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from conformance import cores
from conformance.mutation import summary
from conformance.mutation.cuda_mutants import MUTANTS, Mutant
from conformance.mutation.workspace import LINKED, ROOT
from reference.benchmark.cli import OneLineParser

MODULE = "cuda (hand-written)"  # the row's name in results.json
TREE = (*LINKED, "pyproject.toml")  # what a mutant's copy holds: the package, the tests and what they read
VERDICTS = {0: "survived", 1: "killed", 5: "no tests"}  # pytest's exit status -> verdict; others: "other"
# the CUDA cases, but not those that read the device's free memory: the mutants' runs share the device
MARKER = "gpu and not device_memory"


def copy_tree(into: Path) -> Path:
    """Copy the tree's package, tests and data (``TREE``) into ``into``; returns ``into``."""
    for name in TREE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, into / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
        else:
            shutil.copy2(source, into / name)
    return into


def apply(mutant: Mutant, tree: Path) -> str | None:
    """Make ``mutant``'s edit in ``tree``; None, or why it cannot (its text is not in the file exactly once)."""
    path = tree / mutant.path
    text = path.read_text()
    found = text.count(mutant.old)
    if found != 1:
        return f"{mutant.name}: its text is in {mutant.path} {found} times, expected once"
    path.write_text(text.replace(mutant.old, mutant.new))
    return None


def pytest_command(tests: tuple[str, ...], marker: str) -> list[str]:
    """The pytest run of ``tests`` (selected by ``-m marker``) that judges a mutant: stops at the first failure."""
    return [sys.executable, "-m", "pytest", *tests, "-m", marker, "-x", "-q", "-p", "no:cacheprovider",
            "-p", "no:xdist"]  # fmt: skip


def run_tests(tree: Path, tests: tuple[str, ...], marker: str, jobs: int, timeout: float) -> tuple[str, str]:
    """Run ``tests`` in ``tree``; (verdict, the output's last lines)."""
    # PYTEST_XDIST_*: a run started from an xdist worker is a session of its own; an empty selection must read
    # as one (exit 5), even inside tox -e gpu, which lets its own empty selections pass
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env.pop("REFERENCE_ALLOW_EMPTY_SELECTION", None)
    env["PYTHONPATH"] = str(tree)  # the copy's package, whatever else is installed
    for name, value in cores.shared(max(1, len(os.sched_getaffinity(0)) // jobs), env).items():
        env.setdefault(name, value)
    try:
        run = subprocess.run(pytest_command(tests, marker), cwd=tree, env=env, capture_output=True, text=True,
                             timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return "timeout", f"no verdict after {timeout:.0f} s"
    tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-6:])
    return VERDICTS.get(run.returncode, "other"), tail


def judge(mutant: Mutant | None, tests: tuple[str, ...], marker: str, jobs: int, timeout: float) -> tuple[str, str]:
    """The verdict of ``tests`` on a copy of the tree with ``mutant``'s edit (None: unmutated) and the output's
    last lines (or why the edit did not apply)."""
    with tempfile.TemporaryDirectory(prefix="cuda-mutant-") as folder:
        tree = copy_tree(Path(folder))
        refused = apply(mutant, tree) if mutant is not None else None
        if refused:
            return "other", refused
        return run_tests(tree, tests, marker, jobs, timeout)


def _commit() -> str:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return os.environ.get("REFERENCE_COMMIT", "")[:7] or head.stdout.strip() or "unknown"


def _arguments(argv: list[str]):
    parser = OneLineParser(prog="python -m conformance.mutation.cuda", description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 1) - 2),
                        help="mutants run at once (default: the cores but two)")  # fmt: skip
    parser.add_argument("--only", default=None, help="comma-separated mutant names (default: all; --list names them)")
    parser.add_argument("--list", action="store_true", help="print the mutants' names and what each breaks, and exit")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a mutant's run may take (default 900)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: expected an int >= 1, got {args.jobs}")
    if not 0 < args.timeout <= 86400:  # nan and inf too: subprocess cannot wait for them
        parser.error(f"--timeout: expected seconds in (0, 86400], got {args.timeout}")
    names = [name.strip() for name in args.only.split(",")] if args.only is not None else []
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if args.only is not None and (unknown or "" in names):
        parser.error(f"--only: unknown mutant(s) {unknown or [args.only]}; --list prints the names")
    args.mutants = [m for m in MUTANTS if not names or m.name in names]
    return parser, args


def main(argv: list[str] | None = None) -> int:
    parser, args = _arguments(sys.argv[1:] if argv is None else argv)
    if args.list:
        print("\n".join(f"{m.name}  {m.what}" for m in args.mutants))
        return 0
    import torch  # here: --help, --list and argument errors stay instant

    if not torch.cuda.is_available():
        parser.error(f"torch {torch.__version__} sees no CUDA device; the CUDA mutants run on a GPU machine")
    # the unmutated tree runs each test selection too, side by side with the mutants (a selection takes minutes)
    jobs = [(None, tests) for tests in dict.fromkeys(m.tests for m in args.mutants)]
    jobs += [(m, m.tests) for m in args.mutants]

    def timed(job):
        start = time.perf_counter()
        return (*judge(*job, MARKER, args.jobs, args.timeout), time.perf_counter() - start)

    statuses, unmutated = {}, []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(timed, job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):  # printed as they end: a run cut short keeps them
            (mutant, tests), (verdict, tail, seconds) = futures[future], future.result()
            if mutant is None:  # every test of the selection passes on the unmutated tree
                passed = "passed" if verdict == "survived" else f"did not pass ({verdict})"
                print(f"unmutated tree, {len(tests)} test files: {passed} in {seconds:.1f} s", flush=True)
                if verdict != "survived":
                    unmutated.append(tail)
                continue
            statuses[mutant.name] = verdict
            print(f"{mutant.name} {verdict} in {seconds:.1f} s ({mutant.what})", flush=True)
            if verdict == "other":
                print(tail, file=sys.stderr)
    if unmutated:
        print("the unmutated tree fails its tests; nothing counted:\n" + "\n".join(unmutated), file=sys.stderr)
        return 1
    row = summary.count(statuses, summary.load_equivalent())
    if args.only is not None:  # the results files hold the whole set's row, never a subset's
        print(f"\n--only: {row['killed']} killed, {row['survived']} survived of {row['mutants']}; not recorded")
        return 0
    provenance = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "mutmut": "hand-written",
                  "commit": _commit()}  # fmt: skip
    summary.record(MODULE, {**provenance, **row})
    print(f"\n{MODULE}: {row['killed']} killed, {row['timeout']} timeout, {row['survived']} survived, "
          f"{row['no tests']} no tests, {row['other']} other: score {100 * row['score']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
