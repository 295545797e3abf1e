"""conformance/scheduling.py: the tests of a module that reads one shared run go to one xdist worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.scheduling import SHARED_RUNS, SharedRunScheduling

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def test_the_tests_of_one_shared_run_are_one_unit_of_work_and_any_other_test_is_its_own():
    split = SharedRunScheduling._split_scope
    tp, gemma = "conformance/test_tensor_parallel.py", "conformance/test_real_gemma3.py"
    llama = {split(None, f"{tp}::test_a[llama-tiny-eager]"), split(None, f"{tp}::test_b[llama-tiny]")}
    assert len(llama) == 1 and split(None, f"{tp}::test_a[qwen3-tiny-eager]") not in llama  # a launch per model
    assert split(None, f"{tp}::test_c[2-message]") == f"{tp}::test_c[2-message]"  # reads no launch
    assert split(None, f"{gemma}::test_d[eager]") == split(None, f"{gemma}::test_e") == gemma
    assert split(None, "conformance/test_llm.py::test_f[x]") == "conformance/test_llm.py::test_f[x]"


def test_every_module_that_reads_a_shared_run_is_scheduled_by_its_runs():
    """A new module reading a computed_once value, handed out test by test, would make workers wait."""
    readers = {
        f"conformance/{path.name}"
        for path in (ROOT / "conformance").glob("test_*.py")
        if re.search(r"^from conformance\.once import", path.read_text(), re.MULTILINE)
    }
    assert readers == set(SHARED_RUNS)


@pytest.mark.slow
def test_under_n_2_the_tests_of_one_launch_all_run_on_one_worker():
    """What xdist_group with --dist loadgroup promised and, with pytest 9.2, stopped doing. Under
    torch-native, which lacks tensor parallelism, the tests skip at once but are handed out all the same."""
    cmd = [sys.executable, "-m", "pytest", "conformance/test_tensor_parallel.py", "-n", "2", "-v", "-p",
           "no:cacheprovider", "--impl", "torch-native", "-k", "llama-tiny"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    workers = re.findall(r"^\[(gw\d+)\] .*SKIPPED", run.stdout, re.MULTILINE)
    assert run.returncode == 0 and len(workers) == 10, run.stdout[-2000:]
    assert len(set(workers)) == 1, workers
