"""``./run mutate`` (conformance/mutation/): its arguments, its module map, and the counts of its results files.

Mutation testing itself is not run here (it takes minutes per module); these check the machinery around it.
"""

from __future__ import annotations

import glob
import os
from types import SimpleNamespace
import subprocess
import sys
from pathlib import Path

import pytest

from conformance import forked
from conformance.mutation import summary
from conformance.mutation.modules import MODULES

pytestmark = pytest.mark.requires("components")

ROOT = Path(__file__).resolve().parent.parent


def test_run_mutate_refuses_an_unknown_module_in_one_line_with_exit_status_2():
    # what ./run mutate runs, in this interpreter: ./run itself would first make its .venv where none exists
    # (a machine with no package index, such as the GPU runner, cannot)
    cmd = [sys.executable, "-m", "conformance.mutation", "no.such.module"]
    proc = forked.run(cmd)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "'no.such.module'" in proc.stderr and "config" in proc.stderr and "engine.sampling" in proc.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--workers", "abc"], "argument --workers: expected an int >= 1, got 'abc'"),
        (["--workers", "0"], "argument --workers: expected an int >= 1, got '0'"),
        (["config", "config"], "module: 'config' given twice; give each module once"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--resume", "--survivors", "config"], "give --resume or --survivors, not both"),
    ],
)
def test_bad_arguments_are_one_line_naming_what_is_wrong(args, message):
    proc = forked.run([sys.executable, "-m", "conformance.mutation", *args])
    assert (proc.returncode, proc.stderr) == (2, f"./run mutate: {message}\n")


def test_a_bad_thread_count_is_refused_before_any_run_starts():
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "abc"}
    proc = subprocess.run([sys.executable, "-m", "conformance.mutation", "config"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert (proc.returncode, proc.stderr) == (2, "./run mutate: TORCHINDUCTOR_COMPILE_THREADS='abc': expected a "
                                                 "whole number of threads >= 1, or leave it unset\n")  # fmt: skip


@pytest.mark.parametrize("name", MODULES)
def test_every_module_mutates_existing_files_and_names_existing_test_files(name):
    module = MODULES[name]
    for pattern in module.sources:
        assert glob.glob(str(ROOT / pattern)), f"{name}: {pattern} matches no file"
    for tests in module.tests:
        test_file, _, test = tests.partition("::")  # a file, or one test of it by node id
        assert (ROOT / test_file).is_file(), f"{name}: no {test_file}"
        assert not test or f"\ndef {test}(" in (ROOT / test_file).read_text(), f"{name}: no {test} in {test_file}"


def test_mutmuts_result_lines_are_read_with_their_status():
    output = "    reference.a.x_f__mutmut_1: killed\n    reference.a.xǁCǁg__mutmut_2: no tests\nnoise\n"
    expected = {"reference.a.x_f__mutmut_1": "killed", "reference.a.xǁCǁg__mutmut_2": "no tests"}
    assert summary.parse_results(output) == expected


def test_the_score_leaves_equivalent_mutants_out_and_counts_unreached_ones_against_it():
    statuses = {"k1": "killed", "k2": "killed", "t": "timeout", "s": "survived", "e": "survived", "n": "no tests",
                "gone": "killed", "u": "not checked"}
    row = summary.count(statuses, {"e": "same value either way", "gone": "was equivalent"})
    assert (row["killed"], row["timeout"], row["survived"], row["no tests"], row["equivalent"]) == (3, 1, 1, 1, 1)
    assert row["other"] == 1 and row["mutants"] == 8
    assert row["score"] == round(4 / 6, 4)
    assert row["open"] == ["n: no tests", "s: survived"]
    assert row["stale_equivalent"] == ["gone"]  # listed as equivalent, but a test kills it


def test_an_equivalent_mutant_without_a_reason_is_refused_naming_the_line(tmp_path):
    path = tmp_path / "equivalent.txt"
    path.write_text("# comment\nreference.a.x_f__mutmut_1  the same value\nreference.a.x_f__mutmut_2\n")
    with pytest.raises(ValueError, match=r"^equivalent.txt:3: expected 'MUTANT_NAME  REASON'"):
        summary.load_equivalent(path)


def test_every_committed_equivalent_mutant_names_a_mutant_of_the_package_and_a_reason():
    """mutmut's names (``reference.<module>.x_<function>__mutmut_<n>``) or a hand-written CUDA mutant's."""
    from conformance.mutation.cuda_mutants import MUTANTS

    cuda = {m.name for m in MUTANTS}
    for name, reason in summary.load_equivalent().items():
        assert (name.startswith("reference.") and "__mutmut_" in name or name in cuda) and reason, name


def test_survivors_needs_an_earlier_run_of_the_module(tmp_path, monkeypatch):
    from conformance.mutation import __main__ as mutate, workspace

    monkeypatch.setattr(workspace, "WORK", tmp_path)  # no module has run here
    with pytest.raises(SystemExit) as exit_info:
        mutate._arguments(["--survivors", "config"])
    assert exit_info.value.code == 2


def test_survivors_re_tests_exactly_the_mutants_left_alive_and_records_the_row(tmp_path, monkeypatch):
    """The names go to ``mutmut run`` (which re-tests a mutant only when named), killed ones stay killed."""
    from conformance.mutation import __main__ as mutate, workspace

    before = ("    m.x__mutmut_1: killed\n    m.x__mutmut_2: survived\n    m.x__mutmut_3: no tests\n"
              "    m.x__mutmut_4: not checked\n")  # fmt: skip
    after = ("    m.x__mutmut_1: killed\n    m.x__mutmut_2: killed\n    m.x__mutmut_3: no tests\n"
             "    m.x__mutmut_4: killed\n")  # fmt: skip
    commands, recorded = [], {}

    def fake_run(command, **kwargs):
        commands.append(command[3:])  # after MUTMUT's interpreter and -c script
        output = after if any("m.x__mutmut_2" in c for c in commands[:-1]) else before
        return SimpleNamespace(returncode=0, stdout=output)

    monkeypatch.setattr(workspace, "prepare", lambda name, fresh: tmp_path)
    monkeypatch.setattr(mutate.metadata, "version", lambda name: "3.8.1")  # CI and the GPU host lack mutmut
    monkeypatch.setattr(mutate.subprocess, "run", fake_run)
    monkeypatch.setattr(mutate.summary, "record", lambda name, row: recorded.update({name: row}))
    # checked out when mutmut copies the sources; a commit made while it runs comes after
    monkeypatch.setattr(mutate, "_commit", lambda: "def5678" if any(c[0] == "run" for c in commands) else "abc1234")
    assert mutate.run_module("config", fresh=False, workers=1, survivors=True) == 0
    assert recorded["config"]["commit"] == "abc1234"  # the sources mutmut copied, not a later commit's
    runs = [c for c in commands if c[0] == "run"]
    assert runs == [["run", "--max-children", "1", "m.x__mutmut_2", "m.x__mutmut_3", "m.x__mutmut_4"]]
    assert (recorded["config"]["killed"], recorded["config"]["no tests"]) == (3, 1)
