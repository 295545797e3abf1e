"""How xdist hands out the suite's tests: one by one, except the modules whose tests read one shared run.

The tests of ``SHARED_RUN_MODULES`` read values that one expensive run makes (conformance/once.py: a
torchrun launch per model, the real model's oracle and generations). Handed out one by one, the first
worker to need a value computes it and every other worker that needs it waits on its lock: on the H200's
eight workers, handed the slow tests first, most of the suite stood still behind each launch. So each of
these modules goes to one worker as one unit of work, which runs its runs in turn while the other
workers take the rest, one test at a time (xdist's ``LoadScopeScheduling`` with our scopes).

xdist's own way to say this, ``@pytest.mark.xdist_group`` with ``--dist loadgroup``, writes the group into
a node id field that pytest 9.2 no longer reads, so it silently hands the tests out one by one
(pytest-xdist issue #1386, open on 2026-12-02).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

SHARED_RUN_MODULES = ("conformance/test_tensor_parallel.py", "conformance/test_real_gemma3.py")
# the --dist values this scheduling stands in for: xdist's default with -n, and the one the suite used to ask for
REPLACES = ("load", "loadgroup")


class SharedRunScheduling(LoadScopeScheduling):
    """xdist's load scheduling with each of ``SHARED_RUN_MODULES`` as one unit of work."""

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::", 1)[0]
        return module if module in SHARED_RUN_MODULES else nodeid
