"""What every command line shares (reference/benchmark/cli.py), checked on the functions themselves: each flag type's
bounds and messages, the one-line parser, the CPUs a benchmark may use. The command lines' own tests
(test_bench_cli.py and beside it) reach these through argparse, where a factory such as ``int_at_least`` runs
once at import and a default value never goes through its type; here every bound is hit from both sides."""

import argparse
import os
import re
import sys
from pathlib import Path

import pytest

from reference.benchmark import cli

pytestmark = pytest.mark.requires("components")


def _refused(parse, text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as err:
        parse(text)
    return str(err.value)


def test_usable_cpus_are_the_affinity_mask_else_the_cpu_count_else_one(monkeypatch):
    if hasattr(os, "sched_getaffinity"):
        assert cli.usable_cpus() == len(os.sched_getaffinity(0))
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 3, 5}, raising=False)
        assert cli.usable_cpus() == 3
        monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 6)
    assert cli.usable_cpus() == 6
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # the count is unknown on this OS
    assert cli.usable_cpus() == 1


def test_a_usage_error_is_one_line_that_points_at_help(capsys):
    assert cli.usage_error("prog", "bad") == "prog: error: bad (see --help)"
    parser = cli.OneLineParser(prog="prog")
    parser.add_argument("--compilation-config")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["--compilation", "x"])  # an abbreviation, which argparse would take by default
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "prog: error: unrecognized arguments: --compilation x (see --help)\n"
    assert cli.OneLineParser(prog="p", allow_abbrev=True).allow_abbrev  # a caller may still ask for them
    assert cli.OneLineParser("positional-prog").prog == "positional-prog"  # argparse's own arguments pass through


@pytest.mark.parametrize("minimum", [0, 1, 3])
def test_int_at_least_takes_its_minimum_and_refuses_one_below(minimum):
    parse = cli.int_at_least(minimum)
    assert parse(str(minimum)) == minimum and parse(str(minimum + 7)) == minimum + 7
    assert _refused(parse, str(minimum - 1)) == f"expected an int >= {minimum}, got '{minimum - 1}'"
    assert _refused(parse, "2.0") == f"expected an int >= {minimum}, got '2.0'"


def test_a_thread_count_is_from_one_to_the_usable_cpus(monkeypatch):
    monkeypatch.setattr(cli, "usable_cpus", lambda: 4)
    assert cli.thread_count("1") == 1 and cli.thread_count("4") == 4
    for text in ("0", "5", "x"):
        assert _refused(cli.thread_count, text) == f"expected an int in [1, 4] (this machine's CPUs), got '{text}'"


def test_a_seed_is_what_torch_manual_seed_takes_from_0_to_2_to_the_63():
    assert cli.seed("0") == 0 and cli.seed(str(2**63 - 1)) == 2**63 - 1
    for text in ("-1", str(2**63), "x"):
        assert _refused(cli.seed, text) == f"expected an int in [0, 2**63), got '{text}'"


def test_names_are_comma_separated_stripped_known_and_given_once():
    parse = cli.names_of(("a", "b"), "thing")
    assert parse("") == [] and parse(" , ") == [] and parse("b, a") == ["b", "a"]
    assert _refused(parse, "a,,b") == "'a,,b' has an empty name; choose from a, b"
    assert _refused(parse, "a,c") == "unknown ['c']; choose from a, b (comma-separated)"
    assert _refused(parse, "a,a") == "'a,a' names a thing twice"


def test_a_mode_list_names_at_least_one_mode():
    assert cli.mode_names("eager,no_inductor") == ["eager", "no_inductor"]
    assert _refused(cli.mode_names, ",").startswith("no mode given in ','; choose from eager, ")


def test_a_model_or_device_is_refused_in_the_words_of_the_library_without_its_field_name():
    assert cli.model_name("llama-tiny") == "llama-tiny" and cli.device_name("cpu") == "cpu"
    assert _refused(cli.model_name, "nope").startswith("'nope' is neither a preset nor a directory; expected")
    assert _refused(cli.device_name, "tpu") == "expected e.g. 'cpu', 'cuda' or 'cuda:1', got 'tpu'"


def test_a_path_is_not_empty_has_no_nul_and_has_its_home_folder_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    parse = cli.non_empty_path("a directory")
    assert parse("runs") == Path("runs") and parse("~/runs") == tmp_path / "runs"
    assert _refused(parse, " ") == "empty; give a directory"
    assert _refused(parse, "a\0b") == "'a\\x00b' has a NUL byte, which no path can hold"


@pytest.mark.parametrize(
    "text, ending", [("out/", "/"), ("out/.", "."), ("out/..", ".."), ("..", ".."), (".", "."), ("out/./", "/")]
)
def test_an_output_file_spelled_as_a_folder_names_its_ending(text, ending):
    assert _refused(cli.output_file, text) == f"{text!r} names a folder (it ends with {ending!r}); give a file path"


def test_an_output_file_is_any_other_path(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.output_file("out/x.json") == Path("out/x.json") and cli.output_file("x..json") == Path("x..json")
    assert cli.output_file("~/x.json") == tmp_path / "x.json" and cli.output_file(".x") == Path(".x")
    assert _refused(cli.output_file, "") == "empty; give a file path"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--n", "1", "--n", "2"], "--n given twice; give it once"),
        (["--n=1", "--n", "2"], "--n given twice; give it once"),
        (["--chunked", "--no-chunked"], "--chunked and --no-chunked both set chunked; give one"),
        (["--no-chunked", "--no-chunked"], "--no-chunked given twice; give it once"),
        (["-x=1", "-x", "2"], "-x given twice; give it once"),  # argparse reads -x=1 as -x 1
        (["--n", "1", "--n", "2", "--", "-h"], "--n given twice; give it once"),  # -h after -- asks nothing
    ],
    ids=["twice", "once-with-equals", "both-spellings", "negation-twice", "short-with-equals", "help-after-dashes"],
)
def test_a_flag_given_twice_is_one_line_not_the_last_one_winning(argv, message, capsys, monkeypatch):
    """``--num-prompts 3 --num-prompts 5`` ran 5 prompts without a word, and ``--scheduling static --scheduling
    continuous`` only continuous; a flag that collects its values (append) may repeat, and so may anything after
    ``--``."""
    parser = cli.OneLineParser(prog="prog")
    parser.add_argument("--n", type=int)
    parser.add_argument("-x", type=int)
    parser.add_argument("--chunked", action=argparse.BooleanOptionalAction)
    parser.add_argument("--tag", action="append")
    parser.add_argument("rest", nargs="*")
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == f"prog: error: {message} (see --help)\n"
    args = parser.parse_args(["--tag", "a", "--tag", "b", "--n", "1", "--", "--n", "--n"])
    assert args.tag == ["a", "b"] and args.n == 1 and args.rest == ["--n", "--n"]
    with pytest.raises(SystemExit) as exit_info:  # help first, as argparse would give it without the repeat
        parser.parse_args(["-h", *argv])
    assert exit_info.value.code == 0 and capsys.readouterr().out.startswith("usage: prog")
    with pytest.raises(SystemExit) as exit_info:  # a command line's own arguments, read from sys.argv
        monkeypatch.setattr(sys, "argv", ["prog", *argv])
        parser.parse_args()
    assert exit_info.value.code == 2 and capsys.readouterr().err == f"prog: error: {message} (see --help)\n"
    namespace = argparse.Namespace()
    assert parser.parse_args(["--n", "1"], namespace=namespace) is namespace and namespace.n == 1


def _variables_read_by_the_reference() -> set[str]:
    """``REFERENCE_*`` names the implementation reads: ``os.environ`` lookups and the modules' ``*ENV`` constants."""
    root = Path(__file__).resolve().parents[1] / "reference"
    names = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"""(?:environ(?:\.get)?|getenv)[\(\[]["'](REFERENCE_[A-Z_]+)["']""", text))
        names |= set(re.findall(r"""^[A-Z_]*ENV = ["'](REFERENCE_[A-Z_]+)["']""", text, re.MULTILINE))
    return names


def test_every_environment_variable_the_implementation_reads_is_in_the_clis_help():
    """A bad REFERENCE_PDL is refused with '(see --help)': --help must name it, and every other variable that
    changes what a run does, with what it takes. The list is written out in cli.py (it imports no torch), so
    this rule holds it to the names the code reads."""
    from reference.compilation import cache_key
    from reference.ops import dependent_launch

    read = _variables_read_by_the_reference()
    assert {dependent_launch.ENV, cache_key.FOLDER_ENV, cache_key.DISABLE_ENV, "REFERENCE_MODEL_CACHE"} <= read
    assert set(cli.ENVIRONMENT) == read
    for prog in ("bench_latency", "bench_startup", "bench_throughput"):
        module = __import__(f"reference.{prog}", fromlist=["build_parser"])
        text = re.sub(r"-\s+", "-", " ".join(module.build_parser().format_help().split()))  # argparse wraps at '-'
        for name in read:
            assert f"{name}: {cli.ENVIRONMENT[name]}" in text, (prog, name)


@pytest.mark.parametrize("variable", ["TORCHINDUCTOR_COMPILE_THREADS", "OMP_NUM_THREADS"])
@pytest.mark.parametrize("program", ["bench_latency", "bench_startup", "bench_throughput", "tune_gemm", "report"])
def test_a_bad_thread_variable_is_the_command_lines_one_line_before_any_flag_is_read(monkeypatch, capsys, variable,
                                                                                      program):  # fmt: skip
    """A new user's ``TORCHINDUCTOR_COMPILE_THREADS=abc`` was blamed on ``--device`` (its type imports torch,
    whose Inductor config reads the variable with a bare ``int()``), or was a traceback from that import without
    the flag; pytest, the faults and mutation testing already refused it by name (conformance/cores.py)."""
    import importlib

    monkeypatch.setenv(variable, "abc")
    with pytest.raises(SystemExit) as exit_info:
        importlib.import_module(f"reference.{program}").main(["--device", "cpu", "--batch-size", "0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert f": error: {variable}='abc': expected a whole number of threads >= 1, or leave it unset" in err, err
