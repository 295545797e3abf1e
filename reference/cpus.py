"""The CPUs this process may run on: one answer for the CLIs' thread counts and the kernel warm-up's compile pool;
and the thread-count variables every program of the project checks before torch reads them. Imports nothing but
the standard library (the CLIs' ``--help`` imports it without torch)."""

from __future__ import annotations

import os
from typing import Mapping

COMPILE_THREADS = "TORCHINDUCTOR_COMPILE_THREADS"  # Inductor reads it once, when its config is imported


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``, else 1). A
    container or ``taskset`` may allow fewer than the machine has; more threads than this only oversubscribe the
    cores, which swings latencies tenfold on a 2-core machine (perf/NOTES.md, "CPU threads")."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def thread_counts(environ: Mapping[str, str]) -> tuple[int | None, int | None]:
    """(``OMP_NUM_THREADS``, ``TORCHINDUCTOR_COMPILE_THREADS``) of ``environ`` as ints, None where unset.

    OpenMP's list form (``"4,2"``, threads per nesting level) gives its first count.
    Raises:
        ValueError: one line naming the variable, when one is set to anything but a whole number >= 1 (for
            ``OMP_NUM_THREADS``, a comma-separated list of them), an empty value included. Left alone,
            OpenMP warns of a bad list and ignores it (torch then sizes itself for every core) and Inductor
            raises a bare ``int()`` error from deep inside its import.
    """
    counts = []
    for name in ("OMP_NUM_THREADS", COMPILE_THREADS):
        text = environ.get(name)
        if text is None:
            counts.append(None)
            continue
        parts = text.split(",") if name == "OMP_NUM_THREADS" else [text]
        if not all(p.strip().isascii() and p.strip().isdigit() and int(p) >= 1 for p in parts):
            raise ValueError(f"{name}={text!r}: expected a whole number of threads >= 1, or leave it unset")
        counts.append(int(parts[0]))
    return counts[0], counts[1]
