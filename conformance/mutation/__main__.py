"""``./run mutate [--resume | --survivors] [--workers N] [MODULE ...]``: mutation testing per module.

The tool is mutmut 3 (the ``mutate`` extra). It was picked over cosmic-ray for speed on a small machine: mutmut
compiles every mutant of a file into one copy of it, switched by an environment variable, and forks each
mutant's test run from a process that has already imported torch and collected the tests, and it runs only
the tests that called the mutated function. cosmic-ray writes each mutant to disk and starts a fresh test
command per mutant, paying torch's import and pytest's collection every time.

For each MODULE (all of them when none is given), in its own directory ``build/mutate/MODULE/``
(``workspace.py``): ``mutmut run`` with one worker (``--workers``), then ``mutmut results``, counted and
written to ``results.json`` and ``RESULTS.md`` here (``summary.py``). A fresh run starts from
nothing; ``--resume`` continues an interrupted one (mutmut keeps the verdicts it reached); ``--survivors``
re-tests only the mutants the last run did not kill (survived, reached by no test, or not checked), after
tests were added. Exit status 2 for bad arguments, 1 when mutmut fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata

from conformance import cores
from conformance.mutation import summary, workspace
from conformance.mutation.modules import MODULES, UnknownModule, resolve

# mutmut's own console entry point; `python -m mutmut` would import its __main__ twice
MUTMUT = [sys.executable, "-c", "import sys; from mutmut.__main__ import cli; sys.exit(cli())"]


def _workers(text: str) -> int:
    if not (text.isascii() and text.isdigit() and int(text) >= 1):
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return int(text)


def _arguments(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="./run mutate", description="Mutation testing with mutmut, per module.")
    parser.add_argument("modules", nargs="*", metavar="MODULE", help=f"one of: {', '.join(MODULES)} (default: all)")
    parser.add_argument("--resume", action="store_true", help="continue the module's last run instead of a fresh one")
    parser.add_argument("--workers", type=_workers, default=1, help="mutants tested at once (default 1)")
    parser.add_argument("--survivors", action="store_true",
                        help="after adding tests: re-test only the mutants the module's last run did not kill "
                             "(survived, reached by no test, not checked); the rest keep their verdicts")  # fmt: skip
    # one line, as every other refusal here; argparse's own error() prints the usage line first
    parser.error = lambda message: parser.exit(2, f"./run mutate: {message}\n")
    args = parser.parse_args(argv)
    # before anything is deleted: each mutant's pytest run would fail on a bad count and count as killed
    cores.refuse_bad_counts("./run mutate")
    try:
        args.modules = resolve(args.modules)
    except UnknownModule as err:
        parser.exit(2, f"./run mutate: {err}\n")
    if args.survivors and args.resume:
        parser.exit(2, "./run mutate: give --resume or --survivors, not both\n")
    if args.survivors:
        never_run = [name for name in args.modules if not (workspace.WORK / name / "mutants").is_dir()]
        if never_run:
            parser.exit(2, f"./run mutate: --survivors: no earlier run of {', '.join(never_run)} to re-test\n")
    return args


def _commit() -> str:
    """The checked-out commit, ``+dirty`` when the package or the tests differ from it."""
    git = ["git", "-C", str(workspace.ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    changes = subprocess.run([*git, "status", "--porcelain", "--", "reference", "conformance"],
                             capture_output=True, text=True).stdout.strip()
    return head + ("+dirty" if changes else "")


def _install_tool() -> None:
    """Install the ``mutate`` extra (mutmut) into this environment unless it is there."""
    if importlib.util.find_spec("mutmut") is None:
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, "--progress-bar", "off", "-e", ".[mutate]"], cwd=workspace.ROOT, check=True)


def _statuses(work, env) -> dict[str, str]:
    output = subprocess.run([*MUTMUT, "results", "--all", "true"], cwd=work, env=env, capture_output=True,
                            text=True, check=True).stdout
    return summary.parse_results(output)


def run_module(name: str, *, fresh: bool, workers: int, survivors: bool = False) -> int:
    """Run mutmut on module ``name`` and record its row; mutmut's exit status. ``survivors``: re-test only
    the mutants the last run left alive (tests only kill more: the killed ones stay killed)."""
    work = workspace.prepare(name, fresh=fresh)
    commit = _commit()  # mutmut copies the sources now: a commit made while it runs is not what it mutated
    # each of the mutants tested at once takes its share of the usable cores (a share the caller set is kept)
    env = {**cores.shared(max(1, len(os.sched_getaffinity(0)) // workers), os.environ), **os.environ}
    # mutmut re-tests the mutants it is given by name, and only those; new tests get their stats first
    # (and the ones not checked yet: a function edited since has new mutants)
    alive = ("survived", "no tests", "not checked")
    names = [n for n, status in _statuses(work, env).items() if status in alive] if survivors else []
    if not survivors or names:
        status = subprocess.run([*MUTMUT, "run", "--max-children", str(workers), *names], cwd=work, env=env).returncode
        if status != 0:
            return status
    row = summary.count(_statuses(work, env), summary.load_equivalent())
    provenance = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "mutmut": metadata.version("mutmut"),
                  "commit": commit}
    summary.record(name, {**provenance, **row})
    print(f"\n{name}: {row['killed']} killed, {row['timeout']} timeout, {row['survived']} survived, "
          f"{row['no tests']} no tests, {row['equivalent']} equivalent: score {100 * row['score']:.1f}%")
    return 0


def main(argv: list[str]) -> int:
    """Run the modules ``argv`` names; the exit status."""
    args = _arguments(argv)
    _install_tool()
    for name in args.modules:
        status = run_module(name, fresh=not (args.resume or args.survivors), workers=args.workers,
                            survivors=args.survivors)
        if status != 0:
            print(f"./run mutate: mutmut failed on module {name} (exit status {status})", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
