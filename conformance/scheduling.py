"""How xdist hands out the suite's tests: one by one, except the modules whose tests read one shared run.

The tests of ``SHARED_RUNS``' modules read values that one expensive run makes (conformance/once.py: a
torchrun launch per model, the real model's oracle and generations). Handed out one by one, the first
worker to need a value computes it and every other worker that needs it waits on its lock: on the H200's
eight workers, handed the slow tests first, most of the suite stood still behind each launch. So the
tests that read one run go to one worker as one unit of work (all of a module's, or those whose
parameters start with the run's name: each tensor-parallel model's launch is a unit of its own, so three
workers launch the three at once), while the rest go out one test at a time (xdist's
``LoadScopeScheduling`` with our scopes).

xdist's own way to say this, ``@pytest.mark.xdist_group`` with ``--dist loadgroup``, writes the group into
a node id field that pytest 9.2 no longer reads, so it silently hands the tests out one by one
(pytest-xdist issue #1386, open on 2026-12-02).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from conformance.tensor_parallel_worker import MODELS as TENSOR_PARALLEL_MODELS

# module -> the names of its runs, each the start of its tests' parameter ids; () for one run that every test
# of the module reads
SHARED_RUNS: dict[str, tuple[str, ...]] = {
    "conformance/test_tensor_parallel.py": TENSOR_PARALLEL_MODELS,  # one torchrun launch per model
    "conformance/test_real_gemma3.py": (),  # the oracle, each mode's generation, the float32 likelihoods
}
# the --dist values this scheduling stands in for: xdist's default with -n, and the one the suite used to ask for
REPLACES = ("load", "loadgroup")


class SharedRunScheduling(LoadScopeScheduling):
    """xdist's load scheduling with the tests of each run in ``SHARED_RUNS`` as one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        module, _, test = nodeid.partition("::")
        if module not in SHARED_RUNS:
            return nodeid
        if not SHARED_RUNS[module]:
            return module
        params = test.partition("[")[2]  # "llama-tiny-eager]"
        runs = [name for name in SHARED_RUNS[module] if params.startswith((f"{name}-", f"{name}]"))]
        return f"{module}::{runs[0]}" if runs else nodeid
