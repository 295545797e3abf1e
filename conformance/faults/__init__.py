"""The fault catalogue: faulty implementations the suite must reject (see catalogue.py, run.py, __main__.py)."""

from conformance import cores

# before the catalogue imports Inductor; every fault's run would fail on a bad count and count as caught
cores.refuse_bad_counts("python -m conformance.faults: error")

from conformance.faults.catalogue import FAULTS, fault_implementation  # noqa: E402
from conformance.faults.fault import KINDS, Fault, FaultImplementation  # noqa: E402

__all__ = ["FAULTS", "KINDS", "Fault", "FaultImplementation", "fault_implementation"]
