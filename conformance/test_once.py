"""conformance/once.py: a value the session's workers share is computed once and read by the others."""

from __future__ import annotations

import pytest

from conformance import once


def test_a_value_is_computed_once_and_read_back_by_a_process_that_did_not_compute_it(tmp_path_factory):
    calls = []
    key = "test_once: shared"
    first = once.computed_once(tmp_path_factory, key, lambda: calls.append(1) or {"logits": [1.5, 2.5]})
    again = once.computed_once(tmp_path_factory, key, lambda: pytest.fail("computed twice in one process"))
    assert first == again == {"logits": [1.5, 2.5]} and calls == [1]
    once._read.clear()  # what another worker of the session sees: only the saved file
    read = once.computed_once(tmp_path_factory, key, lambda: pytest.fail("computed again by another worker"))
    assert read == first


def test_a_failed_computation_saves_nothing_and_the_next_caller_computes_it(tmp_path_factory):
    def fails():
        raise RuntimeError("torchrun died")

    with pytest.raises(RuntimeError, match="torchrun died"):
        once.computed_once(tmp_path_factory, "test_once: fails", fails)
    assert once.computed_once(tmp_path_factory, "test_once: fails", lambda: 7) == 7


def test_the_shared_folder_is_above_a_workers_own_under_xdist(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert once.shared_folder(tmp_path_factory) == tmp_path_factory.getbasetemp().parent
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert once.shared_folder(tmp_path_factory) == tmp_path_factory.getbasetemp()
