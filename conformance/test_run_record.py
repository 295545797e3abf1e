"""``python -m conformance.run_record`` (what ``tox -e gpu`` runs): every step runs and is timed, and the
record holds each step's exit status and counts, so a closing note can quote one run whole."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

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

    def stages(device, scratch, pytest_args):
        pytest_run = [sys.executable, "-m", "pytest", str(tmp_path / "test_three.py"), "-q", "-p", "no:cacheprovider",
                      "--rootdir", str(tmp_path), f"--junitxml={scratch / 'suite.xml'}", *pytest_args]  # fmt: skip
        return [[("suite", pytest_run)], [("faults", [sys.executable, "-c", "print('5 caught, 1 survived')"])]]

    monkeypatch.setattr(run_record, "_stages", stages)
    monkeypatch.setenv("REFERENCE_COMMIT", "abc123")
    record_path = tmp_path / "record.json"
    assert run_record.main(["--record", str(record_path), "--", "-p", "no:randomly"]) == 1
    record = json.loads(record_path.read_text())
    suite, faults = record["steps"]
    assert suite["exit"] == 1 and suite["tests"] == {"passed": 1, "failed": 1, "errors": 0, "skipped": 1}
    assert "-p no:randomly" in suite["command"]  # what follows -- goes to the pytest steps
    names = sorted(node.rpartition("::")[2] for node, _ in suite["slowest"])
    assert names == ["test_fails", "test_passes", "test_skipped"]
    assert suite["test_seconds"] == pytest.approx(sum(seconds for _, seconds in suite["slowest"]), abs=0.2)
    assert faults["exit"] == 0 and faults["faults"] == {"caught": 5, "survived": 1}
    assert record["ok"] is False and record["torch"] and record["total_seconds"] >= 0
    assert record["cpu_model"] == run_record.cpu_model() and record["cpu_model"]  # this host's
    # REFERENCE_COMMIT wins over what git says: a copied tree may carry a stale .git of another commit
    assert record["commit"] == "abc123"
    out = capsys.readouterr().out
    assert "=== suite: exit 1 in" in out and "=== faults: exit 0 in" in out and "total" in out


# each step of one stage waits for the other's file, so they pass only when run at once
WAITS_FOR = """
import pathlib, sys, time
mine, theirs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
mine.touch()
deadline = time.monotonic() + 20
while not theirs.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
print("5 caught, 0 survived" if theirs.exists() else "alone")
sys.exit(0 if theirs.exists() else 1)
"""


def test_the_steps_of_one_stage_run_at_once_each_line_named_and_each_timed(tmp_path, monkeypatch, capsys):
    """faults and perf run side by side on the GPU: a driver that ran them one after the other would fail."""
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setattr(run_record, "_stages", lambda device, scratch, args: [[
        ("faults", [sys.executable, "-c", WAITS_FOR, str(a), str(b)]),
        ("perf", [sys.executable, "-c", WAITS_FOR, str(b), str(a)]),
    ]])  # fmt: skip
    assert run_record.main(["--record", str(tmp_path / "record.json")]) == 0
    faults, perf = json.loads((tmp_path / "record.json").read_text())["steps"]
    assert (faults["step"], faults["exit"], faults["faults"]) == ("faults", 0, {"caught": 5, "survived": 0})
    assert (perf["step"], perf["exit"]) == ("perf", 0) and perf["seconds"] < 20  # 20 s: how long each waits
    out = capsys.readouterr().out.splitlines()
    assert "[faults] 5 caught, 0 survived" in out and "[perf] 5 caught, 0 survived" in out
    assert sum(line.startswith(("=== faults: exit 0 in", "=== perf: exit 0 in")) for line in out) == 2


def test_a_step_that_cannot_start_or_prints_bytes_that_are_not_utf8_costs_neither_the_others_nor_the_record(
    tmp_path, monkeypatch, capsys
):
    """A GPU run is too dear to lose to one step: a missing program is exit 127, stray bytes are escaped."""
    (tmp_path / "test_one.py").write_text("def test_passes():\n    pass\n")
    latin1 = "import sys; sys.stdout.buffer.write(b'caf\\xe9\\n'); print('5 caught, 0 survived')"
    monkeypatch.setattr(run_record, "_stages", lambda device, scratch, args: [
        [("faults", [sys.executable, "-c", latin1]), ("perf", [str(tmp_path / "no-such-program")])],
        [("suite", [sys.executable, "-m", "pytest", str(tmp_path / "test_one.py"), "-q", "-p", "no:cacheprovider",
                    "--rootdir", str(tmp_path), f"--junitxml={scratch / 'suite.xml'}"])],
    ])  # fmt: skip
    assert run_record.main(["--record", str(tmp_path / "record.json")]) == 1
    faults, perf, suite = json.loads((tmp_path / "record.json").read_text())["steps"]
    assert faults["exit"] == 0 and faults["faults"] == {"caught": 5, "survived": 0}
    assert perf["exit"] == 127 and perf["error"].startswith("cannot start: ")
    assert suite["exit"] == 0 and suite["tests"]["passed"] == 1  # the next stage ran
    out = capsys.readouterr().out
    assert "[faults] caf\\xe9" in out and "=== perf: cannot start (" in out


def test_counts_that_cannot_be_read_make_the_run_red_and_say_why(tmp_path, monkeypatch, capsys):
    def stages(device, scratch, args):
        broken = f"open({str(scratch / 'perf.xml')!r}, 'w').write('<testsuites><testsuite')"
        return [[("perf", [sys.executable, "-c", broken])]]

    monkeypatch.setattr(run_record, "_stages", stages)
    assert run_record.main(["--record", str(tmp_path / "record.json")]) == 1
    (perf,) = json.loads((tmp_path / "record.json").read_text())["steps"]
    assert perf["exit"] == 0 and perf["error"].startswith("cannot read its counts: ")
    assert "cannot read its counts" in capsys.readouterr().out


def test_a_record_in_a_missing_folder_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_record.main(["--record", str(tmp_path / "missing" / "record.json")])
    assert exit_info.value.code == 2
    assert "--record" in capsys.readouterr().err


@pytest.mark.parametrize("where, message", [("", "empty"), (".", "is a folder")], ids=["empty", "a_folder"])
def test_a_record_path_that_cannot_take_the_record_is_refused_before_anything_runs(tmp_path, where, message, capsys):
    """Found only at the end of a 15-minute run, it was a traceback that lost the summary too."""
    with pytest.raises(SystemExit) as exit_info:
        run_record.main(["--record", str(tmp_path / where) if where else ""])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--record" in err[0] and message in err[0]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a CUDA device")
def test_asked_for_cuda_without_one_it_stops_before_any_step(monkeypatch, tmp_path, capsys):
    """tox -e gpu on a machine without a GPU must stop at once, not run the CPU fault catalogue first."""
    monkeypatch.setenv("REFERENCE_REQUIRE_CUDA", "1")
    monkeypatch.setattr(run_record, "_run_stage", lambda *args: pytest.fail("a step ran"))
    with pytest.raises(SystemExit) as exit_info:
        run_record.main(["--record", str(tmp_path / "record.json")])
    assert exit_info.value.code == 2
    assert "REFERENCE_REQUIRE_CUDA=1 but torch" in capsys.readouterr().err


# two steps side by side, each starting a grandchild, printing its pid and ignoring SIGTERM
DRIVER_WITH_LONG_STEPS = """
import sys
from conformance import run_record
run_record.TERM_GRACE_S = {grace}  # the test's own: what it checks is that both groups wait out one grace
child = "import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); print(p.pid, flush=True); time.sleep(60)"
stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + child
run_record._stages = lambda device, scratch, args: [[("faults", [sys.executable, "-c", stubborn]),
                                                     ("perf", [sys.executable, "-c", stubborn])]]
run_record.main(["--record", sys.argv[1]])
"""


@pytest.mark.slow
def test_a_terminated_run_ends_its_steps_processes(tmp_path):
    """A driver killed by its process id (a tox interrupt, a CI timeout) left pytest, its xdist workers and
    torchrun running on the GPU. With two steps at once that ignore SIGTERM, both groups are signalled
    together and killed after one grace."""
    grace = 5
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER_WITH_LONG_STEPS.format(grace=grace), str(tmp_path / "record.json")],
        cwd=run_record.ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    grandchildren = []
    for line in driver.stdout:  # each step's first line is its sleeping grandchild's pid
        pid = line.rpartition("] ")[2].strip()
        if pid.isdigit():
            grandchildren.append(int(pid))
            if len(grandchildren) == 2:
                break
    start = time.monotonic()
    driver.send_signal(signal.SIGTERM)
    time.sleep(1)
    driver.send_signal(signal.SIGTERM)  # a second one must not cut the clean-up short
    driver.wait(timeout=30)
    assert driver.returncode != 0
    deadline = time.monotonic() + 15
    while any(_alive(pid) for pid in grandchildren) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in grandchildren if _alive(pid)], "a step's process outlived the driver"
    assert time.monotonic() - start < 1.6 * grace  # both groups SIGTERM at once, SIGKILL a grace later (one by one: 2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie has exited; only its parent has not collected it yet
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False
