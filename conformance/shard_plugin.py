"""A pytest plugin (``-p conformance.shard_plugin``) that keeps one shard of the selected tests:
``CONFORMANCE_SHARD=I/N`` keeps every N-th test from the I-th (0-based), in the suite's order, after ``-m``,
``-k`` and the suite's own ordering. N runs with I = 0 .. N-1 run every selected test once; neighbouring
tests, often the parametrizations of one costly rule, land in different shards.
conformance/test_peer_suite.py runs the suite against torch-native so, N shards at once.
"""

from __future__ import annotations

import os

import pytest

ENV = "CONFORMANCE_SHARD"


def shard_of(value: str) -> tuple[int, int]:
    """(I, N) of ``I/N``. Raises: pytest.UsageError naming ``CONFORMANCE_SHARD`` and the form."""
    try:
        index, count = (int(part) for part in value.split("/"))
    except ValueError:
        index, count = -1, 0
    if not 0 <= index < count:
        raise pytest.UsageError(f"{ENV}={value!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return index, count


@pytest.hookimpl(trylast=True)  # after -m, -k and conformance/conftest.py's ordering
def pytest_collection_modifyitems(config, items):
    index, count = shard_of(os.environ.get(ENV, ""))
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % count != index])
    items[:] = items[index::count]
