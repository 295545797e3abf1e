"""``python -m conformance.faults [--device cpu|cuda]``: run the suite against every faulty implementation.

For each fault of the catalogue visible on the device (``--device cpu``: the CPU-visible faults, gpu tests
deselected; ``cuda``: all of them, gpu tests included) this runs ``pytest conformance --impl fault:ID -k
TESTS -x`` in a process of its own, collecting only the files of the tests that ``-k`` selects (one
collection finds them; conformance/faults/run.py says how) and prints one line, ``FAULT_ID KIND caught
TEST_ID in S s`` or ``FAULT_ID KIND survived in S s``, then ``N caught, M survived``. Exit status 1 if any fault survived.
A fault whose tests select nothing, or whose run errors before any test fails, survives (the reason goes to
stderr). ``--jobs`` faults run at once, on either device; a fault marked ``alone`` (its test measures the
device's free memory) runs after them, by itself. ``--list`` prints the device's fault ids and runs nothing.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import sys
import time

from conformance.faults.catalogue import FAULTS
from conformance.faults.run import run_fault, selected_tests
from reference.benchmark.cli import OneLineParser


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="python -m conformance.faults", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=2, help="faults run at once (default: %(default)s)")
    parser.add_argument("--only", default=None, help="comma-separated fault ids (default: every fault for the device)")
    parser.add_argument("--list", action="store_true", help="print the device's fault ids (or --only's) and exit")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs: must be at least 1, got {args.jobs}")
    if args.only is not None and not args.only.strip():
        parser.error("--only: empty; give comma-separated ids")
    only = {f.strip() for f in args.only.split(",")} if args.only is not None else set()
    if "" in only:
        parser.error(f"--only: an empty fault id in {args.only!r}; give comma-separated ids")
    unknown = only - {f.id for f in FAULTS}
    if unknown:
        parser.error(f"--only: unknown fault(s) {sorted(unknown)}; --list prints the ids")
    needs_cuda = sorted(f.id for f in FAULTS if f.id in only and f.device == "cuda" and args.device == "cpu")
    if needs_cuda:
        parser.error(f"--only: {needs_cuda} show only on a GPU; run them with --device cuda")
    faults = [f for f in FAULTS if (args.device == "cuda" or f.device == "cpu") and (not only or f.id in only)]
    if args.list:  # what a run would run, on a machine with or without the device
        print("\n".join(f.id for f in faults))
        return 0
    if args.device == "cuda":
        import torch  # here, not at the top: --help and argument errors stay instant

        if not torch.cuda.is_available():
            parser.error(f"--device cuda: torch {torch.__version__} sees no CUDA device; use --device cpu")
    # Longest first, so that no long run starts in the last round and runs on alone (the makespan of a list
    # schedule): the parallel faults' tests start torchrun processes (30 s a fault on the H200, 2026-12-04),
    # then faults that select an Inductor-compiling or slow-marked test (37-47 s), then the rest (12-16 s).
    selection = selected_tests(faults, args.device)  # one collection; each fault's run collects only its files
    shared = sorted(
        (f for f in faults if not f.alone), key=lambda f: (f.kind != "parallel", not selection.is_long(f.id))
    )
    alone = [f for f in faults if f.alone]
    survived = 0

    def timed(fault, jobs):
        start = time.perf_counter()
        return (*run_fault(fault, args.device, jobs, selection.tests[fault.id]), time.perf_counter() - start)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = zip(shared, pool.map(lambda f: timed(f, args.jobs), shared))
        for fault, (test, note, seconds) in itertools.chain(results, ((f, timed(f, 1)) for f in alone)):
            outcome = f"caught {test}" if test else "survived"
            print(f"{fault.id} {fault.kind} {outcome} in {seconds:.1f} s", flush=True)
            if not test:
                survived += 1
                print(note, file=sys.stderr)
    print(f"{len(faults) - survived} caught, {survived} survived")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
