"""The suite against its second subject: ``pytest conformance --impl torch-native`` passes on this machine.

A rule only the reference can meet is a capability the peer does not declare (skipped with the reason) or a finding
about the peer (a strict xfail, ``findings`` in conformance/torch_native.py), never a red run. This runs the suite
against torch-native in a process of its own (conformance/forked.py) and asks for exit 0 and some rules passed. The
two machines split the peer's tests between them, each test run once: on the CPU (CI) the fast subset (gpu and slow
tests deselected: the slow ones time the tools, torchrun's process groups and the CLIs, and they would add minutes to
CI's 2 cores); where torch sees a GPU, the rest, the gpu and the slow tests, but the device-memory ones (they must
have the device to themselves, which a run inside the suite cannot promise). The findings about torch run on both,
each machine's torch checked. The GPU run once repeated the fast CPU subset too: 150-206 s a shard of four on an H100
whose whole ``tox -e gpu`` then outran the device's 10-minute call (perf/NOTES.md v47). The run is split into
``SHARDS`` (conformance/shard_plugin.py: every N-th test), each a test of its own, so xdist's workers run the shards
at once: whole, it was the longest test of the GPU run and the floor under the suite's time. The run takes
``--impl-tests-only``: torch-native declares ``reached_only_through_impl``, so a test without the ``impl`` fixture
(or a finding) runs the reference's code under it, and the peer's run of it would repeat the reference's (1,624 of
the CPU subset's 1,867 tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conformance import forked, shard_plugin
from conformance.report import rule_of
from conformance.torch_native import TorchNativeImplementation

REPO = Path(__file__).resolve().parents[1]


# shards of the peer's run. On the H200, six shards (61-124 s each) left the suite's step where four (75-148 s) had
# it, 281 s against 282 s, for 100 s more of work (2026-12-03). On CI's two cores one: each shard pays its own
# interpreter and collection (15 s on an AMD EPYC), and one run of about 150 s is far from the longest
# worker's share of the suite (2026-12-06)
SHARDS = 4 if torch.cuda.is_available() else 1
# The peer's tests each machine's run selects (module doc). A finding (a strict xfail, conformance/torch_native.py)
# is torch's own behaviour, so both machines check it, each against its torch (CI's 2.13, the GPU image's 2.11).
CPU_SELECTION = "not gpu and not slow"
GPU_SELECTION = "(gpu or slow or xfail) and not device_memory"


@pytest.mark.slow
@pytest.mark.requires("components")  # once, under the reference: it starts the run of the peer itself
@pytest.mark.parametrize("shard", range(SHARDS), ids=[f"shard-{i + 1}-of-{SHARDS}" for i in range(SHARDS)])
def test_the_suite_passes_against_torch_native(shard, tmp_path):
    report = tmp_path / "torch-native.json"
    cmd = [sys.executable, "-m", "pytest", "conformance", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
           "-p", "conformance.shard_plugin", "--impl", "torch-native", f"--ignore={Path(__file__).relative_to(REPO)}",
           "--ignore=conformance/test_faults.py", "--impl-tests-only", f"--conformance-report={report}"]  # fmt: skip
    cmd += ["-m", GPU_SELECTION if torch.cuda.is_available() else CPU_SELECTION]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}  # a run of its own
    env[shard_plugin.ENV] = f"{shard}/{SHARDS}"
    run = forked.run(cmd, env=env, timeout=1200)  # a fork: the imports of a fresh interpreter were 9 s on a CPU
    tail = "\n".join((run.stdout + run.stderr).strip().splitlines()[-15:])
    where = f"shard {shard + 1} of {SHARDS} of the torch-native run"
    assert run.returncode == 0, f"{where} exited {run.returncode}:\n{tail}"
    rules = json.loads(report.read_text())["rules"]
    assert sum(rule.get("passed", 0) for rule in rules.values()) > 0, tail


@pytest.mark.requires("components")
def test_the_two_machines_runs_of_the_peer_take_each_test_once_and_the_findings_on_both():
    """Which of the peer's tests CI's run and the GPU run select, as collected here (gpu tests are collected on a
    CPU too): together every test but the device-memory ones, none twice but the findings."""

    def selected(expression):
        cmd = [sys.executable, "-m", "pytest", "conformance", "--co", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
               "--impl", "torch-native", "--impl-tests-only", f"--ignore={Path(__file__).relative_to(REPO)}",
               "--ignore=conformance/test_faults.py", "-m", expression]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
        run = forked.run(cmd, env=env, timeout=300)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        return {line for line in run.stdout.splitlines() if "::" in line}

    cpu, gpu, every = selected(CPU_SELECTION), selected(GPU_SELECTION), selected("not device_memory")
    findings = {node for node in every if rule_of(node) in TorchNativeImplementation.findings}
    assert findings and cpu | gpu == every and cpu & gpu == findings, (len(cpu), len(gpu), len(every))


@pytest.mark.parametrize("count", [1, 3])
def test_the_shards_of_a_selection_hold_each_of_its_tests_once(count, monkeypatch):
    tests = [f"conformance/test_x.py::test_{i}" for i in range(10)]
    deselected, kept = [], []
    config = SimpleNamespace(hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)))
    for index in range(count):
        monkeypatch.setenv(shard_plugin.ENV, f"{index}/{count}")
        items = list(tests)
        shard_plugin.pytest_collection_modifyitems(config, items)
        kept += items
    assert sorted(kept) == sorted(tests) and len(set(kept)) == len(kept)  # each test in one shard
    assert len(deselected) == (count - 1) * len(tests)  # and reported deselected by the others


@pytest.mark.parametrize("value", ["", "4/4", "-1/4", "1/0", "a/b", "1/2/3"])
def test_a_bad_shard_is_a_usage_error_naming_the_variable(value):
    with pytest.raises(pytest.UsageError, match=r"^CONFORMANCE_SHARD=.*: expected I/N with 0 <= I < N"):
        shard_plugin.shard_of(value)


class _Item(SimpleNamespace):
    """What conformance/conftest.py's collection hook reads of a test item."""

    def get_closest_marker(self, name):
        return None

    def add_marker(self, marker):
        pass


@pytest.mark.parametrize("only", [False, True], ids=["whole", "impl_tests_only"])
def test_impl_tests_only_keeps_exactly_the_tests_that_take_the_implementation(only):
    from conformance import conftest
    from conformance.report import IMPLEMENTATION

    takes = _Item(nodeid="conformance/test_x.py::test_takes", fixturenames=["impl", "tmp_path"])
    plain = _Item(nodeid="conformance/test_x.py::test_plain", fixturenames=["tmp_path"])
    found = _Item(nodeid="conformance/test_x.py::test_found", fixturenames=["tmp_path"])  # a finding's test
    deselected, items = [], [plain, takes, found]
    config = SimpleNamespace(
        stash={IMPLEMENTATION: SimpleNamespace(findings={"test_x.py::test_found": "the peer does not"})},
        getoption=lambda name: {"impl_tests_only": only}[name],
        hook=SimpleNamespace(pytest_deselected=lambda items: deselected.extend(items)),
    )
    conftest.pytest_collection_modifyitems(config, items)
    assert (items, deselected) == (([takes, found], [plain]) if only else ([plain, takes, found], []))


@pytest.mark.parametrize("spec", ["fault:stop-token-not-checked", "conformance.test_peer_suite:_Undeclared"])
def test_impl_tests_only_refuses_an_implementation_whose_code_other_tests_may_run(spec):
    """A fault's patches reach every test, with or without the impl fixture (47 of 88 faults are caught only by
    tests without it), and a user's implementation may do the same unless it says otherwise."""
    from conformance.selection import check_impl_tests_only, load_implementation

    impl = load_implementation(spec)
    with pytest.raises(ValueError, match=rf"^--impl-tests-only: {impl.name} does not declare reached_only_through"):
        check_impl_tests_only(impl)


@pytest.mark.slow
def test_pytest_refuses_impl_tests_only_for_a_fault_in_one_line():
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "--co", "-q", "--impl-tests-only",
         "--impl", "fault:stop-token-not-checked", "conformance/test_once.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, run.stdout + run.stderr
    assert run.stderr.strip() == (
        "ERROR: --impl-tests-only: fault:stop-token-not-checked does not declare reached_only_through_impl = True, "
        "so tests without the impl fixture may run its code (a fault's patches reach every test); run without the "
        "option"
    )


@pytest.mark.parametrize("spec", ["reference", "torch-native"])
def test_impl_tests_only_takes_the_shipped_implementations(spec):
    from conformance.selection import check_impl_tests_only, load_implementation

    check_impl_tests_only(load_implementation(spec))


class _Undeclared:
    """An implementation of the user's that says nothing about its reach."""

    name = "undeclared"
    capabilities = frozenset()

    def compile(self, model, config):
        return model

    def activate(self):
        return contextlib.nullcontext()
