"""``python -m MODULE ARGS`` run in a fork of one preloaded server process instead of a fresh interpreter.

The suite starts many short Python processes of its own tools: every CPU fault's pytest run
(conformance/faults/run.py), and the tests of the suite's plugins and CLIs (the report, the markers, the
selection, the scheduling), each a pytest run or a ``python -m conformance.…`` of its own. A fresh interpreter
imports torch, transformers, Dynamo, Inductor and the reference first: 4-5 s of a fault's 5 s on a 2-core Intel
machine, 9-10 s on a 2-core AMD EPYC (2026-12-06). :func:`run` forks a server that has imported them once
(multiprocessing's ``forkserver``, :data:`PRELOAD`); the server runs no torch op, so no thread pool exists to
be broken by the fork. Where torch sees a CUDA device, :func:`run` starts a fresh interpreter instead: there the
server's imports initialise CUDA, and a forked child that needs it again fails ("Cannot re-initialize CUDA in
forked subprocess": five tests of the report and the perf run, H100, 2026-12-06); there the tests, not the
imports, take the time.

What a fork keeps that a fresh interpreter would not: whatever the server's modules read from the environment
when they were imported (Hugging Face's ``HF_HUB_OFFLINE``, Inductor's ``TORCHINDUCTOR_*``; of the child's
environment, ``OMP_NUM_THREADS`` and ``TORCHINDUCTOR_COMPILE_THREADS`` are applied where it sets them, else the
server's counts stay); the server's ``sys.path`` and its modules, from the server's tree whatever the working
folder (``PYTHONPATH`` and Python's other start-up variables are not read again); and the end of a forked
child (``os._exit`` after Python's own streams are flushed: no ``atexit`` handlers run). A test of behaviour that
rests on a fresh interpreter (a variable read at import, a process killed mid-way, a cold start) starts one with
``subprocess`` instead. Importing this module sets multiprocessing's forkserver preload for the whole process.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

import torch

from conformance import cores

ROOT = Path(__file__).resolve().parents[1]
# What the suite's own processes import before their first test or command (what conftest.py, the conformance
# package, the oracles and the fault catalogue pull in); the server imports them once.
PRELOAD = ["torch", "torch._dynamo", "torch._inductor.compile_fx", "transformers", "pytest", "hypothesis",
           "conformance.faults.catalogue", "conformance.oracle", "reference.engine.llm"]  # fmt: skip
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
    preloaded server; where torch sees a CUDA device, that very ``subprocess.run``.

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
    argv = list(argv)
    if argv[:2] != [sys.executable, "-m"] or len(argv) < 3:
        raise ValueError(f"argv: expected [sys.executable, '-m', MODULE, ...], got {argv[:3]}")
    if torch.cuda.is_available():
        return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, errors="replace", timeout=timeout)
    module, args = argv[2], argv[3:]
    environ = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        child = _SERVER.Process(target=_main, args=(module, args, environ, str(cwd), str(out), str(err)))
        child.start()
        try:
            child.join(timeout)
            timed_out = child.exitcode is None
        finally:  # past the timeout, or the wait interrupted (Ctrl-C): no child outlives the call
            if child.exitcode is None:
                child.kill()
                child.join()
        read = [p.read_text(errors="replace") if p.exists() else "" for p in (out, err)]
    if timed_out:
        raise subprocess.TimeoutExpired(argv, timeout, output=read[0], stderr=read[1])
    return subprocess.CompletedProcess(argv, child.exitcode, *read)


def _main(module: str, args: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The forked child: ``python -m MODULE ARGS`` in ``cwd`` with ``env`` as its environment, its output in
    files (first, so that every error below is in them)."""
    from torch._inductor import config as inductor_config  # imported by the server already: a look-up

    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
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
