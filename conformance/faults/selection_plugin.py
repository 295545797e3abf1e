"""A pytest plugin for :func:`conformance.faults.run.selected_tests`: after collection, write which tests each
fault's ``-k`` expression selects (``FAULT_SELECTION_IDS``, comma-separated) to ``FAULT_SELECTION_OUT`` as JSON.

The expressions are evaluated with pytest's own ``-k`` matcher, so the answer is what ``-k`` would select.
"""

from __future__ import annotations

import json
import os

from _pytest.mark import KeywordMatcher
from _pytest.mark.expression import Expression

from conformance.faults.catalogue import FAULTS


def pytest_collection_finish(session):
    ids = set(os.environ["FAULT_SELECTION_IDS"].split(","))
    selected = {}
    for fault in (f for f in FAULTS if f.id in ids):
        expression = Expression.compile(fault.tests)
        selected[fault.id] = [i.nodeid for i in session.items if expression.evaluate(KeywordMatcher.from_item(i))]
    with open(os.environ["FAULT_SELECTION_OUT"], "w") as f:
        json.dump(selected, f, indent=1)
