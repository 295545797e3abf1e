"""The start-up benchmark (``python -m reference.bench_startup``): every start in a fresh process, a cold start
that really starts from an empty compiler cache and a warm one that really reads it, the documented JSON, and
one-line errors for bad flags."""

import json

import pytest

from reference.bench_startup import COLUMNS, main
from reference.benchmark.startup import PHASES, measure_mode

pytestmark = pytest.mark.requires("components")

ERROR = "python -m reference.bench_startup: error: "
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


def test_paths_that_cannot_be_used_are_refused_before_any_start(tmp_path, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("")
    for argv, message in (
        (["--cache-dir", str(a_file)], f"--cache-dir: {a_file} is a file; give a directory"),
        (["--output-json", str(tmp_path)], f"--output-json: {tmp_path} is a directory; give a file path"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["--modes", "eager", *argv])
        assert exit_info.value.code == 2
        assert capsys.readouterr().err == f"{ERROR}{message} (see --help)\n"


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
def test_a_cold_start_compiles_everything_and_a_warm_start_reads_the_cache_it_left(tmp_path):
    """A cold start that read an older cache, or a warm start that did not find the cold one's, would make
    the table's two columns say nothing. The cold start must also empty the mode's folder it is given."""
    stale = tmp_path / "inductor" / "stale-entry"  # in the inductor mode's own cache folder
    stale.parent.mkdir(parents=True)
    stale.write_text("from an older run")
    cold, warm = measure_mode({**TINY, "mode": "inductor"}, tmp_path)
    assert not stale.exists()
    assert cold["inductor_cache_misses"] > 0 and cold["inductor_cache_hits"] == 0, cold
    assert warm["inductor_cache_hits"] == cold["inductor_cache_misses"] and warm["inductor_cache_misses"] == 0, warm
