"""The fault catalogue (conformance/faults/): the suite must reject every CPU-visible fault it plants.

Each CPU fault runs in a pytest process of its own (a fork of a preloaded server, conformance/forked.py), through the
same function ``python -m conformance.faults`` uses (``run_fault``), and must be caught: one of the tests its ``-k``
expression selects must fail (an error does not count). That run ignores this file. The catalogue itself is checked
too: enough faults, unique ids, known kinds and devices, patches that enter and leave, expressions that select tests.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import cores, forked
from conformance.faults import FAULTS, KINDS
from conformance.faults.__main__ import main as faults_main
from conformance.faults import run
from conformance.faults.run import run_fault, selected_tests
from conformance.once import computed_once

pytestmark = pytest.mark.requires("components")  # the catalogue plants its faults in the reference

ROOT = Path(__file__).resolve().parents[1]
CPU_FAULTS = [f for f in FAULTS if f.device == "cpu"]


def test_the_catalogue_has_at_least_25_faults_with_unique_ids_known_kinds_and_devices():
    ids = [f.id for f in FAULTS]
    assert len(FAULTS) >= 25, f"{len(FAULTS)} faults"
    assert len(set(ids)) == len(ids), sorted(i for i in ids if ids.count(i) > 1)
    assert {f.kind for f in FAULTS} <= set(KINDS)
    assert {f.device for f in FAULTS} <= {"cpu", "cuda"}
    # ids name tests here and in the CLI; kebab-case keeps them from reading as the no_inductor mode (-k)
    assert all(i == i.lower() and "_" not in i and " " not in i for i in ids), ids
    assert all(f.tests and f.description for f in FAULTS)  # every fault names the tests that must catch it


@pytest.mark.parametrize("fault", FAULTS, ids=[f.id for f in FAULTS])
def test_a_fault_plants_and_removes_its_patches(fault):
    """A patch of a name the reference no longer has fails here (mock refuses it), not in every test of the
    fault's run, where an error would hide that nothing was planted."""
    with fault.plant():
        pass


@pytest.fixture(scope="session")
def cpu_selection(request) -> run.Selection:
    """What each CPU fault's -k selects on cpu: one collection for the whole session, whichever xdist worker
    needs it first (a module-scoped fixture was collected again each time a worker came back to this module
    from another: four collections of half a minute each on a 2-core AMD EPYC, 2026-12-06)."""
    return computed_once(request, "cpu faults' selection", lambda: selected_tests(CPU_FAULTS, "cpu"))


@pytest.mark.slow
def test_every_cpu_faults_tests_select_at_least_one_test(cpu_selection):
    selected = cpu_selection.tests
    empty = [f.id for f in CPU_FAULTS if not selected[f.id]]
    assert not empty, f"these faults' -k expressions select no test on cpu: {empty}"
    assert not any(node.startswith("conformance/test_faults.py") for nodes in selected.values() for node in nodes)


@pytest.mark.faults
@pytest.mark.parametrize(
    "fault",
    # the parallel faults' tests launch torchrun: 3-5x the others
    [pytest.param(f, id=f.id, marks=[pytest.mark.slow] if f.kind == "parallel" else []) for f in CPU_FAULTS],
)
def test_the_suite_catches(fault, cpu_selection):
    jobs = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # faults running at once share the cores
    test, note = run_fault(fault, "cpu", jobs, cpu_selection.tests[fault.id])
    assert test, note


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--only", "no-such-fault"], r"--only: unknown fault\(s\) \['no-such-fault'\]; --list prints the ids"),
        (["--jobs", "0"], "--jobs: must be at least 1, got 0"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--only", ""], r"--only: empty; give comma-separated ids"),  # ran the whole catalogue
        (["--list", "--jobs", "0"], "--jobs: must be at least 1, got 0"),  # --list skipped every check
        (["--list", "--only", "nope"], r"--only: unknown fault\(s\) \['nope'\]"),
    ],
)
def test_bad_arguments_are_one_line_with_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        faults_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and re.search(message, err), err


def test_list_prints_each_fault_id_for_the_device(capsys):
    assert faults_main(["--list", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split() == [f.id for f in FAULTS if f.device == "cpu"]


def test_list_prints_only_the_faults_only_names(capsys):
    ids = [f.id for f in CPU_FAULTS[:2]]
    assert faults_main(["--list", "--only", ",".join(reversed(ids))]) == 0
    assert capsys.readouterr().out.split() == ids  # the catalogue's order


def test_the_cli_starts_launching_faults_then_those_with_a_long_test_then_the_rest(monkeypatch, capsys):
    """Longest first: a long run started in the last round would run on alone after every other fault."""
    from conformance.faults import __main__ as cli

    quick, long_one = [f for f in CPU_FAULTS if f.kind != "parallel"][:2]
    launch = next(f for f in CPU_FAULTS if f.kind == "parallel")
    selection = run.Selection({f.id: [f"conformance/test_{f.id}.py::t"] for f in (quick, long_one, launch)},
                              frozenset({f"conformance/test_{long_one.id}.py::t"}))  # fmt: skip
    started = []
    monkeypatch.setattr(cli, "selected_tests", lambda faults, device: selection)
    monkeypatch.setattr(cli, "run_fault", lambda fault, *args: started.append(fault.id) or ("t", ""))
    assert cli.main(["--jobs", "1", "--only", ",".join(f.id for f in (quick, long_one, launch))]) == 0
    assert started == [launch.id, long_one.id, quick.id]
    assert capsys.readouterr().out.splitlines()[-1] == "3 caught, 0 survived"


def test_the_selection_marks_inductor_compiling_tests_long(cpu_selection):
    nodes = cpu_selection.tests["cache-key-ignores-compile-sizes"]
    assert nodes and set(nodes) <= cpu_selection.long  # its tests compile with Inductor
    assert cpu_selection.long <= {node for nodes in cpu_selection.tests.values() for node in nodes}
    assert not cpu_selection.is_long("rope-adjacent-pairs")


def test_a_faults_run_collects_only_the_files_of_its_selected_tests(monkeypatch):
    """Collecting the whole suite was half of each fault's run on a CPU; the -k expression still applies."""
    runs = []
    no_tests = subprocess.CompletedProcess([], 5, "", "")
    monkeypatch.setattr(forked, "run", lambda cmd, env: runs.append(cmd[3:]) or no_tests)
    fault = CPU_FAULTS[0]
    selected = ["conformance/test_b.py::test_x[a]", "conformance/test_a.py::test_y", "conformance/test_b.py::test_z"]
    run_fault(fault, "cpu", 1, selected)
    (argv,) = runs
    assert argv[:2] == ["conformance/test_a.py", "conformance/test_b.py"] and "conformance" not in argv
    assert argv[argv.index("-k") + 1] == fault.tests


def test_a_faults_run_does_not_shrink_hypothesis_examples_nor_keep_them(monkeypatch):
    """A fault's verdict is whether a test fails; shrinking the first failing example took 22 of the 25 s of
    row-handed-out-in-its-last-step's run on a 2-core AMD EPYC."""
    from hypothesis import Phase, settings

    runs = []
    monkeypatch.setattr(forked, "run", lambda cmd, env: runs.append(cmd) or subprocess.CompletedProcess([], 5, "", ""))
    run_fault(CPU_FAULTS[0], "cpu", 1, ["conformance/test_a.py::test_y"])
    (argv,) = runs
    assert "--hypothesis-profile=faults" in argv
    profile = settings.get_profile("faults")
    assert Phase.generate in profile.phases and Phase.shrink not in profile.phases
    assert profile.database is None  # no examples that earlier runs saved


def test_a_faults_run_and_the_selection_leave_assertions_unrewritten(monkeypatch, tmp_path):
    """Rewriting words a failed assert's message; the verdict is which test failed, and a collection runs no
    assert at all. Without a bytecode cache (PYTHONDONTWRITEBYTECODE) each run rewrote its test modules and
    pytest's plugins again: 0.4 s of a fault's 1.5 s, 6 s of the selection's 17 (2-core AMD EPYC, 2026-12-06)."""
    runs = []

    def fake_run(cmd, env):
        runs.append(cmd)
        if "--collect-only" in cmd:
            Path(env["FAULT_SELECTION_OUT"]).write_text(json.dumps({"selected": {}, "long": []}))
        return subprocess.CompletedProcess([], 5, "", "")

    monkeypatch.setattr(forked, "run", fake_run)
    run_fault(CPU_FAULTS[0], "cpu", 1, ["conformance/test_a.py::test_y"])
    selected_tests(CPU_FAULTS[:1], "cpu")
    assert len(runs) == 2 and all("--assert=plain" in cmd for cmd in runs), runs


def test_a_fault_whose_expression_selects_nothing_survives_without_running_the_suite(monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *args, **kwargs: pytest.fail("ran pytest for no test"))
    monkeypatch.setattr(forked, "run", lambda *args, **kwargs: pytest.fail("ran pytest for no test"))
    test, note = run_fault(CPU_FAULTS[0], "cpu", 1, [])
    assert test is None and "selects no test on cpu" in note


def test_a_faults_run_is_no_xdist_worker_even_when_started_from_one(monkeypatch):
    """Inheriting PYTEST_XDIST_WORKER, a fault's run took itself for a worker of the suite that started it."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    assert not [name for name in run._environment("cpu", 2) if name.startswith("PYTEST_XDIST")]


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", cores.COMPILE_THREADS])
def test_the_fault_run_refuses_a_bad_thread_count_in_one_line_before_it_starts(variable):
    """Inductor's config fails on a bad TORCHINDUCTOR_COMPILE_THREADS when the catalogue imports it."""
    env = {**os.environ, variable: "four"}
    proc = subprocess.run([sys.executable, "-m", "conformance.faults", "--list"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[-1] == (f"python -m conformance.faults: error: {variable}='four': expected a "
                                            "whole number of threads >= 1, or leave it unset")  # fmt: skip


def test_faults_running_at_once_share_the_cores_this_process_may_use(monkeypatch):
    """os.cpu_count() counts the machine's cores, not the ones taskset or a container's cpuset allow."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {2, 3, 5, 7})
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.delenv(cores.COMPILE_THREADS, raising=False)
    env = run._environment("cpu", 2)
    assert env["OMP_NUM_THREADS"] == env[cores.COMPILE_THREADS] == "2"  # threads and Inductor's compile workers

