"""The command lines' output paths (``--output-json``, ``--results-dir``, ``--cache-dir``), checked before any work:
a path that names a folder where a file is wanted, or a folder under a file, is a one-line usage error naming the
flag, and a refused run leaves nothing behind on disk (the folders are made when the file is written)."""

import errno
import os

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
@pytest.mark.parametrize("path", ["new/dir/", "new/dir/.", "new/sub/..", ".", ".."])
def test_an_output_json_that_names_a_folder_by_its_spelling_is_refused(cli, path, tmp_path, capsys, monkeypatch):
    """``new/dir/`` and ``new/dir/.`` were written as a file named ``dir`` (``Path`` drops the ``/`` and the
    ``/.``), and ``new/sub/..`` failed after the whole run, leaving ``new/sub`` behind."""
    monkeypatch.chdir(tmp_path)
    line = _refusal(cli, ["--output-json", path], capsys)
    assert f"argument --output-json: {path!r} names a folder (it ends with" in line and "give a file path" in line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cli", CLIS)
def test_an_output_name_longer_than_the_system_allows_is_one_line(cli, tmp_path, capsys):
    """``Path.is_dir()`` raised "File name too long" from inside the check: a traceback."""
    line = _refusal(cli, ["--output-json", str(tmp_path / ("x" * 300))], capsys)
    assert f"--output-json: cannot use '{tmp_path}/xxx" in line and line.endswith("(File name too long) (see --help)")


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
    reason = line.rsplit("'/proc' (", 1)[1].removesuffix(") (see --help)")
    assert reason in {os.strerror(e) for e in (errno.ENOENT, errno.EACCES, errno.EROFS, errno.EPERM)}, reason


@pytest.mark.parametrize(
    "cli, flag", [("bench_latency", "--results-dir"), ("bench_startup", "--cache-dir")], ids=["results", "cache"]
)
def test_a_folder_name_longer_than_the_system_allows_is_one_line(cli, flag, tmp_path, capsys):
    line = _refusal(cli, [flag, str(tmp_path / ("x" * 300) / "sub")], capsys)
    assert f"{flag}: cannot use '" in line and "(File name too long)" in line


def test_a_folder_behind_a_broken_symbolic_link_says_so_and_one_behind_a_link_to_a_file_is_under_a_file(
    tmp_path, capsys
):
    """It was called "a file"."""
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    line = _refusal("bench_latency", ["--output-json", str(tmp_path / "dangling" / "o.json")], capsys)
    assert f"'{tmp_path / 'dangling'}' is a broken symbolic link, not a folder" in line
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "to-notes").symlink_to(tmp_path / "notes.txt")
    line = _refusal("bench_latency", ["--output-json", str(tmp_path / "to-notes" / "o.json")], capsys)
    assert f"'{tmp_path / 'to-notes'}' is a file, not a folder" in line


@pytest.mark.parametrize("cli", CLIS)
def test_a_nul_byte_in_an_output_path_is_refused_before_the_run(cli, capsys):
    """Only a caller in Python can pass one; it failed in the clean-up after the whole run."""
    line = _refusal(cli, ["--output-json", "a\x00b.json"], capsys)
    assert "argument --output-json: 'a\\x00b.json' has a NUL byte, which no path can hold" in line


def test_a_home_folder_is_expanded_as_the_compile_caches_folder_is(tmp_path, monkeypatch):
    """``'~/x.json'`` (quoted, so no shell expanded it) made a folder named ``~``; ``cache_dir`` expands it."""
    from reference.benchmark.cli import output_file

    monkeypatch.setenv("HOME", str(tmp_path))
    assert output_file("~/runs/x.json") == tmp_path / "runs" / "x.json"
