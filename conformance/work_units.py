"""The suite's units of work for xdist: which tests go to one worker together, and which units take minutes.

A unit is a scope name (:func:`scope_of`). Most tests are a unit of their own. The tests of ``SHARED_RUNS``'
modules read values that one expensive run makes (conformance/once.py: a torchrun launch per model, the real
model's oracle and generations); handed out one by one, the first worker to need a value computes it and every
other worker that needs it waits on its lock, so the tests that read one run are one unit (all of a module's, or
those whose parameters start with the run's name: each tensor-parallel model's launch is a unit of its own, so
three workers launch the three at once). ``SPREAD_READERS`` are readers whose value is cheap beside their tests:
they stay spread.

``LONG_RUNS`` are the units that take minutes each on the H200; the suite hands them out first
(conformance/conftest.py) and never queues one behind another on a worker (conformance/scheduling.py).
No xdist here: conformance/conftest.py orders the tests with it in runs without xdist too.
"""

from __future__ import annotations

from conformance.tensor_parallel_worker import MODELS as TENSOR_PARALLEL_MODELS

# module -> the names of its runs, each the start of its tests' parameter ids; () for one run that every test
# of the module reads
SHARED_RUNS: dict[str, tuple[str, ...]] = {
    "conformance/test_tensor_parallel.py": TENSOR_PARALLEL_MODELS,  # one torchrun launch per model
    "conformance/test_real_gemma3.py": (),  # the oracle, each mode's generation, the float32 likelihoods
}
# modules that read a computed_once value but whose tests are handed out one by one all the same: the value is
# short beside the tests that read it, so a worker that waits for it once loses less than one worker running them
# all. test_faults.py: the CPU faults' selection (one collection, 6-14 s on a 2-core AMD EPYC) beside ~60 faults.
SPREAD_READERS = frozenset({"conformance/test_faults.py"})
# units that take minutes each on the H200 (2026-12-03: 113-172 s a shard of the peer's run, 106-116 s a
# tensor-parallel launch): a scope starting with one of these
LONG_RUNS: tuple[str, ...] = (
    "conformance/test_peer_suite.py::test_the_suite_passes_against_torch_native[",
    *(f"conformance/test_tensor_parallel.py::{name}" for name in TENSOR_PARALLEL_MODELS),
)


def scope_of(nodeid: str) -> str:
    """The unit of work of test ``nodeid``: its module (or ``module::run``) for a reader of ``SHARED_RUNS``,
    else ``nodeid`` itself."""
    module, _, test = nodeid.partition("::")
    if module not in SHARED_RUNS:
        return nodeid
    if not SHARED_RUNS[module]:
        return module
    params = test.partition("[")[2]  # "llama-tiny-eager]"
    runs = [name for name in SHARED_RUNS[module] if params.startswith((f"{name}-", f"{name}]"))]
    return f"{module}::{runs[0]}" if runs else nodeid


def is_long(scope: str) -> bool:
    """Whether the unit ``scope`` (a :func:`scope_of` value) is one of ``LONG_RUNS``."""
    return scope.startswith(LONG_RUNS)
