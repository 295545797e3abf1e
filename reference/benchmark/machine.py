"""What a benchmark ran on, recorded with its results: CPU model, threads, load, GPU and its clocks, and
the commit of the code it ran.

A latency means little without the state of the machine that gave it: a busy host (load average), a
thread count that differs between runs (CPU runs swing tenfold with it on a 2-core machine), or a GPU
whose SM clock sits below its maximum all move numbers that look like the code's.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Iterable

import torch

from reference.ops import dependent_launch

_CLOCKS = "clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem"
# A benchmark's intra-op threads on a CPU unless told otherwise: the CPU runs time the tiny presets, which
# gain nothing from more threads, while a pool wider than the cores left free swings latencies several-fold
# (perf/NOTES.md, "CPU threads").
DEFAULT_CPU_THREADS = 1


def benchmark_threads(device: torch.device, threads: int | None) -> int:
    """The intra-op thread count a benchmark on ``device`` runs with: ``threads`` if given, else
    ``DEFAULT_CPU_THREADS`` on a CPU and torch's own count on CUDA (where the host only launches kernels)."""
    if threads is not None:
        return threads
    return DEFAULT_CPU_THREADS if device.type == "cpu" else torch.get_num_threads()


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_clocks(device: torch.device) -> dict[str, int] | None:
    """Current and maximum SM and memory clocks of ``device`` in MHz, from nvidia-smi; None without it."""
    if device.type != "cuda" or shutil.which("nvidia-smi") is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    cmd = ["nvidia-smi", f"--query-gpu={_CLOCKS}", "--format=csv,noheader,nounits", f"--id={index}"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout
        values = [int(v) for v in out.strip().split(",")]
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return dict(zip(("sm_mhz", "mem_mhz", "max_sm_mhz", "max_mem_mhz"), values))


def machine_info(device: torch.device) -> dict:
    """``{"cpu", "cpu_count", "threads" (torch intra-op), "load_avg" (1, 5, 15 min), "gpu", "gpu_clocks",
    "dependent_launch"}``: the last, whether the custom ops' kernels launch with PDL on ``device``
    (:mod:`reference.ops.dependent_launch`), so an A/B of ``REFERENCE_PDL`` is told apart in the results."""
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "gpu_clocks": gpu_clocks(device),
        "dependent_launch": dependent_launch.enabled(device),
    }


# Where each compiler's modules live, relative to torch's package folder: one module of each that a start imports
# (Dynamo's when `reference` is imported, Inductor's at its first compile or artifact load).
COMPILER_MODULES = {"dynamo": "_dynamo/convert_frame.py", "inductor": "_inductor/compile_fx.py"}


def bytecode_at_hand(compilers: Iterable[str]) -> bool:
    """Whether Python finds bytecode for each of ``compilers``' modules (keys of ``COMPILER_MODULES``), beside
    their sources or under ``PYTHONPYCACHEPREFIX`` (``sys.pycache_prefix``).

    Where it does not, a fresh process compiles those sources again as it imports them: only the first one where
    the bytecode can be written, every one where it cannot (an image installed without ``__pycache__`` whose
    site-packages is read-only). On the H100 image a warm ``inductor`` start's first artifact load took 1.44 s of
    Inductor's imports without bytecode (perf/NOTES.md v40, v41).

    Raises:
        KeyError: a name that is not a key of ``COMPILER_MODULES``.
    """
    folder = Path(torch.__file__).parent
    paths = [folder / COMPILER_MODULES[name] for name in compilers]
    return all(os.path.exists(importlib.util.cache_from_source(str(path))) for path in paths)


def source_commit(root: Path) -> str:
    """The commit of the code under ``root``: ``REFERENCE_COMMIT`` if set (a copied tree may carry a stale
    ``.git`` of another commit: the H200's copy named the session's first commit), else git's checked-out
    commit (``+dirty`` with uncommitted changes to tracked files), else ``"unknown"``."""
    if os.environ.get("REFERENCE_COMMIT"):
        return os.environ["REFERENCE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return head.stdout.strip() + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
