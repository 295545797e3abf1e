"""``python -m conformance.mutation.cuda``: the hand-written CUDA mutants still apply, and the runner judges as
mutmut does. The mutants themselves run on a GPU machine; here the machinery runs on a CPU edit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance import forked
from conformance.mutation import cuda
from conformance.mutation.cuda_mutants import MUTANTS, Mutant

pytestmark = pytest.mark.requires("components")

ROOT = Path(__file__).resolve().parents[1]
ROPE = "reference/models/rope.py"


def test_every_mutant_edits_text_that_is_in_its_file_once_and_names_tests_that_exist():
    """A refactor that moves a mutant's line would turn it into an 'other' on the GPU machine, found too late."""
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) and all(m.name.startswith("cuda.") for m in MUTANTS)
    for mutant in MUTANTS:
        assert (ROOT / mutant.path).read_text().count(mutant.old) == 1, mutant.name
        assert mutant.new != mutant.old and mutant.what, mutant.name
        assert mutant.tests and all((ROOT / test).is_file() for test in mutant.tests), mutant.name


def _rope_mutant(old: str, new: str) -> Mutant:
    return Mutant("cpu.rope", ROPE, old, new, ("conformance/test_rope.py",), "a CPU stand-in")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("old", "new", "marker", "verdict"),
    [
        ("return 1.0 / (theta**exponents), 1.0", "return theta**-exponents, 1.0", "not gpu", "killed"),
        # the same frequencies, rounded otherwise: test_rope compares bitwise
        ("UNSCALED = \"default\"  # transformers' name", "UNSCALED = \"default\"  # the name", "not gpu", "survived"),
        ("UNSCALED = \"default\"  # transformers' name", "UNSCALED = \"default\"  # the name", "gpu", "no tests"),
        ("text that is not in the file", "anything", "not gpu", "other"),
    ],
    ids=["killed", "survived", "no-tests", "stale"],
)  # fmt: skip
def test_a_mutant_is_judged_by_its_tests_in_a_copy_of_the_tree(old, new, marker, verdict, monkeypatch):
    monkeypatch.setenv("REFERENCE_ALLOW_EMPTY_SELECTION", "1")  # as tox -e gpu sets it: no-tests must stay no-tests
    before = (ROOT / ROPE).read_text()
    assert verdict == "other" or before.count(old) == 1  # the stand-in edits follow rope.py
    mutant = _rope_mutant(old, new)
    got, tail = cuda.judge(mutant, mutant.tests, marker, jobs=2, timeout=300)
    assert got == verdict, tail
    assert (ROOT / ROPE).read_text() == before  # the edit was made in the copy only
    if verdict == "other":
        assert tail == f"cpu.rope: its text is in {ROPE} 0 times, expected once"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--only", "cuda.nope"], "--only: unknown mutant(s) ['cuda.nope']; --list prints the names"),
        (["--only", ""], "--only: unknown mutant(s) ['']; --list prints the names"),
        (["--jobs", "0"], "--jobs: expected an int >= 1, got 0"),
        (["--timeout", "-1"], "--timeout: expected seconds in (0, 86400], got -1.0"),
        (["--timeout", "nan"], "--timeout: expected seconds in (0, 86400], got nan"),
        (["--timeout", "inf"], "--timeout: expected seconds in (0, 86400], got inf"),
    ],
)
def test_bad_arguments_are_one_line_with_exit_status_2(args, message):
    run = forked.run([sys.executable, "-m", "conformance.mutation.cuda", *args])
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and message in run.stderr, run.stderr


def test_list_names_every_mutant_and_what_it_breaks():
    run = forked.run([sys.executable, "-m", "conformance.mutation.cuda", "--list"])
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines() == [f"{m.name}  {m.what}" for m in MUTANTS]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_without_a_cuda_device_it_refuses_in_one_line():
    run = forked.run([sys.executable, "-m", "conformance.mutation.cuda", "--only", MUTANTS[0].name])
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "sees no CUDA device" in run.stderr, run.stderr


def _main_with(verdicts, monkeypatch, *args):
    """cuda.main (with ``args``) over a set of MUTANTS[:3], each run's verdict from ``verdicts`` (keyed by
    mutant name, None for an unmutated tree), the CUDA check passed; (exit status, the row recorded or None)."""
    recorded = {}
    monkeypatch.setattr(cuda, "MUTANTS", MUTANTS[:3])
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(cuda, "judge", lambda mutant, *rest: (verdicts[mutant and mutant.name], "its output"))
    monkeypatch.setattr(cuda.summary, "record", lambda module, row: recorded.update({module: row}))
    status = cuda.main(["--jobs", "2", *args])
    return status, recorded.get(cuda.MODULE)


def test_the_row_counts_each_verdict_and_names_the_survivors(monkeypatch):
    first, second, third = (m.name for m in MUTANTS[:3])
    status, row = _main_with({None: "survived", first: "killed", second: "survived", third: "timeout"}, monkeypatch)
    assert status == 0
    assert (row["killed"], row["survived"], row["timeout"], row["mutants"]) == (1, 1, 1, 3)
    assert row["open"] == [f"{second}: survived"] and row["score"] == round(2 / 3, 4)
    assert row["mutmut"] == "hand-written"


def test_nothing_is_counted_when_the_unmutated_tree_fails_its_tests(monkeypatch, capsys):
    status, row = _main_with({None: "killed", **{m.name: "killed" for m in MUTANTS[:3]}}, monkeypatch)
    assert status == 1 and row is None
    assert "the unmutated tree fails its tests; nothing counted" in capsys.readouterr().err


def test_the_mutants_runs_select_the_cuda_cases_but_not_those_that_need_the_device_alone():
    graph_tests = next(m.tests for m in MUTANTS if m.path.endswith("cuda_graph.py"))
    collect = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "--assert=plain", "-m"]
    run = forked.run([*collect, cuda.MARKER, *graph_tests])
    ids = [line for line in run.stdout.splitlines() if "::" in line]
    assert run.returncode == 0 and ids, run.stdout[-2000:]
    every = forked.run([*collect, "device_memory", *graph_tests])
    memory = {line for line in every.stdout.splitlines() if "::" in line}
    assert memory and not memory & set(ids), sorted(memory & set(ids))  # device-memory tests exist, none selected


def test_a_run_of_some_mutants_records_nothing(monkeypatch, capsys):
    """The results files hold the whole set's row: a run of one mutant must not replace it with its 100%."""
    verdicts = {None: "survived", **{m.name: "killed" for m in MUTANTS[:3]}}
    status, row = _main_with(verdicts, monkeypatch, "--only", MUTANTS[0].name)
    assert status == 0 and row is None
    assert "--only: 1 killed, 0 survived of 1; not recorded" in capsys.readouterr().out
