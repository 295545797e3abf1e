"""The command lines' output paths (``--output-json``, ``--results-dir``, ``--cache-dir``), checked before any work:
a path that names a folder where a file is wanted, or a folder under a file, is a one-line usage error naming the
flag, and a refused run leaves nothing behind on disk (the folders are made when the file is written)."""

import pytest

from reference import bench_latency, bench_startup, bench_throughput, tune_gemm

# each CLI's entry point and the arguments (besides the path) that reach its path checks quickly
CLIS = {
    "bench_latency": (bench_latency.main, ["--model", "toy-llama", "--device", "cpu"]),
    "bench_startup": (bench_startup.main, ["--modes", "eager", "--device", "cpu"]),
    "bench_throughput": (bench_throughput.main, ["--modes", "eager", "--device", "cpu"]),
    "tune_gemm": (tune_gemm.main, ["--model", "llama-3.1-8b", "--device", "cpu"]),
}


def _refusal(cli: str, argv: list[str], capsys) -> str:
    main, base = CLIS[cli]
    with pytest.raises(SystemExit) as exit_info:
        main([*base, *argv])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("cli", CLIS)
def test_an_output_json_ending_in_a_slash_names_a_folder_and_is_refused(cli, tmp_path, capsys, monkeypatch):
    """``/new/dir/`` was written as a file named ``dir``: ``Path`` drops the trailing slash."""
    monkeypatch.chdir(tmp_path)
    line = _refusal(cli, ["--output-json", "new/dir/"], capsys)
    assert "argument --output-json: 'new/dir/' ends with '/', a folder; give a file path" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cli", CLIS)
def test_an_output_json_under_a_file_says_which_part_is_a_file(cli, tmp_path, capsys):
    """``/etc/passwd/x.json`` said "File exists", mkdir's words for a parent that is a file."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    line = _refusal(cli, ["--output-json", str(a_file / "sub" / "x.json")], capsys)
    assert f"--output-json: cannot write in '{a_file / 'sub'}': '{a_file}' is a file, not a folder" in line


@pytest.mark.parametrize(
    "cli, flag", [("bench_latency", "--results-dir"), ("bench_startup", "--cache-dir")], ids=["results", "cache"]
)
def test_a_folder_under_a_file_says_which_part_is_a_file(cli, flag, tmp_path, capsys):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("")
    line = _refusal(cli, [flag, str(a_file / "runs")], capsys)
    assert f"{flag}: cannot write in '{a_file / 'runs'}': '{a_file}' is a file, not a folder" in line


def test_a_run_refused_after_the_path_checks_makes_no_folder(tmp_path, capsys):
    """The path checks once made the missing folders; a refusal after them (here: ``--write`` on the CPU)
    left empty folders behind."""
    out = tmp_path / "a" / "b" / "timings.json"
    line = _refusal("tune_gemm", ["--output-json", str(out), "--write"], capsys)
    assert "--write keeps a GPU's timings" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "cli, flag", [("bench_latency", "--results-dir"), ("bench_startup", "--cache-dir")], ids=["results", "cache"]
)
def test_an_unwritable_place_for_a_missing_folder_names_the_folder_and_where_it_would_be_made(cli, flag, capsys):
    line = _refusal(cli, [flag, "/proc/no-such/dir"], capsys)
    assert f"{flag}: cannot write in '/proc/no-such/dir': cannot make a folder in '/proc' (" in line
