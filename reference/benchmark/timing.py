"""Timing whole calls between device synchronisations, and their summary statistics."""

from __future__ import annotations

import gc
import statistics
import time
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

# calls so far, elapsed and remaining time: a rate means nothing for calls seconds apart
PROGRESS_FORMAT = "{desc}: {n_fmt}/{total_fmt} calls [{elapsed}<{remaining}]"


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    """Free what Python no longer references, and the CUDA caching allocator's unused blocks."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def time_calls(
    fn: Callable[[], Any], device: torch.device, calls: int, label: str | None = None
) -> tuple[list[float], Any]:
    """Run ``fn`` ``calls`` times, each timed between device synchronisations; returns (seconds per call,
    the last call's result). Warm-up calls are timed too: callers drop the first times. With ``label``, a
    progress bar on stderr (a terminal) counts the calls (with elapsed and remaining time, no rate)."""
    times, result = [], None
    # on a terminal only (disable=None): carriage-return updates would garble a log
    bar = tqdm(
        range(calls), desc=label, disable=True if label is None else None, leave=False, bar_format=PROGRESS_FORMAT
    )
    for _ in bar:
        sync(device)
        start = time.perf_counter()
        result = fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return times, result


def latency_stats(times: list[float]) -> dict[str, float]:
    """avg, p50 and p90 (linear interpolation between order statistics) of ``times``, seconds."""
    if len(times) == 1:
        return {"avg": times[0], "p50": times[0], "p90": times[0]}
    deciles = statistics.quantiles(times, n=10, method="inclusive")
    return {"avg": statistics.fmean(times), "p50": statistics.median(times), "p90": deciles[8]}
