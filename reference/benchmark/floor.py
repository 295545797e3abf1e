"""The hardware floor of a decode step: bytes of weights read per step / memory bandwidth.

One bandwidth probe and one figure for the whole project (the benchmark CLI and perf/ both use
:func:`floor_bandwidth`):

* the probe, :func:`measure_copy_bandwidth`: a device-to-device copy of 1 GiB (far above L2), timed with
  CUDA events, counting bytes read plus bytes written; the median of several copies;
* on an H200, the floor uses the project's figure ``H200_BANDWIDTH`` instead of the day's probe, which
  moves by a percent or two between runs (perf/NOTES.md, "The floor"): targets and results stay
  comparable across days. Both are recorded with every result. Any other GPU uses its probe.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

# The project's H200 figure, B/s (perf/NOTES.md, "The floor": measured with measure_copy_bandwidth).
H200_BANDWIDTH = 4.23e12
COPY_BYTES = 2**30
PROBE_METHOD = f"device-to-device copy of {COPY_BYTES} bytes, (read + written bytes) / time, median of copies"


@dataclass(frozen=True)
class Bandwidth:
    """The memory bandwidth a floor is computed with.

    Attributes:
        bytes_per_s: the figure the floor uses, B/s.
        source: where ``bytes_per_s`` comes from, in words.
        measured_bytes_per_s: this run's probe, B/s.
    """

    bytes_per_s: float
    source: str
    measured_bytes_per_s: float


def measure_copy_bandwidth(device: torch.device, nbytes: int = COPY_BYTES, repeats: int = 10) -> float:
    """(bytes read + bytes written) / s of a device-to-device copy of ``nbytes`` on CUDA ``device``,
    the median of ``repeats`` copies after one warm-up copy."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up
    seconds = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(seconds)


def floor_bandwidth(device: torch.device) -> Bandwidth | None:
    """The bandwidth for floors on ``device``: ``H200_BANDWIDTH`` on an H200, else the probe; None on CPU
    (a CPU run has no floor)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    measured = measure_copy_bandwidth(device)
    name = torch.cuda.get_device_name(device)
    if "H200" in name:
        return Bandwidth(H200_BANDWIDTH, f"the project's H200 figure ({PROBE_METHOD}; perf/NOTES.md)", measured)
    return Bandwidth(measured, f"measured here on {name}: {PROBE_METHOD}", measured)
