"""conformance/scheduling.py: the tests of a module that reads one shared run go to one xdist worker."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance.scheduling import SHARED_RUN_MODULES, SharedRunScheduling

ROOT = Path(__file__).resolve().parents[1]


def test_a_shared_run_module_is_one_unit_of_work_and_any_other_test_is_its_own():
    split = SharedRunScheduling._split_scope
    tp = "conformance/test_tensor_parallel.py"
    assert split(None, f"{tp}::test_a[llama-tiny-eager]") == split(None, f"{tp}::test_b[qwen3-tiny]") == tp
    assert split(None, "conformance/test_llm.py::test_c[x]") == "conformance/test_llm.py::test_c[x]"


def test_every_module_that_reads_a_shared_run_is_scheduled_as_one_unit():
    """A new module reading a computed_once value, handed out test by test, would make workers wait."""
    readers = {
        f"conformance/{path.name}"
        for path in (ROOT / "conformance").glob("test_*.py")
        if re.search(r"^from conformance\.once import", path.read_text(), re.MULTILINE)
    }
    assert readers == set(SHARED_RUN_MODULES)


@pytest.mark.slow
def test_under_n_2_the_tests_of_a_shared_run_module_all_run_on_one_worker():
    """What xdist_group with --dist loadgroup promised and, with pytest 9.2, stopped doing."""
    cmd = [sys.executable, "-m", "pytest", "conformance/test_tensor_parallel.py", "-n", "2", "-v", "-p",
           "no:cacheprovider", "-k", "errors_are_one_line_naming_it or refuses_a_model"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    run = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    workers = re.findall(r"^\[(gw\d+)\] .*PASSED", run.stdout, re.MULTILINE)
    assert run.returncode == 0 and len(workers) == 7, run.stdout[-2000:]
    assert len(set(workers)) == 1, workers
