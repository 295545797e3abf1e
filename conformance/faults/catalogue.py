"""The fault catalogue: faulty implementations the suite must reject, the reference with one realistic fault
planted (see fault.py for what a fault is, run.py for how one is run).

The faults live by what they break: compilation.py (compile, Dynamo capture, split, config), runner.py
(runner and engine), ops.py (attention, custom ops, models), sampling.py, parallel.py (tensor parallelism),
cuda_graphs.py (those only a GPU shows), full_graphs.py (full and breakable graphs), compile_cache.py and
gemm.py (the GEMM fusions and their kernel).
"""

from __future__ import annotations

from conformance.faults import (
    compilation,
    compile_cache,
    cuda_graphs,
    full_graphs,
    gemm,
    ops,
    parallel,
    runner,
    sampling,
)
from conformance.faults.fault import Fault, FaultImplementation

FAULTS: list[Fault] = [
    *compilation.FAULTS,
    *runner.FAULTS,
    *ops.FAULTS,
    *sampling.FAULTS,
    *parallel.FAULTS,
    *cuda_graphs.FAULTS,
    *full_graphs.FAULTS,
    *compile_cache.FAULTS,
    *gemm.FAULTS,
]


def fault_implementation(fault_id: str) -> FaultImplementation:
    """The implementation of fault ``fault_id``.

    Raises:
        ValueError: no fault has that id (the message lists them).
    """
    for fault in FAULTS:
        if fault.id == fault_id:
            return FaultImplementation(fault)
    raise ValueError(f"--impl fault:{fault_id}: no such fault; known: {[f.id for f in FAULTS]}")
