"""conformance/once.py: a value the session's workers share is computed once and read by the others."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from conformance import forked, once

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def test_a_value_is_computed_once_and_read_back_by_a_process_that_did_not_compute_it(request):
    calls = []
    key = "test_once: shared"
    first = once.computed_once(request, key, lambda: calls.append(1) or {"logits": [1.5, 2.5]})
    again = once.computed_once(request, key, lambda: pytest.fail("computed twice in one process"))
    assert first == again == {"logits": [1.5, 2.5]} and calls == [1]
    once._read.clear()  # what another worker of the session sees: only the saved file
    read = once.computed_once(request, key, lambda: pytest.fail("computed again by another worker"))
    assert read == first


@pytest.mark.parametrize("failure", ["compute", "save", "rename"])
def test_a_failed_computation_or_save_keeps_nothing_and_the_next_caller_computes_it(request, failure, monkeypatch):
    """A value torch.save cannot write was kept in this process but saved nowhere: other workers failed. A
    rename that fails (a full disk, a vanished folder) leaves a written partial file, which must go too."""
    key = f"test_once: fails in {failure}"

    def fails():
        if failure == "compute":
            raise RuntimeError("torchrun died")
        return (lambda: None) if failure == "save" else 7  # a lambda cannot be pickled

    def rename_fails(source, target):
        assert Path(source).exists()  # the partial file was written: only its cleanup keeps it from staying
        raise OSError("rename failed")

    with monkeypatch.context() as patch:
        if failure == "rename":
            patch.setattr(once.os, "replace", rename_fails)
        with pytest.raises(Exception, match="torchrun died|pickle|rename failed"):
            once.computed_once(request, key, fails)
    saved = once.saved_file(request, key)
    # this key's partial file only: another worker may be writing its own value at this moment
    assert list(saved.parent.glob(f"{saved.stem}.*")) == [saved.with_name(saved.name + ".lock")]
    assert once.computed_once(request, key, lambda: 8) == 8  # not a value the failed call kept
    assert saved.exists()


def test_the_shared_folder_is_above_a_workers_own_only_in_a_real_worker(request, monkeypatch):
    base = request.getfixturevalue("tmp_path_factory").getbasetemp()
    monkeypatch.setattr(request.config, "workerinput", {"workerid": "gw1"}, raising=False)
    assert once.shared_folder(request) == base.parent
    monkeypatch.undo()
    monkeypatch.delattr(request.config, "workerinput", raising=False)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")  # inherited by a run a test started: not a worker
    assert once.shared_folder(request) == base


@pytest.mark.slow
def test_a_run_started_from_a_worker_keeps_its_values_in_its_own_session(tmp_path):
    """A fault's run started from an xdist worker inherited PYTEST_XDIST_WORKER, took itself for a worker and
    kept its values in the folder every session shares: the next fault, or the next day's run, read them."""
    test = tmp_path / "test_value.py"
    test.write_text(
        "from conformance.once import computed_once\n"
        "def test_value(request):\n"
        "    assert computed_once(request, 'test_once: session', lambda: 'computed') == 'computed'\n"
    )
    env = {**os.environ, "PYTEST_XDIST_WORKER": "gw0", "PYTHONPATH": str(ROOT)}
    (tmp_path / "runs").mkdir()  # above both runs' own folders, as /tmp/pytest-of-USER is above every session's
    for run_number in (1, 2):  # the first saves 'computed'; the second, asking for 'planted', must not read it
        cmd = [sys.executable, "-m", "pytest", str(test), "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
               f"--basetemp={tmp_path / 'runs' / str(run_number)}"]  # fmt: skip
        run = forked.run(cmd, env=env, cwd=tmp_path, timeout=120)
        assert run.returncode == 0, run.stdout[-1500:]
        test.write_text(test.read_text().replace("'computed') == 'computed'", "'planted') == 'planted'"))
