"""The start-up benchmark (``python -m reference.bench_startup``): every start in a fresh process, a cold start
that really starts from an empty compiler cache and a warm one that really reads it, the documented JSON, and
one-line errors for bad flags."""

import importlib.util
import json
import os
import py_compile
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from reference import bench_startup
from reference.bench_startup import COLUMNS, main
from reference.benchmark import startup
from reference.benchmark.machine import COMPILER_MODULES
from reference.benchmark.startup import PHASES, StartupError, StartupSettingsError, cache_environment, measure_mode
from reference.config import mode_config

pytestmark = pytest.mark.requires("components")

ERROR = "python -m reference.bench_startup: error: "
ROOT = Path(__file__).resolve().parents[1]
TINY = {"model": "llama-tiny", "device": "cpu", "dtype": "float32", "batch_size": 2, "input_len": 4}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "eager,nope"], "argument --modes: unknown ['nope']; choose from eager,"),
        (["--modes", ""], "argument --modes: no mode given in ''"),
        (["--batch-size", "0"], "argument --batch-size: expected an int >= 1, got '0'"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--device", "tpu"], "argument --device: "),
        (["--model", "no-such-model"], "argument --model: "),
        (["--cache-dir", ""], "argument --cache-dir: "),
    ],
    ids=["unknown-mode", "no-mode", "zero-batch", "dtype", "device", "model", "empty-cache-dir"],
)
def test_a_bad_flag_is_one_line_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(ERROR + message) and err.endswith(" (see --help)\n") and len(err.splitlines()) == 1, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--modes", "eager", "-O.custom_ops=['none']"], "--compilation-config applies only to compiled modes"),
        (["--modes", "no_inductor", "-O.use_inductor=true"], "--compilation-config: sets use_inductor, which --modes"),
        (["--modes", "no_inductor", "-O.use_inductor_graph_partition=true"],
         "--compilation-config: with mode 'no_inductor': use_inductor_graph_partition"),
        (["-O.custom_ops=['+flash_norm']"], "argument --compilation-config: custom_ops: unknown op 'flash_norm'"),
        (["-O3", "--modes", "eager"], "-O3 selects --modes inductor_full (vLLM's optimization level), and --modes"),
        (["-O7"], "-O: optimization level expected 0, 1, 2 or 3, got '7'"),
        (["--modes", "inductor", "-O.compile_sizes=[4]", "--batch-size", "2"],
         "--compilation-config: with mode 'inductor': compile_sizes [4] never run"),
        (["--modes", "no_inductor", "-O.cache_dir=/tmp/x"],
         "--compilation-config: cache_dir is where bench_startup keeps each mode's caches, emptied before its cold"),
    ],
    ids=["eager-takes-none", "mode-defining", "partition-without-inductor", "unknown-op", "level-and-modes",
         "bad-level", "compile-size-never-run", "a-cache-dir-of-its-own"],
)  # fmt: skip
def test_a_config_override_that_cannot_apply_is_refused_before_any_start(argv, message, capsys, monkeypatch):
    """The flags bench_latency takes, checked as it checks them, before any child starts."""
    monkeypatch.setattr(startup, "measure_mode", lambda spec, cache_dir: pytest.fail("a start ran"))
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(ERROR + message) and err.endswith(" (see --help)\n") and len(err.splitlines()) == 1, err


def test_config_overrides_reach_each_compiled_start_and_the_file_records_them(tmp_path, monkeypatch):
    """``-O.FIELD=VALUE`` changes what a start runs (here Inductor's graph partition, issue 22's comparison
    with the FX split), and the file says so; ``-O2`` is the mode vLLM's level 2 stands for."""
    specs = []
    monkeypatch.setattr(startup, "measure_mode", lambda spec, cache_dir: specs.append(spec) or _fake_rows(spec["mode"]))
    out = tmp_path / "startup.json"
    main(["-O2", "-O.use_inductor_graph_partition=true", "--device", "cpu", "--output-json", str(out)])
    assert [(s["mode"], s["overrides"]) for s in specs] == [("inductor_full", {"use_inductor_graph_partition": True})]
    doc = json.loads(out.read_text())
    assert doc["settings"]["compilation_config_overrides"] == {"use_inductor_graph_partition": True}


@pytest.mark.breakable
def test_a_childs_config_is_its_modes_with_the_overrides_and_its_row_records_it():
    row = startup._child({**TINY, "mode": "breakable", "overrides": {"cudagraph_capture_sizes": [1, 3]}})
    assert row["compilation_config"]["cudagraph_capture_sizes"] == [1, 3]
    assert row["compilation_config"]["cudagraph_mode"] == "piecewise"  # the mode's own field kept
    assert startup._child({**TINY, "mode": "breakable"})["compilation_config"]["cudagraph_capture_sizes"] != [1, 3]


def test_paths_that_cannot_be_used_are_refused_before_any_start(tmp_path, capsys):
    """An unwritable output was a traceback after every start had run, an unusable cache folder a child's
    traceback, a cache path with a space an Inductor C++ compile that failed (torch passes it unquoted)."""
    a_file = tmp_path / "file"
    a_file.write_text("")
    spaced = tmp_path / "cache dir"
    for argv, message in (
        (["--cache-dir", str(a_file)], f"--cache-dir: '{a_file}' is a file, not a folder"),
        (["--output-json", str(tmp_path)], f"--output-json: '{tmp_path}' is a directory; give a file path"),
        (["--output-json", "/proc/startup.json"], "--output-json: cannot write in '/proc' ("),
        (["--cache-dir", "/proc/cache"], "--cache-dir: cannot write in '/proc/cache': cannot make a folder in '/proc'"),
        (["--cache-dir", str(spaced)], f"--cache-dir: '{spaced}' has a space, which Inductor's C++ compile"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["--modes", "eager", *argv])
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert err.startswith(ERROR + message) and err.endswith(" (see --help)\n") and len(err.splitlines()) == 1


@pytest.mark.slow
@pytest.mark.eager
@pytest.mark.breakable
def test_the_cli_writes_a_cold_and_a_warm_row_per_mode_with_every_phase(tmp_path, capsys):
    out, cache = tmp_path / "startup.json", tmp_path / "cache"
    argv = ["--modes", "eager,breakable", "--batch-size", "2", "--input-len", "4", "--device", "cpu"]
    main([*argv, "--cache-dir", str(cache), "--output-json", str(out)])
    doc = json.loads(out.read_text())
    assert doc["model"] == "llama-tiny" and doc["settings"]["device"] == "cpu"
    assert [(r["mode"], r["start"]) for r in doc["rows"]] == [
        ("eager", "cold"), ("eager", "warm"), ("breakable", "cold"), ("breakable", "warm"),
    ]  # fmt: skip
    for row in doc["rows"]:
        assert all(row[phase] >= 0 for phase in PHASES), row
        assert row["ready_s"] == pytest.approx(row["compile_s"] + row["capture_s"])
        assert row["import_s"] > 0.1, row  # each start imported torch itself: a fresh process
    assert {"torch", "commit", "date", "command", "cpu"} <= set(doc["env"])
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].startswith("| mode | start | " + " | ".join(c.removesuffix("_s") for c in COLUMNS))


@pytest.mark.slow
@pytest.mark.inductor
@pytest.mark.skipif(
    torch.cuda.is_available(),
    reason="its starts run on the CPU (TINY's device), as in CPU CI; on the GPU machine's shared cores the same "
    "run was the suite's longest test",
)
def test_a_cold_start_compiles_everything_and_a_warm_start_reads_the_cache_it_left(tmp_path):
    """A cold start that read an older cache, or a warm start that did not find the cold one's, would make
    the table's two columns say nothing. The cold start must also empty the mode's folder it is given. Warm,
    the project's compile cache serves the whole split graph, so Inductor compiles nothing; the suite's own
    switch (the cache off) must not reach the starts."""
    stale = tmp_path / "inductor" / "reference" / "stale-entry"  # in the inductor mode's own cache folder
    stale.parent.mkdir(parents=True)
    stale.write_text("from an older run")
    (tmp_path / "inductor" / startup.MARK_FILE).write_text("")  # the older run's folder
    cold, warm = measure_mode({**TINY, "mode": "inductor"}, tmp_path)
    assert not stale.exists()
    assert cold["compile_cache_hits"] == 0 and cold["inductor_cache_misses"] > 0, cold
    assert cold["inductor_cache_hits"] == 0, cold
    assert warm["compile_cache_hits"] == 1 and warm["inductor_cache_misses"] == 0, warm  # loading counts as hits
    assert cold["compile_cache_warnings"] == warm["compile_cache_warnings"] == []


def test_a_prompt_longer_than_the_model_is_refused_before_any_start(capsys):
    """It was an IndexError from the rotary table in the child, 10 s later (llama-tiny: 512 positions)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "eager", "--input-len", "512"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        f"{ERROR}--input-len 512: a prompt and its decode token need 513 positions; llama-tiny has 512 "
        "(max_position_embeddings) (see --help)\n"
    )


def _fake_rows(mode, warm_hits=1, warnings=((), ())):
    """measure_mode's two rows, the warm one served by the compile cache (``warm_hits``) where the mode traces."""
    level = mode_config(mode).level if mode != "eager" else 0
    return [{"mode": mode, "start": s, **{p: 0.5 for p in PHASES}, "ready_s": 1.0, "dtype": "float32",
             "compile_cache_hits": warm_hits if s == "warm" and level >= 2 else 0, "inductor_cache_hits": 0,
             "inductor_cache_misses": 0, "capture_sizes": [], "compilation_config": {"level": level},
             "compile_cache_warnings": list(said)} for s, said in zip(("cold", "warm"), warnings)]  # fmt: skip


def test_the_compile_caches_warnings_are_read_from_a_childs_stderr_as_pythons_warnings_print_them():
    said = ["could not write the entry abc (Permission denied); this start is not cached", "entry xyz unusable"]
    stderr = "".join(warnings.formatwarning(f"compile cache: {text}", RuntimeWarning, "/r/capture.py", 213)
                     for text in [said[0], said[1], said[0]])  # fmt: skip
    stderr += warnings.formatwarning("something else", UserWarning, "/r/x.py", 1)
    assert startup.compile_cache_warnings(stderr) == [f"compile cache: {text}" for text in said]  # once each


@pytest.mark.parametrize(
    "mode, warm_hits, warnings_, note",
    [
        ("no_inductor", 1, ((), ()), None),
        ("breakable", 0, ((), ()), None),  # level 0: no compile cache, its warm row is what it is
        ("no_inductor", 0, (("compile cache: could not write",), ()), "(cold start: compile cache: could not write)"),
        ("inductor", 0, ((), ("compile cache: unusable",)), "(warm start: compile cache: unusable)"),
        ("no_inductor_full", 0, ((), ()), "(neither start printed a compile cache warning)"),
        ("inductor_full", 0, (("compile cache: a; b",), ("compile cache: c",)),
         "(cold start: compile cache: a; b | warm start: compile cache: c)"),
    ],
    ids=["hit", "level-0", "cold-could-not-write", "warm-could-not-read", "no-warning", "both-starts"],
)
def test_a_warm_start_the_compile_cache_did_not_serve_is_a_note_naming_the_caches_warnings(
    tmp_path, capsys, monkeypatch, mode, warm_hits, warnings_, note
):
    """Its row says only "no" under "compile cache hit"; a reader took it for a slow warm start (a new user's
    try, perf/NOTES.md v46)."""
    monkeypatch.setattr(startup, "measure_mode", lambda spec, cache_dir: _fake_rows(spec["mode"], warm_hits, warnings_))
    main(["--modes", mode, "--device", "cpu"])
    notes = [line for line in capsys.readouterr().err.splitlines() if "not served by the compile cache" in line]
    if note is None:
        assert notes == []
    else:
        assert notes == [f"python -m reference.bench_startup: note: {mode}'s warm start was not served by the "
                         f"compile cache, so its row is a second cold start {note}"]  # fmt: skip


@pytest.mark.parametrize(
    "failure, code, said",
    [(StartupError("breakable (cold start): exit 1: boom"), 1, "error: breakable (cold start): exit 1: boom"),
     # the settings' fault, as bench_latency's exit 2 for the same config (a new user found 1 here, 2 there)
     (StartupSettingsError("breakable (cold start): batch too big"), 2, "error: breakable (cold start): batch too big"),
     # the engine's names in the flags' terms (a new user's try): a start's max_model_len is the prompt + 1
     (StartupSettingsError("breakable (cold start): max_num_seqs x max_model_len (9 x 33): ...; lower either"), 2,
      "max_model_len (9 x 33): ...; lower either (here max_num_seqs is --batch-size, max_model_len --input-len + 1)"),
     (KeyboardInterrupt(), 130, "interrupted during breakable; the finished modes are above")],
    ids=["a-mode-fails", "the-settings-refused", "memory-refused", "ctrl-c"],
)  # fmt: skip
def test_the_modes_that_finished_are_kept_when_a_later_one_fails_or_is_interrupted(
    tmp_path, capsys, monkeypatch, failure, code, said
):
    """A failing mode, or Ctrl-C, threw away the rows of the modes before it (and Ctrl-C was a traceback)."""

    def measure(spec, cache_dir):
        if spec["mode"] == "breakable":
            raise failure
        return _fake_rows(spec["mode"])

    monkeypatch.setattr(startup, "measure_mode", measure)
    out = tmp_path / "startup.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "eager,breakable,no_inductor", "--device", "cpu", "--output-json", str(out)])
    assert exit_info.value.code == code
    captured = capsys.readouterr()
    assert [line.split(" | ")[0] for line in captured.out.splitlines()[2:]] == ["| eager", "| eager"]
    assert said in captured.err.splitlines()[-1] and "Traceback" not in captured.err
    doc = json.loads(out.read_text())
    assert [r["mode"] for r in doc["rows"]] == ["eager", "eager"] and said.split(":")[-1].strip() in json.dumps(doc)


@pytest.mark.parametrize(
    "failure, code, said",
    [(KeyboardInterrupt, 130, "interrupted during eager; no mode had finished"),
     (bench_startup._Terminated, 143, "terminated during eager; no mode had finished")],
    ids=["ctrl-c", "sigterm"],
)  # fmt: skip
def test_a_run_stopped_in_its_first_mode_says_that_none_finished(tmp_path, capsys, monkeypatch, failure, code, said):
    """Stopped during the first mode, the run said "the finished modes are above" over nothing (a new user's
    try): it says that no mode had finished, prints no table and writes no file."""

    def measure(spec, cache_dir):
        raise failure()

    monkeypatch.setattr(startup, "measure_mode", measure)
    out = tmp_path / "startup.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "eager,no_inductor", "--device", "cpu", "--output-json", str(out)])
    captured = capsys.readouterr()
    assert exit_info.value.code == code and captured.out == "" and not out.exists()
    assert captured.err.splitlines()[-1] == f"python -m reference.bench_startup: {said}"


@pytest.mark.parametrize(
    "modes, compiled, bytecode",
    [
        ("eager,no_inductor", (), False),
        ("eager,no_inductor", ("dynamo",), True),
        ("no_inductor,inductor", ("dynamo",), False),
        ("inductor", ("dynamo", "inductor"), True),
    ],
    ids=["none", "dynamos-for-modes-without-inductor", "inductors-missing", "both-for-inductor"],
)
def test_the_record_says_whether_the_compilers_modules_had_bytecode(tmp_path, capsys, monkeypatch, modes, compiled,
                                                                     bytecode):  # fmt: skip
    """Without bytecode for Inductor's modules a warm start compiles them inside its compile phase (1.44 s of a
    warm 8B `inductor` start on the H100 image, perf/NOTES.md v40): a start-up figure means little unless its file
    says which it was. ``sys.pycache_prefix`` is where Python looks (PYTHONPYCACHEPREFIX); an empty folder there is
    an install without bytecode. Inductor's modules count only where a mode uses Inductor: a run without one
    never writes them, and its note would never go away."""
    prefix = tmp_path / "pycache"
    prefix.mkdir()
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    for name in compiled:  # what an installed torch has
        source = str(Path(torch.__file__).parent / COMPILER_MODULES[name])
        py_compile.compile(source, cfile=importlib.util.cache_from_source(source), doraise=True)
    monkeypatch.setattr(startup, "measure_mode", lambda spec, cache_dir: _fake_rows(spec["mode"]))
    out = tmp_path / "startup.json"
    main(["--modes", modes, "--device", "cpu", "--output-json", str(out)])
    assert json.loads(out.read_text())["env"]["bytecode"] is bytecode
    noted = "modules had no bytecode before the first start" in capsys.readouterr().err
    assert noted is not bytecode


@pytest.mark.parametrize("kind", ["symlink", "dangling-symlink"])
def test_a_modes_cache_folder_that_is_a_link_is_replaced_by_a_folder_of_its_own(tmp_path, kind):
    """The cold start empties ``CACHE_DIR/MODE`` first: where that is a link (to an earlier run's folder, or to
    nothing), emptying it with ``rmtree(ignore_errors=True)`` left it in place and the start raised
    ``NotADirectoryError`` / ``FileExistsError`` deep inside. The link goes; its target is left alone."""
    target = tmp_path / "elsewhere"
    (target / "tmp").mkdir(parents=True)
    mode_folder = tmp_path / "cache" / "eager"
    mode_folder.parent.mkdir()
    mode_folder.symlink_to(target if kind == "symlink" else tmp_path / "nothing-here")
    cold, warm = measure_mode({**TINY, "mode": "eager"}, tmp_path / "cache")
    assert (cold["start"], warm["start"]) == ("cold", "warm")
    assert mode_folder.is_dir() and not mode_folder.is_symlink()
    assert (target / "tmp").is_dir(), "the link's target was emptied"


@pytest.mark.slow
def test_a_start_that_refuses_its_settings_is_a_settings_error_of_one_line(tmp_path):
    """A child that refuses its settings (here a level no mode has, which the CLI's checks would have caught
    first) prints one line; the parent raises it as the settings' fault, not as a crash, so the CLI exits 2."""
    with pytest.raises(StartupSettingsError) as error:
        measure_mode({**TINY, "mode": "no_inductor", "overrides": {"level": 7}}, tmp_path)
    assert str(error.value).startswith("no_inductor (cold start): level: expected one of [0, 1, 2, 3], got 7")
    assert "\n" not in str(error.value)


def _foreign(cache_dir: Path, kind: str) -> Path:
    """``cache_dir/eager`` made by someone else: a folder holding a file of theirs, or a file of that name."""
    cache_dir.mkdir()
    if kind == "file":
        (cache_dir / "eager").write_text("precious")
        return cache_dir / "eager"
    (cache_dir / "eager").mkdir()
    (cache_dir / "eager" / "important.txt").write_text("precious")
    return cache_dir / "eager" / "important.txt"


@pytest.mark.parametrize("kind", ["folder", "file"])
def test_a_modes_folder_bench_startup_did_not_make_is_refused_not_emptied(tmp_path, capsys, kind):
    """A new user's ``--cache-dir`` held a folder named after a mode, with a file of theirs in it: the cold start
    emptied it without a word. Only a folder this tool made (it leaves a mark in each), or an empty one, is
    emptied; anything else stops the run before any start, in one line, and is left as it was."""
    kept = _foreign(tmp_path / "cache", kind)
    with pytest.raises(StartupError) as error:
        measure_mode({**TINY, "mode": "eager"}, tmp_path / "cache")
    assert str(error.value).startswith(f"--cache-dir: {tmp_path / 'cache' / 'eager'} holds files bench_startup did ")
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "eager", "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert err.startswith(ERROR + f"--cache-dir: {tmp_path / 'cache' / 'eager'} holds files bench_startup did not ")
    assert kept.read_text() == "precious"


def test_a_modes_folder_an_earlier_run_made_or_an_empty_one_is_used(tmp_path):
    (tmp_path / "cache" / "eager").mkdir(parents=True)  # empty: nothing to lose
    measure_mode({**TINY, "mode": "eager"}, tmp_path / "cache")
    assert startup.made_by_bench_startup(tmp_path / "cache" / "eager")
    rows = measure_mode({**TINY, "mode": "eager"}, tmp_path / "cache")  # the earlier run's folder, marked
    assert [row["start"] for row in rows] == ["cold", "warm"]


def test_a_modes_folder_that_cannot_be_made_is_one_line_not_a_traceback(tmp_path):
    """A new user's ``--cache-dir`` of 4,080 characters: the mode's folder could not be made, and the traceback
    lost the table of the modes that had finished. Here the folder above it is a file."""
    cache_dir = tmp_path / "a-file"
    cache_dir.write_text("not a folder")
    with pytest.raises(StartupError) as error:
        measure_mode({**TINY, "mode": "eager"}, cache_dir)
    message = str(error.value)
    assert message.startswith(f"--cache-dir: could not make {cache_dir / 'eager' / 'tmp'}: ") and "\n" not in message


def test_a_childs_known_error_is_its_one_line_message(tmp_path):
    """The child's last three lines of traceback were shown, joined with '|': its cause out of sight."""
    with pytest.raises(StartupError) as error:
        measure_mode({**TINY, "mode": "eager", "batch_size": 10**12}, tmp_path)
    message = str(error.value)
    assert message.startswith("eager (cold start): max_num_seqs x max_model_len (1000000000000 x 5)"), message
    assert "File " not in message and "Traceback" not in message


def test_a_cold_start_keeps_even_inductors_precompiled_header_in_its_own_folder(tmp_path):
    """Inductor keeps its C++ precompiled header under the temporary folder, outside TORCHINDUCTOR_CACHE_DIR:
    a cold start would find an older run's and be a third faster on a CPU."""
    env = cache_environment(tmp_path, "inductor")
    assert env["TMPDIR"].startswith(str(tmp_path / "inductor"))


@pytest.mark.slow
@pytest.mark.eager
def test_a_run_stopped_with_sigterm_removes_its_temporary_folder_and_says_so(tmp_path):
    """A new user's ``timeout 120 python -m reference.bench_startup ...`` left 302 MB of caches in its temporary
    folder: SIGTERM ended the process without the cleanup Ctrl-C gets. It is now handled as Ctrl-C is (the
    finished modes kept, one line), with the signal's exit status."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    argv = [sys.executable, "-m", "reference.bench_startup", "--model", "llama-tiny", "--device", "cpu",
            "--modes", "eager", "--batch-size", "2", "--input-len", "4"]  # fmt: skip
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(scratch.glob("bench-startup-*/eager/tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # until the mode's cold start has begun
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.splitlines()[-1] == "python -m reference.bench_startup: terminated during eager; no mode had " \
        "finished" and "Traceback" not in err  # fmt: skip
    assert not list(scratch.glob("bench-startup-*")), "the temporary folder was left behind"
