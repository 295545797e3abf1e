"""conformance/cores.py: a process that runs beside others takes its share of the cores and passes it on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._inductor import config as inductor_config

from conformance import cores

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def _restoring(monkeypatch):
    """Saves the two variables, torch's thread count and Inductor's compile_threads; restores them after the
    yield, with ``monkeypatch.undo()``. Each variable is set before it is deleted: monkeypatch restores only
    what it recorded, and deleting an unset variable records nothing, so take_share's values stayed for every
    later test of a run without xdist."""
    for name in ("OMP_NUM_THREADS", cores.COMPILE_THREADS):
        monkeypatch.setenv(name, "1")
        monkeypatch.delenv(name)
    threads = torch.get_num_threads()
    with inductor_config.patch(compile_threads=inductor_config.compile_threads):
        yield
    torch.set_num_threads(threads)


@pytest.fixture
def restored(monkeypatch):
    yield from _restoring(monkeypatch)


def test_taking_a_share_under_the_fixture_leaves_the_variables_as_they_were():
    names = ("OMP_NUM_THREADS", cores.COMPILE_THREADS)
    before = {name: os.environ.get(name) for name in names}
    with pytest.MonkeyPatch.context() as monkeypatch:
        restoring = _restoring(monkeypatch)
        next(restoring)
        cores.take_share(1)
        next(restoring, None)
    assert {name: os.environ.get(name) for name in names} == before


@pytest.mark.parametrize("share", [1, 3])  # 1: no pool of compile workers; 3: no process's default anywhere
def test_a_share_sets_the_threads_here_and_in_the_processes_started_from_here(restored, share):
    cores.take_share(share)
    assert torch.get_num_threads() == inductor_config.compile_threads == share
    # the variables themselves: torch may cap what it reads from OMP_NUM_THREADS at the cores it is allowed
    child = "import os; print(os.environ['OMP_NUM_THREADS'], os.environ['TORCHINDUCTOR_COMPILE_THREADS'])"
    assert subprocess.check_output([sys.executable, "-c", child], text=True).split() == [str(share)] * 2


def test_an_inductor_compile_thread_count_set_by_the_user_is_kept(restored, monkeypatch):
    monkeypatch.setenv(cores.COMPILE_THREADS, "3")
    inductor_config.compile_threads = 3  # what Inductor read from it at import
    assert cores.shared(1, os.environ)[cores.COMPILE_THREADS] == "3"
    cores.take_share(1)
    assert inductor_config.compile_threads == 3 and os.environ[cores.COMPILE_THREADS] == "3"


def test_an_xdist_worker_passes_its_share_to_what_its_tests_start():
    """Without it, each of the H200's eight workers started pytest runs, torchrun and Inductor's compile
    pools sized for all 16 cores."""
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        pytest.skip("runs under -n 2 or more, as CI and tox run the suite")
    workers = int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    assert os.environ["OMP_NUM_THREADS"] == str(torch.get_num_threads())
    # the share divides torch's own count (a user's OMP_NUM_THREADS, else torch's default, at most the usable cores)
    assert torch.get_num_threads() <= max(1, len(os.sched_getaffinity(0)) // workers)
    assert inductor_config.compile_threads == int(os.environ[cores.COMPILE_THREADS])


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", cores.COMPILE_THREADS])
@pytest.mark.parametrize("value", ["abc", "", " ", "0", "-2", "1.5", "٣", "2,", ",2", "2,,3", "2,x"])
def test_a_thread_count_that_is_not_a_whole_number_of_at_least_one_is_refused_by_name(variable, value):
    with pytest.raises(ValueError) as err:
        cores.thread_counts({variable: value})
    assert str(err.value) == f"{variable}={value!r}: expected a whole number of threads >= 1, or leave it unset"


def test_thread_counts_read_both_variables_and_openmps_list_form():
    assert cores.thread_counts({}) == (None, None)
    assert cores.thread_counts({"OMP_NUM_THREADS": "4,2", cores.COMPILE_THREADS: "3"}) == (4, 3)


@pytest.mark.slow
def test_a_bad_count_stops_pytest_with_one_line_before_torch_fails_deep_inside(tmp_path):
    env = {**os.environ, cores.COMPILE_THREADS: "abc"}
    env.pop("PYTEST_XDIST_WORKER", None)
    cmd = [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--collect-only", "-q",
           "conformance/test_cores.py"]  # fmt: skip
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines() == [f"pytest: {cores.COMPILE_THREADS}='abc': expected a whole number "
                                               "of threads >= 1, or leave it unset"]  # fmt: skip
