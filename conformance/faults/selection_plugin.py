"""A pytest plugin for :func:`conformance.faults.run.selected_tests`: after collection, write which tests each
fault's ``-k`` expression selects (``FAULT_SELECTION_IDS``, comma-separated) to ``FAULT_SELECTION_OUT`` as JSON,
and which of those tests carry a marker of a long test (:data:`LONG_MARKERS`).

The expressions are evaluated with pytest's own ``-k`` matcher, so the answer is what ``-k`` would select.
"""

from __future__ import annotations

import json
import os

from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

from conformance.faults.catalogue import FAULTS

# markers of tests that take several times a quick one: an Inductor compile (20-50 s a fault's run on the
# H200 against 12-16 s, 2026-12-04), a subprocess or a launch (pyproject.toml's `slow`)
LONG_MARKERS = ("inductor", "slow")


def pytest_collection_finish(session):
    ids = set(os.environ["FAULT_SELECTION_IDS"].split(","))
    selected, long = {}, set()
    for fault in (f for f in FAULTS if f.id in ids):
        expression = Expression.compile(fault.tests)
        items = [i for i in session.items if expression.evaluate(KeywordMatcher.from_item(i))]
        selected[fault.id] = [i.nodeid for i in items]
        long.update(i.nodeid for i in items if any(i.get_closest_marker(m) for m in LONG_MARKERS))
    with open(os.environ["FAULT_SELECTION_OUT"], "w") as f:
        json.dump({"selected": selected, "long": sorted(long)}, f, indent=1)
