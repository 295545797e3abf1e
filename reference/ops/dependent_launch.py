"""Programmatic dependent launch (PDL) of the custom ops' Triton kernels on Hopper and newer GPUs (issue 24).

Two kernels on one stream run one after the other: the second starts only once the first has finished and its
writes are visible. Inside a decode step's CUDA graph that costs each of its ~200 kernel boundaries the time
between the last block of one kernel ending and the first block of the next one loading at full rate. With PDL
(CUDA 11.8+, compute capability 9.0+: "Programmatic Dependent Launch and Synchronization" in NVIDIA's CUDA C++
Programming Guide), a kernel launched with the programmatic-stream-serialization attribute may be scheduled
while the kernel before it still runs, once every block of that kernel has executed
``griddepcontrol.launch_dependents``; it must then execute ``griddepcontrol.wait``, which returns when the
kernel before it has completed and flushed its writes, before it touches anything that kernel may write or
read. Stream capture records the relation as a programmatic edge of the graph, so replays keep it (the
guide's "PDL in CUDA Graphs"). ``launch_dependents`` is a hint: the next kernel is scheduled once every block
of this one has executed it or exited, so for a grid of several waves not before the last wave. Triton
exposes the two instructions as ``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents`` and the attribute as
the ``launch_pdl`` launch option.

The rule every kernel of :mod:`reference.ops.triton_kernels`, :mod:`reference.ops.graph_attention_kernels` and
:mod:`reference.ops.linear_kernels` follows when launched this way: its first global memory access comes after
``gdc_wait`` (a load, a store or an atomic); the one thing before it is the small-M GEMM's L2 prefetch of its
first weight tile, which returns no data to the program (L2 is the point of coherence, so a prefetch cannot
make a program read a stale value, and no step writes a weight anyway); ``gdc_launch_dependents`` follows the
wait at once. A kernel that waits transitively waits for every kernel before it: the one before it could not
pass its own wait earlier. ``conformance/test_dependent_launch.py`` checks the rule on each kernel's PTX.

Off unless ``REFERENCE_PDL=1``: measured on an H100, it made the 8B generate with the GEMM fusions slower, not
faster, the GEMM's L2 prefetch a part of it (perf/NOTES.md v42 has the figures and the suspects). The switch stays
for the next try: the rule and its checks hold either way.

Importing this module needs no Triton: the runner checks the switch on any machine.
"""

from __future__ import annotations

import functools
import os

import torch

from reference.config import ConfigError

ENV = "REFERENCE_PDL"
MIN_CAPABILITY = (9, 0)  # griddepcontrol: sm_90 and newer
INTERPRETER_ON = ("1", "true", "on", "yes")  # what Triton reads as TRITON_INTERPRET set


@functools.cache
def _capable(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device) >= MIN_CAPABILITY


def switched_on() -> bool:
    """Whether ``$REFERENCE_PDL`` is ``1`` (unset or empty: ``0``, off). The runner and ``LLM`` call it before they
    build anything, so a bad value is one line there and not at a kernel's launch.

    Raises:
        ConfigError: ``$REFERENCE_PDL`` is set to something other than ``0`` or ``1``.
    """
    value = os.environ.get(ENV) or "0"  # set but empty (`VAR=`) reads as unset
    if value not in ("0", "1"):
        raise ConfigError(f"{ENV}: expected '0' or '1', got {value!r}")
    return value == "1"


def enabled(device: torch.device) -> bool:
    """Whether the custom ops' Triton kernels on ``device`` launch with PDL (module doc): on a CUDA device of
    compute capability 9.0 or more, not under Triton's interpreter (``TRITON_INTERPRET=1``), where
    ``$REFERENCE_PDL`` is ``1`` (off by default: module doc). The environment is read at each call (a launch
    reads it; the kernels are compiled with the answer, so changing it compiles them again).

    Raises:
        ConfigError: ``$REFERENCE_PDL`` is set to something other than ``0`` or ``1``.
    """
    if not switched_on():  # first: every eager launch asks, and the default ends here
        return False
    device = torch.device(device)
    interpreted = os.environ.get("TRITON_INTERPRET", "0").lower() in INTERPRETER_ON  # no inline PTX there
    if device.type != "cuda" or interpreted:
        return False
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return _capable(device)
