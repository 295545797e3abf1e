"""conformance/work_units.py and scheduling.py: the tests of a module that reads one shared run go to one xdist
worker, the long units go out first, and no worker has two long units queued."""

from __future__ import annotations

import os
import re
from collections import OrderedDict
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from conformance import forked
from conformance.scheduling import SharedRunScheduling
from conformance.work_units import SHARED_RUNS, SPREAD_READERS, is_long, scope_of

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.requires("components")  # a tool of the suite itself: checked once, under the reference


def test_the_tests_of_one_shared_run_are_one_unit_of_work_and_any_other_test_is_its_own():
    split = SharedRunScheduling._split_scope  # xdist's hook, scope_of underneath
    tp, gemma = "conformance/test_tensor_parallel.py", "conformance/test_real_gemma3.py"
    llama = {split(None, f"{tp}::test_a[llama-tiny-eager]"), split(None, f"{tp}::test_b[llama-tiny]")}
    assert len(llama) == 1 and split(None, f"{tp}::test_a[qwen3-tiny-eager]") not in llama  # a launch per model
    assert split(None, f"{tp}::test_c[2-message]") == f"{tp}::test_c[2-message]"  # reads no launch
    assert split(None, f"{gemma}::test_d[eager]") == split(None, f"{gemma}::test_e") == gemma
    assert split(None, "conformance/test_llm.py::test_f[x]") == "conformance/test_llm.py::test_f[x]"


def test_the_peers_shards_and_each_tensor_parallel_launch_are_the_long_units():
    tp, peer = "conformance/test_tensor_parallel.py", "conformance/test_peer_suite.py"
    assert is_long(scope_of(f"{tp}::test_a[llama-tiny-eager]")) and is_long(scope_of(f"{tp}::test_a[qwen3-tiny]"))
    assert is_long(scope_of(f"{peer}::test_the_suite_passes_against_torch_native[shard-2-of-4]"))
    assert not is_long(scope_of(f"{tp}::test_c[2-message]"))  # reads no launch
    assert not is_long(scope_of(f"{peer}::test_the_shards_of_a_selection_hold_each_of_its_tests_once[3]"))


class _Worker:
    """What xdist's scheduler asks of a worker: its queue of test indices."""

    shutting_down = False

    def __init__(self, name):
        self.name, self.queued, self.gateway = name, [], SimpleNamespace(id=name)

    def send_runtest_some(self, indices):
        self.queued += indices

    def shutdown(self):
        self.shutting_down = True


def _scheduling(workers, collection):
    """A SharedRunScheduling whose workers all collected ``collection``, after xdist's first distribution."""
    sched = SharedRunScheduling.__new__(SharedRunScheduling)  # no pytest config: only the queue logic runs
    sched.log = lambda *args: None
    sched.numnodes, sched.collection, sched.workqueue = len(workers), None, OrderedDict()
    sched.assigned_work = {worker: {} for worker in workers}  # what xdist's add_node leaves
    sched.registered_collections = {worker: collection for worker in workers}
    sched.config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True))  # xdist's default
    sched.schedule()
    return sched


def test_a_worker_running_a_long_unit_is_queued_a_quick_test_behind_it_never_another_long_unit():
    """Three long units on two workers: xdist's own scheduling queues the third behind the first; here each worker
    is queued a test from the queue's end, and the third long unit goes out when the first is done."""
    peer = "conformance/test_peer_suite.py::test_the_suite_passes_against_torch_native"
    collection = [f"{peer}[shard-{i}-of-3]" for i in (1, 2, 3)] + [f"conformance/test_x.py::test_{i}" for i in range(4)]
    workers = [_Worker("gw0"), _Worker("gw1")]
    sched = _scheduling(workers, collection)
    names = {worker.name: [collection[i].rpartition("::")[2][-14:] for i in worker.queued] for worker in workers}
    assert names == {"gw0": ["[shard-1-of-3]", "test_3"], "gw1": ["[shard-2-of-3]", "test_2"]}, names
    sched.mark_test_complete(workers[0], 0)  # shard 1 done: gw0 has test_3 left, and is queued the next long unit
    assert [collection[i] for i in workers[0].queued[2:]] == [f"{peer}[shard-3-of-3]"]


def test_every_module_that_reads_a_shared_run_is_scheduled_by_its_runs():
    """A new module reading a computed_once value, handed out test by test, would make workers wait."""
    readers = {
        f"conformance/{path.name}"
        for path in (ROOT / "conformance").glob("test_*.py")
        if re.search(r"^from conformance\.once import", path.read_text(), re.MULTILINE)
    }
    assert readers == set(SHARED_RUNS) | SPREAD_READERS


@pytest.mark.slow
def test_under_n_2_the_tests_of_one_launch_all_run_on_one_worker():
    """What xdist_group with --dist loadgroup promised and, with pytest 9.2, stopped doing. Under
    torch-native, which lacks tensor parallelism, the tests skip at once but are handed out all the same."""
    cmd = [sys.executable, "-m", "pytest", "conformance/test_tensor_parallel.py", "-n", "2", "-v", "-p",
           "no:cacheprovider", "--impl", "torch-native", "-k", "llama-tiny"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    run = forked.run(cmd, env=env, timeout=300)
    workers = re.findall(r"^\[(gw\d+)\] .*SKIPPED", run.stdout, re.MULTILINE)
    assert run.returncode == 0 and len(workers) == 10, run.stdout[-2000:]
    assert len(set(workers)) == 1, workers


def test_the_long_units_are_collected_first_then_the_other_slow_tests():
    """xdist hands tests out in collection order (conformance/conftest.py sorts it)."""
    files = ["conformance/test_bench_cli.py", "conformance/test_peer_suite.py", "conformance/test_tensor_parallel.py"]
    cmd = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--assert=plain", *files]
    run = forked.run(cmd, timeout=300)
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert run.returncode == 0 and ids, run.stdout[-2000:] + run.stderr[-2000:]
    long = [is_long(scope_of(nodeid)) for nodeid in ids]
    assert sum(long) >= 3 and long == sorted(long, reverse=True), ids  # every long test before every other
    slow_cli = next(i for i, nodeid in enumerate(ids) if nodeid.startswith(files[0]))
    assert slow_cli == sum(long), ids[: slow_cli + 1]  # then the slow CLI tests, before the quick ones
