"""A process's share of the cores, taken here and passed on to the processes it starts.

Test runs here run side by side: xdist's workers, the fault catalogue's jobs, the torch-native peer's shards.
Each of them starts more processes (a pytest run of its own, torchrun, Inductor's compile workers), and each
of those, left alone, sizes itself for every core of the machine: torch's intra-op threads
(``OMP_NUM_THREADS``) and Inductor's pool of compile workers (``compile_threads``, default
``min(32, cores)``: that many subprocesses, each importing torch, started on a process's first Inductor
compile). On the H200 host's 16 cores, eight workers and four peer shards started up to 12 such pools.
A share of 1 compiles in the process itself, with no pool.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping

import torch

from reference.cpus import COMPILE_THREADS, thread_counts


def shared(threads: int, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a process started with ``environ`` ``threads`` threads: ``OMP_NUM_THREADS``,
    and ``TORCHINDUCTOR_COMPILE_THREADS`` unless ``environ`` sets it (a user's 1, to debug, is kept)."""
    return {"OMP_NUM_THREADS": str(threads), COMPILE_THREADS: environ.get(COMPILE_THREADS, str(threads))}


def refuse_bad_counts(program: str) -> None:
    """Exit with status 2 and one line, ``PROGRAM: THE ERROR``, when :func:`thread_counts` refuses this
    process's environment. Programs call it before anything imports Inductor."""
    try:
        thread_counts(os.environ)
    except ValueError as err:
        print(f"{program}: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def take_share(threads: int) -> None:
    """This process runs on ``threads`` threads (torch's intra-op threads, Inductor's compile workers) and
    the processes it starts inherit the same through ``os.environ``. Call it before the first Inductor
    compile: a pool already started keeps its size."""
    from torch._inductor import config as inductor_config

    variables = shared(threads, os.environ)
    os.environ.update(variables)
    torch.set_num_threads(threads)
    inductor_config.compile_threads = int(variables[COMPILE_THREADS])
