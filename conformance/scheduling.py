"""How xdist hands out the suite's tests: xdist's ``LoadScopeScheduling`` over conformance/work_units.py's units.

xdist's own way to keep tests together, ``@pytest.mark.xdist_group`` with ``--dist loadgroup``, writes the group
into a node id field that pytest 9.2 no longer reads, so it silently hands the tests out one by one
(pytest-xdist issue #1386, open on 2026-12-02).

xdist also keeps a unit queued behind each worker's running one, so that the worker knows its next test. Handed
the slow tests first, a worker running one of the suite's longest units (``LONG_RUNS``: minutes each on the
H200) was often queued a second one, and ran the two one after the other at the end of the step while the others
idled (2026-12-03, H200: 172 + 151 s of the peer's shards on one worker, 250-307 s of work on each of the other
seven). So behind a long unit a worker is queued the last unit of the queue (a quick test) instead of the next
(the last one is long only when every unit left is). The queue's order is xdist's: units of more tests first
(``--loadscope-reorder``, its default: the shared runs), then the collection's order, long units first
(conformance/conftest.py).
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

from conformance.work_units import is_long, scope_of

# the --dist values this scheduling stands in for: xdist's default with -n, and the one the suite used to ask for
REPLACES = ("load", "loadgroup")


class SharedRunScheduling(LoadScopeScheduling):
    """xdist's load scheduling with conformance/work_units.py's units, and no long unit queued behind another."""

    def _split_scope(self, nodeid: str) -> str:
        return scope_of(nodeid)

    def _assign_work_unit(self, node) -> None:
        """Queue the next unit on ``node`` (xdist pops the queue's head); behind a long unit of ``node``'s own, the
        queue's last unit unless that one is long too."""
        pending = (scope for scope, tests in self.assigned_work.get(node, {}).items() if not all(tests.values()))
        if any(is_long(scope) for scope in pending):
            last = next(reversed(self.workqueue))
            if not is_long(last):
                self.workqueue.move_to_end(last, last=False)
        super()._assign_work_unit(node)
