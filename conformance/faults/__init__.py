"""The fault catalogue: faulty implementations the suite must reject (see catalogue.py, run.py, __main__.py)."""

import os
import sys

from conformance import cores

try:  # before the catalogue imports Inductor, whose config fails on a bad count with a bare int() error
    cores.thread_counts(os.environ)
except ValueError as err:  # every fault's run would fail on it too, and each fault would count as caught
    print(f"python -m conformance.faults: error: {err}", file=sys.stderr)
    raise SystemExit(2) from None

from conformance.faults.catalogue import FAULTS, fault_implementation  # noqa: E402
from conformance.faults.fault import KINDS, Fault, FaultImplementation  # noqa: E402

__all__ = ["FAULTS", "KINDS", "Fault", "FaultImplementation", "fault_implementation"]
