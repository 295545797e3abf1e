"""The fault catalogue: faulty implementations the suite must reject (see catalogue.py, __main__.py)."""

from conformance.faults.catalogue import FAULTS, Fault, FaultImplementation, fault_implementation

__all__ = ["FAULTS", "Fault", "FaultImplementation", "fault_implementation"]
