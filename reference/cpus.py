"""The CPUs this process may run on: one answer for the CLIs' thread counts and the kernel warm-up's compile pool.
Imports nothing but the standard library (the CLIs' ``--help`` imports it without torch)."""

from __future__ import annotations

import os


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``, else 1). A
    container or ``taskset`` may allow fewer than the machine has; more threads than this only oversubscribe the
    cores, which swings latencies tenfold on a 2-core machine (perf/NOTES.md, "CPU threads")."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
