"""``python -m conformance.run_record`` (what ``tox -e gpu`` runs): every step runs and is timed, and the
record holds each step's exit status and counts, so a closing note can quote one run whole."""

from __future__ import annotations

import json
import sys

import pytest

from conformance import run_record

pytestmark = pytest.mark.requires("components")

TESTS = """
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="on purpose")
def test_skipped():
    pass
"""


def test_the_record_holds_every_steps_exit_status_and_counts_and_a_red_step_does_not_stop_the_rest(
    tmp_path, monkeypatch, capsys
):
    (tmp_path / "test_three.py").write_text(TESTS)

    def steps(device, scratch, pytest_args):
        pytest_run = [sys.executable, "-m", "pytest", str(tmp_path / "test_three.py"), "-q", "-p", "no:cacheprovider",
                      "--rootdir", str(tmp_path), f"--junitxml={scratch / 'suite.xml'}", *pytest_args]  # fmt: skip
        return [("suite", pytest_run), ("faults", [sys.executable, "-c", "print('5 caught, 1 survived')"])]

    monkeypatch.setattr(run_record, "_steps", steps)
    monkeypatch.setenv("REFERENCE_COMMIT", "abc123")
    record_path = tmp_path / "record.json"
    assert run_record.main(["--record", str(record_path), "--", "-p", "no:randomly"]) == 1
    record = json.loads(record_path.read_text())
    suite, faults = record["steps"]
    assert suite["exit"] == 1 and suite["tests"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert "-p no:randomly" in suite["command"]  # what follows -- goes to the pytest steps
    assert faults["exit"] == 0 and faults["faults"] == {"caught": 5, "survived": 1}
    assert record["ok"] is False and record["torch"] and record["total_seconds"] >= 0
    # REFERENCE_COMMIT wins over what git says: a copied tree may carry a stale .git of another commit
    assert record["commit"] == "abc123"
    out = capsys.readouterr().out
    assert "=== suite: exit 1 in" in out and "=== faults: exit 0 in" in out and "total" in out


def test_a_record_in_a_missing_folder_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_record.main(["--record", str(tmp_path / "missing" / "record.json")])
    assert exit_info.value.code == 2
    assert "--record" in capsys.readouterr().err
