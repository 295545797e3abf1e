"""``python -m MODULE ARGS`` run in a fork of one preloaded server process instead of a fresh interpreter.

The suite starts many short Python processes of its own tools: every CPU fault's pytest run
(conformance/faults/run.py), and the tests of the suite's plugins and CLIs (the report, the markers, the
selection, the scheduling), each a pytest run or a ``python -m conformance.…`` of its own. A fresh interpreter
imports torch, transformers, Dynamo, Inductor and the reference first: 4-5 s of a fault's 5 s on a 2-core Intel
machine, 9-10 s on a 2-core AMD EPYC (2026-12-06). :func:`run` forks a server that has imported them once
(multiprocessing's ``forkserver``, :data:`PRELOAD`); the server runs no torch op, so no thread pool exists to
be broken by the fork. The server's first import (conformance/nvml_device_check.py) has torch count CUDA devices
through NVML there, so the preload's questions about CUDA leave it uninitialised and a child may use the device
(where NVML cannot count them, the server is marked after all, and each child execs a fresh interpreter);
with torch's default check the children failed ("Cannot re-initialize CUDA in forked subprocess": five tests of
the report and the perf run, H100, 2026-12-06), and until 2026-12-07 a CUDA machine started fresh interpreters
instead (a fault's run there was 13-18 s, perf/NOTES.md v47).

What a fork keeps that a fresh interpreter would not: whatever the server's modules read from the environment
when they were imported (Hugging Face's ``HF_HUB_OFFLINE``, Inductor's ``TORCHINDUCTOR_*``; of the child's
environment, ``OMP_NUM_THREADS`` and ``TORCHINDUCTOR_COMPILE_THREADS`` are applied where it sets them, else the
server's counts stay); the server's ``sys.path`` and its modules, from the server's tree whatever the working
folder (``PYTHONPATH`` and Python's other start-up variables are not read again); and the end of a forked
child (``os._exit`` after Python's own streams are flushed: no ``atexit`` handlers run). The inherited objects
are frozen (``gc.freeze``): the child's garbage collections scan only what it made. A test of behaviour that
rests on a fresh interpreter (a variable read at import, a process killed mid-way, a cold start) starts one with
``subprocess`` instead. Importing this module sets multiprocessing's forkserver preload for the whole process.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import runpy
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

import torch

from conformance import cores

ROOT = Path(__file__).resolve().parents[1]
# What the suite's own processes import before their first test or command (what conftest.py, the conformance
# package, the oracles and the fault catalogue pull in); the server imports them once, after the NVML device check
# (Inductor's import asks torch whether CUDA is there: with the default check no child could use CUDA, H100)
PRELOAD = ["conformance.nvml_device_check", "torch", "torch._dynamo", "torch._inductor.compile_fx",
           "transformers", "pytest", "hypothesis", "conformance.faults.catalogue", "conformance.oracle",
           "reference.engine.llm"]  # fmt: skip
_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(PRELOAD)


def run(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """What ``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, errors="replace",
    timeout=timeout)`` gives, for ``argv = [sys.executable, "-m", MODULE, *ARGS]``, run in a fork of the
    preloaded server.

    Args:
        env: the child's whole environment (``os.environ`` when None).
        timeout: seconds; past them the child is killed.
    Returns:
        ``returncode`` as Python's: a ``SystemExit``'s code, 1 after an uncaught exception (its traceback in
        ``stderr``); ``stdout`` and ``stderr`` apart, as text.
    Raises:
        ValueError: ``argv`` is not ``[sys.executable, "-m", MODULE, ...]``.
        subprocess.TimeoutExpired: the child ran past ``timeout`` (as ``subprocess.run`` raises it).
    """
    return _run_together(_checked(argv), [dict(os.environ if env is None else env)], cwd, timeout)[0]


def run_ranks(
    argv: Sequence[str],
    size: int,
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path = ROOT,
    timeout: float | None = None,
) -> list[subprocess.CompletedProcess[str]]:
    """What ``torchrun --standalone --nproc-per-node SIZE -m MODULE ARGS`` gives its workers, without torchrun's
    own interpreter: ``size`` children of ``argv`` started at once as :func:`run` starts one, rank ``r`` with the
    variables torch.distributed's ``env://`` start reads (``RANK`` and ``LOCAL_RANK`` r, ``WORLD_SIZE`` and
    ``LOCAL_WORLD_SIZE`` size, ``MASTER_ADDR`` 127.0.0.1, ``MASTER_PORT`` a free port). On a 2-core AMD EPYC a
    torchrun launch of two tiny-model ranks spent 16 of its 18 CPU seconds importing torch in three fresh
    interpreters (2026-12-06). As torchrun does, the first rank to fail ends the others, which would otherwise
    wait in a collective until the timeout.

    Returns:
        each rank's result, as :func:`run`'s (a rank ended that way has returncode -9).
    Raises:
        ValueError: as :func:`run`'s, or ``size`` < 1.
        subprocess.TimeoutExpired: a rank ran past ``timeout`` (every rank is then killed).
    """
    if size < 1:
        raise ValueError(f"size: expected an int >= 1, got {size}")
    with socket.socket() as probe:  # a port free now; rank 0's store binds it a moment later
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    world = {"WORLD_SIZE": str(size), "LOCAL_WORLD_SIZE": str(size), "MASTER_ADDR": "127.0.0.1"}
    world["MASTER_PORT"] = str(port)
    base = dict(os.environ if env is None else env)
    envs = [{**base, **world, "RANK": str(rank), "LOCAL_RANK": str(rank)} for rank in range(size)]
    return _run_together(_checked(argv), envs, cwd, timeout, end_all_on_failure=True)


def _checked(argv: Sequence[str]) -> list[str]:
    argv = list(argv)
    if argv[:2] != [sys.executable, "-m"] or len(argv) < 3:
        raise ValueError(f"argv: expected [sys.executable, '-m', MODULE, ...], got {argv[:3]}")
    return argv


class _Child:
    """One started ``python -m MODULE ARGS``, a fork of the server, its output in two files of ``folder``."""

    def __init__(self, argv: list[str], environ: dict[str, str], cwd: str | Path, folder: Path):
        self.out, self.err = folder / "stdout", folder / "stderr"
        args = (argv[2], argv[3:], environ, str(cwd), str(self.out), str(self.err))
        self._forked = _SERVER.Process(target=_main, args=args)
        self._forked.start()

    def exitcode(self) -> int | None:
        return self._forked.exitcode

    def kill(self) -> None:
        if self.exitcode() is None:
            self._forked.kill()
        self._forked.join()

    def output(self) -> list[str]:
        return [p.read_text(errors="replace") if p.exists() else "" for p in (self.out, self.err)]


def _run_together(
    argv: list[str],
    envs: list[dict[str, str]],
    cwd: str | Path,
    timeout: float | None,
    end_all_on_failure: bool = False,
) -> list[subprocess.CompletedProcess[str]]:
    """``argv`` once per environment of ``envs``, all started at once; each one's result when all have ended."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with tempfile.TemporaryDirectory() as tmp:
        children = []
        try:
            for i, environ in enumerate(envs):
                (Path(tmp) / str(i)).mkdir()
                children.append(_Child(argv, environ, cwd, Path(tmp) / str(i)))
            timed_out = False
            while any(child.exitcode() is None for child in children):
                if end_all_on_failure and any(child.exitcode() not in (None, 0) for child in children):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    timed_out = True
                    break
                time.sleep(0.02)
        finally:  # past the timeout, a rank failed, or the wait interrupted (Ctrl-C): no child outlives the call
            for child in children:
                child.kill()
        results = [subprocess.CompletedProcess(argv, child.exitcode(), *child.output()) for child in children]
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout, output=results[0].stdout, stderr=results[0].stderr)
    return results


def _main(module: str, args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The forked child: ``python -m MODULE ARGS`` in ``cwd`` with ``env`` as its environment, its output in
    files (first, so that every error below is in them)."""
    from torch._inductor import config as inductor_config  # imported by the server already: a look-up

    # the inherited heap is never garbage here: frozen, no collection of the child scans it (pytest's two at its
    # end cost 0.5 s over that heap, a third of a short run: a 2-core AMD EPYC, 2026-12-06)
    gc.freeze()
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    _start_afresh_if_cuda_is_unusable(module, args, env, cwd)
    os.environ.clear()
    os.environ.update(env)
    threads, compile_threads = cores.thread_counts(env)  # a bad count raises its one line into stderr
    if threads is not None:
        torch.set_num_threads(threads)
    if compile_threads is not None:
        inductor_config.compile_threads = compile_threads
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # as -m puts the working folder first
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _start_afresh_if_cuda_is_unusable(module: str, args: list[str], env: dict[str, str], cwd: str) -> None:
    """Where the server was marked for CUDA after all (its NVML count failed, as with MIG devices or no NVML
    library, and torch asked the runtime), this child could not use CUDA: it becomes a fresh interpreter in
    place (``exec``: same process, same output files), as ``subprocess.run`` would start it. Else nothing."""
    if torch.cuda._is_in_bad_fork():
        os.chdir(cwd)
        os.execve(sys.executable, [sys.executable, "-m", module, *args], env)

