"""conformance/cores.py: a process that runs beside others takes its share of the cores and passes it on."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch._inductor import config as inductor_config

from conformance import cores

pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


@pytest.fixture
def restored(monkeypatch):
    """torch's thread count and Inductor's compile_threads as they were before the test."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(cores.COMPILE_THREADS, raising=False)
    threads = torch.get_num_threads()
    with inductor_config.patch(compile_threads=inductor_config.compile_threads):
        yield
    torch.set_num_threads(threads)


def test_a_share_sets_the_threads_here_and_in_the_processes_started_from_here(restored):
    cores.take_share(1)
    assert torch.get_num_threads() == 1 and inductor_config.compile_threads == 1  # 1: no pool of compile workers
    child = "import os, torch; print(torch.get_num_threads(), os.environ['TORCHINDUCTOR_COMPILE_THREADS'])"
    assert subprocess.check_output([sys.executable, "-c", child], text=True).split() == ["1", "1"]


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
    assert os.environ["OMP_NUM_THREADS"] == str(torch.get_num_threads())
    assert inductor_config.compile_threads == int(os.environ[cores.COMPILE_THREADS])
