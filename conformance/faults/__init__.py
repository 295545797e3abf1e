"""The fault catalogue: faulty implementations the suite must reject (see catalogue.py, run.py, __main__.py)."""

from conformance.faults.catalogue import FAULTS, fault_implementation
from conformance.faults.fault import KINDS, Fault, FaultImplementation

__all__ = ["FAULTS", "KINDS", "Fault", "FaultImplementation", "fault_implementation"]
