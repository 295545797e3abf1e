"""What the command lines (``bench_latency``, ``report``, the perf suite's options) share: an argparse whose
errors are one line, and the thread bound. Imports no torch (``--help`` must stay fast)."""

from __future__ import annotations

import argparse
import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``): the
    most intra-op threads a benchmark takes. More only oversubscribe the cores, which swings latencies
    tenfold on a 2-core machine (perf/NOTES.md, "CPU threads"), or, far above, exhausts the OS's threads."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line (``PROG: error: ...``) without the usage block above it; exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")
