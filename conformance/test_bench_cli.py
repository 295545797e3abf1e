"""The latency benchmark's command line: runs end to end on tiny models, writes the documented JSON and
markdown, and rejects bad flags with argparse's exit code 2 and a message naming the flag."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from reference.bench_latency import main, parse_args
from reference.benchmark.choices import MODE_KWARGS as MODES
from reference.benchmark.choices import mode_kwargs
from reference.benchmark.timing import latency_stats
from reference.config import CompilationConfig, config_fields

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")

TINY_RUN = ["--batch-size", "2", "--input-len", "3", "--output-len", "2", "--num-iters-warmup", "1", "--num-iters", "2"]
LONG = "x" * 100_000  # a pasted blob: error messages must not echo all of it


@pytest.mark.no_inductor
def test_a_compile_served_by_the_compile_cache_is_recorded_and_marked_in_the_table(tmp_path, monkeypatch):
    """A second run reads its compile from the cache the first left: its compile_s is a cache read, and the
    JSON and the table say so (a table that did not would show a warm start as the mode's compile time)."""
    monkeypatch.setenv("REFERENCE_DISABLE_COMPILE_CACHE", "0")
    monkeypatch.setenv("REFERENCE_COMPILE_CACHE", str(tmp_path / "cache"))
    docs, tables = [], []
    for run in ("cold", "warm"):
        out = tmp_path / f"{run}.json"
        main(["--model", "llama-tiny", *TINY_RUN, "--modes", "no_inductor", "--device", "cpu", "--output-json",
              str(out), "--results-dir", str(tmp_path / run)])  # fmt: skip
        docs.append(json.loads(out.read_text()))
        (md_file,) = (tmp_path / run).glob("llama-tiny-*.md")
        tables.append([line for line in md_file.read_text().splitlines() if line.startswith("| no_inductor ")])
    assert [doc["results"][0]["startup"]["compile_cache_hits"] for doc in docs] == [0, 1]
    compile_cells = [row[0].split("|")[8].strip() for row in tables]
    assert not compile_cells[0].endswith("(cached)") and compile_cells[1].endswith(" (cached)"), compile_cells


@pytest.mark.eager
@pytest.mark.no_inductor
def test_bench_runs_end_to_end_and_writes_the_documented_json_and_markdown(tmp_path, capsys):
    argv = ["--model", "llama-tiny", *TINY_RUN, "--modes", "eager,no_inductor", "--device", "cpu"]
    argv += ["--output-json", str(tmp_path / "out.json"), "--results-dir", str(tmp_path / "results")]
    main(argv)
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["model"] == "llama-tiny"
    assert [r["mode"] for r in doc["results"]] == ["eager", "no_inductor"]
    for r in doc["results"]:
        lat = r["latency_s"]
        assert set(lat) == {"avg", "p50", "p90"}
        assert 0 < lat["p50"] <= lat["p90"]
        assert r["iters"] == 2
        assert {"load_s", "compile_s", "capture_s", "graph_gib", "capture_sizes"} <= set(r["startup"])
        assert r["floor_s"] is None and r["x_floor"] is None  # no bandwidth, no floor on CPU
        assert r["speedup_vs"] == {}
    assert [r["compilation_config"]["level"] for r in doc["results"]] == [0, 3]
    # decode steps of 2 tokens, a prefill of 2 x 3: the token budget is the prefill's, so nothing larger
    assert doc["results"][1]["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 6]
    assert doc["results"][1]["same_tokens_as_first"] == 1.0  # no_inductor runs eager's ops: same tokens
    # each sequence's tokens as a digest, so that two runs' tokens can be compared (report --compare)
    digests = [r["token_digests"] for r in doc["results"]]
    assert digests[0] == digests[1] and len(digests[0]) == 2 and len(set(digests[0])) == 2  # two prompts
    assert all(isinstance(d, str) and len(d) == 16 and int(d, 16) >= 0 for d in digests[0])
    assert doc["weight_bytes_per_decode_step"] > 0
    env = doc["env"]
    assert {"gpu", "torch", "date", "command", "commit"} <= set(env)
    assert env["threads"] == 1  # the CPU default (reference.benchmark.machine.DEFAULT_CPU_THREADS)
    assert env["custom_op_kernels"] == "torch"  # on CPU the custom ops run their torch implementation
    assert env["command"] == "python -m reference.bench_latency " + " ".join(argv)
    # the results dir holds <model>-<date>.json (same document) and .md with one table row per mode
    (json_file,) = (tmp_path / "results").glob("llama-tiny-*.json")
    assert json.loads(json_file.read_text())["results"] == doc["results"]
    (md_file,) = (tmp_path / "results").glob("llama-tiny-*.md")
    table = [line for line in md_file.read_text().splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table] == ["mode", "eager", "no_inductor"]
    # eager's recorded config keeps resolved defaults (use_inductor True, capture sizes) that level 0 ignores
    assert doc["results"][0]["compilation_config"]["use_inductor"] is True
    assert "eager runs level 0" in md_file.read_text()
    printed = capsys.readouterr().out
    assert "| eager |" in printed and "| no_inductor |" in printed


@pytest.mark.eager
def test_baselines_run_on_the_same_weights_and_get_speedup_columns(tmp_path):
    argv = ["--model", "llama-tiny", *TINY_RUN, "--modes", "eager", "--device", "cpu", "--baselines", "hf-eager"]
    argv += ["--num-iters-baseline", "1", "--output-json", str(tmp_path / "out.json")]
    main(argv)
    eager, baseline = json.loads((tmp_path / "out.json").read_text())["results"]
    assert (baseline["mode"], baseline["kind"], baseline["iters"]) == ("hf-eager", "baseline", 1)
    assert baseline["startup"]["first_call_s"] > 0
    assert eager["speedup_vs"]["hf-eager"] == pytest.approx(baseline["latency_s"]["p50"] / eager["latency_s"]["p50"])
    # transformers' model on our weights generates the same greedy tokens (test_llm checks this token by
    # token against recomputation); on other weights it would agree on none
    assert baseline["same_tokens_as_first"] == 1.0
    assert baseline["token_digests"] == eager["token_digests"]


@pytest.mark.eager
def test_zero_warm_up_calls_time_every_call(tmp_path):
    # vLLM allows --num-iters-warmup 0; then the first (cold) call is one of the timed ones
    argv = ["--model", "llama-tiny", "--batch-size", "1", "--input-len", "2", "--output-len", "2", "--device", "cpu"]
    argv += ["--modes", "eager", "--num-iters-warmup", "0", "--num-iters", "2", "--baselines", "hf-eager"]
    argv += ["--num-iters-warmup-baseline", "0", "--num-iters-baseline", "1", "--output-json", str(tmp_path / "o.json")]
    main(argv)
    doc = json.loads((tmp_path / "o.json").read_text())
    assert (doc["settings"]["num_iters_warmup"], doc["settings"]["num_iters_warmup_baseline"]) == (0, 0)
    eager, baseline = doc["results"]
    assert (eager["iters"], baseline["iters"]) == (2, 1)
    # no warm-up: the baseline's only timed call is its first call
    assert baseline["latency_s"]["p50"] == baseline["startup"]["first_call_s"]


def test_latency_stats_are_mean_median_and_interpolated_90th_percentile():
    times = [0.3, 0.1, 0.4, 0.9, 0.2, 0.5, 0.8, 0.6, 0.7, 1.0, 0.15]
    stats = latency_stats(times)
    assert stats["avg"] == pytest.approx(np.mean(times))
    assert stats["p50"] == pytest.approx(np.percentile(times, 50))
    assert stats["p90"] == pytest.approx(np.percentile(times, 90))  # numpy's default is linear interpolation


def test_compilation_config_overrides_change_only_the_compiled_modes():
    overrides = {"cudagraph_capture_sizes": [4]}
    assert mode_kwargs("eager", overrides) == MODES["eager"]
    assert mode_kwargs("inductor", overrides)["compilation_config"] == {"level": 3, "use_inductor": True, **overrides}
    assert "cudagraph_capture_sizes" not in MODES["inductor"]["compilation_config"]  # presets untouched


MODE_FIELD_ERROR = (
    r"--compilation-config: sets {fields}, which --modes decides: choose modes instead "
    r"\(eager: level 0; breakable: level 0, cudagraph_mode=piecewise; no_inductor: level 3, use_inductor=False; "
    r"inductor: level 3, use_inductor=True; no_inductor_full: level 3, use_inductor=False, "
    r"cudagraph_mode=full_and_piecewise; inductor_full: level 3, use_inductor=True, cudagraph_mode=full_and_piecewise\)"
)
BAD_FLAGS = [
    pytest.param(["--modes", "eager,fast"], r"argument --modes: unknown \['fast'\]", id="unknown-mode"),
    pytest.param(
        ["--compilation-config", "{'splitting_ops': ['foo::bar']}"],
        r"argument --compilation-config: splitting_ops: 'foo::bar' is not a registered torch.library op",
        id="unregistered-splitting-op",
    ),
    pytest.param(
        ["--compilation-config", "{'splitting_ops': ['aten::mm']}"],
        r"argument --compilation-config: splitting_ops: 'aten::mm' is an ATen-level op",
        id="aten-splitting-op",
    ),
    pytest.param(
        ["--compilation-config", "{'custom_ops': ['+flash_norm']}"],
        r"argument --compilation-config: custom_ops: unknown op 'flash_norm'",
        id="unknown-custom-op",
    ),
    pytest.param(["--modes", "eager,eager"], "argument --modes: 'eager,eager' names a mode twice", id="mode-twice"),
    pytest.param(
        ["--modes", "eager,,no_inductor"], "argument --modes: 'eager,,no_inductor' has an empty name", id="empty-mode"
    ),
    pytest.param(["--seed", "-1"], r"argument --seed: expected an int in \[0, 2\*\*63\), got '-1'", id="negative-seed"),
    pytest.param(["--seed", str(2**64)], r"argument --seed: expected an int in \[0, 2\*\*63\)", id="huge-seed"),
    pytest.param(["--output-json", "/proc/no-such-dir/x.json"], "--output-json: cannot write", id="json-unwritable"),
    pytest.param(["--results-dir", "/proc/no-such-dir"], "--results-dir: cannot write", id="dir-unwritable"),
    pytest.param(["--output-json", "conformance"], "--output-json: 'conformance' is a directory", id="json-is-dir"),
    pytest.param(
        ["--results-dir", "README.md"], "--results-dir: 'README.md' is a file, not a folder", id="dir-is-file"
    ),
    pytest.param(["--baselines", "hf-fast"], r"argument --baselines: unknown \['hf-fast'\]", id="unknown-baseline"),
    pytest.param(
        ["--compilation-config", "{level: 3"], "argument --compilation-config: .*neither JSON", id="unclosed-config"
    ),
    pytest.param(
        ["--compilation-config", '{"levle": 3}'],
        r"argument --compilation-config: .*unknown key\(s\) \['levle'\]",
        id="unknown-config-key",
    ),
    pytest.param(
        ["--modes", "no_inductor", "--compilation-config", "{'inductor_compile_config': {'max_autotune': True}}"],
        "--compilation-config: with mode 'no_inductor': inductor_compile_config is set but use_inductor=False",
        id="inductor-options-with-inductor-off",
    ),
    pytest.param(
        ["--modes", "eager,inductor", "--batch-size", "2", "--input-len", "8", "-O.compile_sizes=[4]"],
        r"--compilation-config: with mode 'inductor': compile_sizes \[4\] never run: a step is padded to the next "
        r"capture size \(\[1, 2, 8, 16\]\); list capture sizes, or counts above the largest one up to 16",
        id="compile-size-no-step-runs-at",
    ),
    pytest.param(
        ["--modes", "eager", "--compilation-config", "{'level': 3}"],
        "--compilation-config applies only to compiled",
        id="config-with-only-eager",
    ),
    pytest.param(
        ["--enforce-eager", "--compilation-config", "{'level': 3}"],
        "--compilation-config .*--enforce-eager",
        id="config-with-enforce-eager",
    ),
    pytest.param(
        ["--enforce-eager", "--modes", "inductor"],
        "--enforce-eager contradicts --modes inductor",
        id="enforce-eager-and-other-modes",
    ),
    pytest.param(
        ["--modes", "inductor", "--compilation-config", "0"],
        MODE_FIELD_ERROR.format(fields="level"),
        id="config-sets-level",
    ),
    pytest.param(
        ["--modes", "no_inductor", "--compilation-config", "{'cudagraph_mode': 'none'}"],
        MODE_FIELD_ERROR.format(fields="cudagraph_mode"),
        id="config-sets-cudagraph-mode",
    ),
    pytest.param(
        ["--modes", "no_inductor", "--compilation-config", "{'use_inductor': True}"],
        MODE_FIELD_ERROR.format(fields="use_inductor"),
        id="config-sets-use-inductor",
    ),
    pytest.param(
        ["--compilation-config", "{'level': 2, 'use_inductor': False}"],
        MODE_FIELD_ERROR.format(fields="level, use_inductor"),
        id="config-sets-level-and-use-inductor",
    ),
    pytest.param(  # the config's advice names a field the CLI refuses: who sets it here (no loop back to it)
        ["-O.cudagraph_capture_sizes=[]"],
        r"argument --compilation-config: cudagraph_capture_sizes is empty .*or set cudagraph_mode='none' "
        r"\(here --modes sets cudagraph_mode, and every compiled mode captures graphs\) \(see --help\)$",
        id="advice-to-set-cudagraph-mode",
    ),
    pytest.param(
        ["--modes", "no_inductor", "-O.compile_sizes=[2]"],
        r"with mode 'no_inductor': compile_sizes is set but use_inductor=False.* set use_inductor=True "
        r"\(here --modes sets use_inductor: inductor and inductor_full compile with Inductor\); "
        r"or leave no_inductor out of --modes \(see --help\)$",
        id="advice-to-set-use-inductor",
    ),
    pytest.param(
        ["--modes", "breakable,no_inductor", "-O.compile_sizes=[2]"],
        r"with mode 'breakable': compile_sizes is set but level=0.* use level 2 or 3 with Inductor \(here --modes "
        r"sets the level: eager and breakable run at 0, the other modes at 3\); or leave breakable out of --modes",
        id="advice-to-use-a-level",
    ),
    pytest.param(  # advice on no mode-defining field: only the way out of the mode
        ["--modes", "no_inductor", "-O.inductor_compile_config.max_autotune=true"],
        r"with mode 'no_inductor': inductor_compile_config is set but use_inductor=False; drop one of them; "
        r"or leave no_inductor out of --modes \(see --help\)$",
        id="a-modes-error-without-advice-on-its-fields",
    ),
    pytest.param(["--modes", ""], "argument --modes: no mode given", id="empty-modes"),
    pytest.param(["--modes", " , "], "argument --modes: no mode given", id="blank-modes"),
    pytest.param(["--batch-size", "0"], "argument --batch-size: expected an int >= 1, got '0'", id="batch-size-0"),
    pytest.param(["--threads", "0"], r"argument --threads: expected an int in \[1, \d+\]", id="threads-0"),
    pytest.param(
        ["--threads", "100000"],
        r"argument --threads: expected an int in \[1, \d+\] \(this machine's CPUs\), got '100000'",
        id="threads-above-the-cpus",
    ),
    pytest.param(
        ["-O", "{'cudagraph_capture_sizes': [4]}", "-O", "{'custom_ops': ['none']}"],
        "--compilation-config given twice",
        id="config-given-twice",
    ),
    pytest.param(["-O3", "-O2"], r"optimization level given twice \(-O3, -O2\)", id="level-given-twice"),
    pytest.param(
        ["-O2", "--modes", "eager"],
        r"-O2 selects --modes inductor_full \(vLLM's optimization level\), and --modes eager was given too; give one",
        id="level-and-modes",
    ),
    pytest.param(["-O4"], r"-O: optimization level expected 0, 1, 2 or 3, got '4'", id="level-4"),
    pytest.param(  # as in vLLM, -O=TEXT is a level; a dict there is a config given the wrong way, so say how
        ['-O={"level": 3}'],
        r"""-O: optimization level expected 0, 1, 2 or 3, got '\{"level": 3\}'; a compilation config goes as """
        r"""-O '\{\.\.\.\}' \(a space, no '='\) or --compilation-config=\{\.\.\.\}""",
        id="config-after-O-equals",
    ),
    pytest.param(["--optimization-level", "x"], r"optimization level expected 0, 1, 2 or 3, got 'x'", id="level-x"),
    pytest.param(["-O2", "--enforce-eager"], "--enforce-eager contradicts -O2", id="level-and-enforce-eager"),
    pytest.param(
        ["--compilation-config.custom_ops=['none']", "-O.custom_ops=['all']"],
        "-O.custom_ops given twice",
        id="long-and-short-dotted-field",
    ),
    pytest.param(
        ["-O.cudagraph_capture_sizes=[1,2]", "-O.cudagraph_capture_sizes=[4]"],
        "-O.cudagraph_capture_sizes given twice",
        id="field-given-twice",
    ),
    pytest.param(  # the inner field beat the dict's value silently (the reverse order was refused)
        ["-O.inductor_compile_config={'max_autotune': True}", "-O.inductor_compile_config.max_autotune=false"],
        r"-O.inductor_compile_config and -O.inductor_compile_config.max_autotune both set inductor_compile_config",
        id="dotted-dict-then-its-field",
    ),
    pytest.param(  # the field's value beat the whole config's silently, whichever came first
        ["--compilation-config", '{"debug_cudagraph_outputs": true}', "-O.debug_cudagraph_outputs=false"],
        r"debug_cudagraph_outputs given twice \(in --compilation-config and as -O.debug_cudagraph_outputs",
        id="field-in-the-config-and-dotted",
    ),
    pytest.param(
        ["-O", '{"cudagraph_capture_sizes": [1, 2], "cudagraph_capture_sizes": [4]}'],
        "compilation config: key 'cudagraph_capture_sizes' given twice",
        id="json-key-given-twice",
    ),
    pytest.param(
        ["-O", "{'custom_ops': ['all'], 'custom_ops': ['none']}"],
        "compilation config: key 'custom_ops' given twice",
        id="literal-key-given-twice",
    ),
    # an abbreviation of a flag is not that flag: it bypassed the given-twice guard and dropped a value
    pytest.param(
        ["--compilation", "{'cudagraph_capture_sizes': [4]}", "-O.custom_ops=['none']"],
        "unrecognized arguments: --compilation",
        id="abbreviated-flag",
    ),
    pytest.param(
        ["--compilation", "{'cudagraph_capture_sizes': [4]}", "--compilation-config", "{'custom_ops': ['none']}"],
        "unrecognized arguments: --compilation ",
        id="abbreviation-and-flag",
    ),
    pytest.param(
        ["-cc", "{'backend': [1]}"],
        r"argument --compilation-config: backend: expected one of \['inductor', 'eager'\], got \[1\]",
        id="unhashable-backend",
    ),
    pytest.param(
        ["-cc", '{"cudagraph_capture_sizes": [' + "9" * 5000 + "]}"],
        r"^[^\n]{0,400}argument --compilation-config: compilation config: .{0,300}\n$",
        id="a-5000-digit-value",
    ),
    pytest.param(["--num-iters", "0"], "argument --num-iters: expected an int >= 1, got '0'", id="num-iters-0"),
    pytest.param(
        ["--num-iters-baseline", "0"],
        "argument --num-iters-baseline: expected an int >= 1, got '0'",
        id="num-iters-baseline-0",
    ),
    pytest.param(
        ["--num-iters-warmup", "-1"],
        "argument --num-iters-warmup: expected an int >= 0, got '-1'",
        id="num-iters-warmup-negative",
    ),
    pytest.param(
        ["--num-iters-warmup-baseline", "x"],
        "argument --num-iters-warmup-baseline: expected an int >= 0, got 'x'",
        id="num-iters-warmup-baseline-not-int",
    ),
    pytest.param(
        ["--model", "no-such-model"], "argument --model: 'no-such-model' is neither a preset", id="unknown-model"
    ),
    pytest.param(["--results-dir", ""], "argument --results-dir: empty; give a directory", id="empty-results-dir"),
    pytest.param(["--output-json", ""], "argument --output-json: empty; give a file path", id="empty-output-json"),
    pytest.param(["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'", id="unknown-dtype"),
    pytest.param(
        ["--input-len", "1000", "--output-len", "100"],
        r"--input-len \+ --output-len = 1100 exceeds",
        id="lengths-past-max-positions",
    ),
]


def _with_model(argv: list[str]) -> list[str]:
    """``argv`` after ``--model toy-llama``, unless it names a model itself (a flag is given once)."""
    return argv if "--model" in argv else ["--model", "toy-llama", *argv]


@pytest.mark.parametrize("argv, message", BAD_FLAGS)
def test_bad_flags_exit_with_code_2_and_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(_with_model(argv))
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv",
    [
        ["--modes", "eager," + LONG],
        ["--modes", LONG + "," + LONG],
        ["--batch-size", LONG],
        ["--device", LONG],
        ["--num-iters-warmup", LONG],
    ],
    ids=["unknown-mode", "duplicate-mode", "batch-size", "device", "num-iters-warmup"],
)
def test_errors_echo_at_most_a_few_hundred_characters_of_the_input(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(_with_model(argv))
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]  # the line after argparse's usage
    assert message.startswith(f"python -m reference.bench_latency: error: argument {argv[0]}")
    assert len(message) < 500, message[:600]


@pytest.mark.parametrize(
    "overrides",
    [
        "{'cudagraph_capture_sizes': [1, 2], 'custom_ops': ['none'], 'splitting_ops': []}",
        "3",  # the compiled modes' own level: changes nothing
        "{'level': 3, 'inductor_compile_config': {'max_autotune': True}}",
    ],
)
def test_compilation_config_may_override_fields_that_keep_the_mode(overrides):
    modes = "inductor" if "inductor_compile_config" in overrides else "eager,no_inductor,inductor"
    args = parse_args(["--model", "toy-llama", "--modes", modes, "--compilation-config", overrides])
    for mode in args.modes:
        kwargs = mode_kwargs(mode, args.compilation_config)
        if mode == "eager":
            assert kwargs == MODES["eager"]  # enforce_eager: nothing of a compiled config applies
            continue
        resolved = CompilationConfig.parse(kwargs["compilation_config"]).describe()
        assert {key: resolved[key] for key in config_fields(overrides)} == config_fields(overrides)
        assert (resolved["level"], resolved["use_inductor"]) == (3, mode == "inductor")  # still the mode


def test_empty_baselines_mean_none_like_the_default():
    assert parse_args(["--model", "toy-llama", "--baselines", ""]).baselines == []


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in (
        "--model",
        "--batch-size",
        "--input-len",
        "--output-len",
        "--num-iters-warmup",
        "--num-iters",
        "--compilation-config",
        "--enforce-eager",
        "--dtype",
        "--device",
        "--modes",
        "--baselines",
        "--output-json",
        "--results-dir",
        "--num-iters-baseline",
        "--num-iters-warmup-baseline",
    ):
        assert flag in out


@pytest.mark.gpu
@pytest.mark.eager
@pytest.mark.breakable
@pytest.mark.no_inductor
@pytest.mark.inductor
@pytest.mark.no_inductor_full
@pytest.mark.inductor_full
def test_on_cuda_every_mode_reports_a_floor_it_does_not_beat(tmp_path):
    argv = ["--model", "llama-tiny", *TINY_RUN, "--device", "cuda", "--output-json", str(tmp_path / "out.json")]
    main(argv)
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["env"]["gpu"] == torch.cuda.get_device_name()
    assert doc["bandwidth_Bps"] > 0
    assert [r["mode"] for r in doc["results"]] == list(MODES)
    for r in doc["results"]:
        # a run reads every weight once per generated token: no mode can be faster than that
        assert r["floor_s"] > 0 and r["latency_s"]["p50"] >= r["floor_s"]
        assert r["x_floor"] == pytest.approx(r["latency_s"]["p50"] / r["floor_s"])
    compiled = [r for r in doc["results"] if r["mode"] != "eager"]
    for r in compiled:  # decode up to --batch-size 2, the prefill's 2 x 3 tokens; full modes serve 1-token
        startup = r["startup"]  # steps with a full graph only
        piecewise = [6, 2] if startup["full_capture_sizes"] else [6, 2, 1]
        assert startup["capture_sizes"] == piecewise and startup["full_capture_sizes"] in ([], [2, 1]), r["mode"]


def test_the_clis_dtype_names_are_the_engines():
    from reference.benchmark.choices import DTYPE_NAMES
    from reference.engine.arguments import DTYPES

    assert list(DTYPE_NAMES) == list(DTYPES)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["-cc", "{'custom_ops': ['none']}"], {"custom_ops": ["none"]}),
        (["--compilation-config.cudagraph_capture_sizes=[1,2]"], {"cudagraph_capture_sizes": [1, 2]}),
        (["--compilation-config.custom_ops", "['none']"], {"custom_ops": ["none"]}),
        (["-cc.level", "3"], {"level": 3}),
        (["-O.inductor_compile_config.max_autotune=true"], {"inductor_compile_config": {"max_autotune": True}}),
        (
            ["-O.inductor_compile_config.max_autotune=true",
             "-O.inductor_compile_config.coordinate_descent_tuning=true"],  # fmt: skip
            {"inductor_compile_config": {"max_autotune": True, "coordinate_descent_tuning": True}},
        ),
        (
            ["-O.cudagraph_capture_sizes=[1, 2]", "-cc.custom_ops=['none']"],
            {"cudagraph_capture_sizes": [1, 2], "custom_ops": ["none"]},
        ),
        (
            ["--compilation-config", "{'custom_ops': ['none']}", "-O.cudagraph_capture_sizes=[4]"],
            {"custom_ops": ["none"], "cudagraph_capture_sizes": [4]},
        ),
        (["-cc={'custom_ops': ['none']}"], {"custom_ops": ["none"]}),  # was 'unrecognized arguments'
        # Inductor names its options with dots ('cpp.threads'): a new user's nested {'cpp': {'threads': 4}} was
        # refused by Inductor with a wrong hint ("did you mean ['cpp.cxx']")
        (["-O.inductor_compile_config.cpp.threads=4", "-O.inductor_compile_config.max_autotune=true"],
         {"inductor_compile_config": {"cpp.threads": 4, "max_autotune": True}}),  # fmt: skip
    ],
    ids=["cc-dict", "long-dotted", "long-dotted-space", "cc-dotted-space", "nested", "nested-merged", "dotted-fields",
         "dotted-with-a-whole-config", "cc-equals", "inductor-dotted-option"],  # fmt: skip
)
def test_vllm_shorthands_spell_the_compilation_config(argv, expected):
    args = parse_args(["--model", "toy-llama", "--modes", "inductor", *argv])
    assert args.compilation_config == expected


@pytest.mark.parametrize(
    "argv, modes",
    [(["-O0"], ["eager"]), (["-O1"], ["inductor"]), (["-O2"], ["inductor_full"]), (["-O3"], ["inductor_full"]),
     (["-O", "1"], ["inductor"]), (["--optimization-level", "0"], ["eager"]),
     (["--optimization-level=2"], ["inductor_full"]), (["-O0", "--enforce-eager"], ["eager"]),
     (["-O0", "--modes", "eager"], ["eager"]), (["--modes", "inductor", "-O1"], ["inductor"])],
    ids=["O0", "O1", "O2", "O3", "O-space-1", "long-0", "long-equals-2", "O0-and-enforce-eager",
         "O0-and-its-mode", "its-mode-and-O1"],
)  # fmt: skip
def test_O_digit_is_vllms_optimization_level_and_picks_the_mode(argv, modes):
    """vLLM today: -O0 no compilation nor graphs, -O1 Inductor + piecewise graphs, -O2 (its default) and -O3
    Inductor + full and piecewise graphs; here that is the mode to run."""
    args = parse_args(["--model", "toy-llama", *argv])
    assert args.modes == modes and args.compilation_config is None


def test_O_digit_and_dotted_fields_combine():
    args = parse_args(["--model", "toy-llama", "-O1", "-O.custom_ops=['none']"])
    assert args.modes == ["inductor"] and args.compilation_config == {"custom_ops": ["none"]}


@pytest.mark.parametrize("after", [[], ["-O3"], ["-tp", "1"], ["--modes", "eager"]], ids=["last", "O3", "tp", "modes"])
@pytest.mark.parametrize("flag", ["-O.level", "--compilation-config.level"])
def test_a_dotted_field_without_a_value_is_a_usage_error(capsys, flag, after):
    """The next argument is the value unless it is a flag (a negative number is a value)."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "toy-llama", flag, *after])
    assert exit_info.value.code == 2
    assert f"{flag}: no value; expected {flag}=VALUE or {flag} VALUE" in capsys.readouterr().err


ERROR = "python -m reference.bench_latency: error: "


def _usage_error(argv: list[str], capsys) -> str:
    """The stderr of ``main(argv)`` (after ``--model toy-llama``), which must exit 2."""
    with pytest.raises(SystemExit) as exit_info:
        main(_with_model(argv))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, flag",
    [(["-O"], "-O"), (["-O", "--modes", "eager"], "-O"), (["-O", "-tp", "1"], "-O"), (["-O="], "-O"),
     (["--optimization-level"], "--optimization-level"),
     (["--optimization-level", "--modes", "eager"], "--optimization-level"),
     (["--optimization-level="], "--optimization-level")],
    ids=["O-last", "O-then-modes", "O-then-tp", "O-equals", "long-last", "long-then-modes", "long-equals"],
)  # fmt: skip
def test_an_optimization_level_without_a_value_is_one_wording(argv, flag, capsys):
    """Was three wordings: a compilation config '' that is not JSON, argparse's 'expected one argument',
    and a level expected, got '' (or got '--modes', the next flag taken as the value)."""
    assert _usage_error(argv, capsys) == (
        f"{ERROR}{flag}: no value; expected an optimization level 0, 1, 2 or 3 (see --help)\n"
    )


@pytest.mark.parametrize(
    "argv, value",
    [(["-O7"], "7"), (["-O-1"], "-1"), (["-O3x"], "3x"), (["-Ox"], "x"), (["-O=7"], "7"), (["-O=-1"], "-1"),
     (["-O", "7"], "7"), (["-O", "-1"], "-1")],
    ids=["O7", "O-1", "O3x", "Ox", "O-equals-7", "O-equals--1", "O-space-7", "O-space--1"],
)  # fmt: skip
def test_a_bad_O_level_names_the_flag_the_value_and_the_levels(argv, value, capsys):
    """-O-1, -O3x and -O=7 were argparse's 'unrecognized arguments'; -O -1 a compilation config of level -1."""
    assert _usage_error(argv, capsys) == (
        f"{ERROR}-O: optimization level expected 0, 1, 2 or 3, got '{value}' (see --help)\n"
    )


def test_O_equals_level_is_the_level_as_in_vllm():
    """vLLM reads -O=3 as -O3 (as --optimization-level=3)."""
    assert parse_args(["--model", "toy-llama", "-O=3"]).modes == ["inductor_full"]
    assert parse_args(["--model", "toy-llama", "-O=0"]).modes == ["eager"]


@pytest.mark.parametrize(
    "argv, given",
    [(["--optimization-level", "2", "-O2"], "twice (--optimization-level 2, -O2)"),
     (["-O", "1", "--optimization-level=1"], "twice (-O 1, --optimization-level=1)"),
     (["-O=3", "-O3"], "twice (-O=3, -O3)"),
     (["-O3", "-O2", "-O1"], "3 times (-O3, -O2, -O1)")],
    ids=["long-and-short", "spaced-and-equals", "equals-and-short", "three"],
)  # fmt: skip
def test_a_level_given_twice_echoes_what_was_typed(argv, given, capsys):
    """Was '(-O2, -O2)' for --optimization-level 2 -O2."""
    assert _usage_error(argv, capsys) == f"{ERROR}optimization level given {given}; give one (see --help)\n"


@pytest.mark.parametrize(
    "argv, level, config",
    [(["-O0", "-O.custom_ops=['none']"], "-O0", "-O.custom_ops"),
     (["-O.custom_ops=['none']", "-O0"], "-O0", "-O.custom_ops"),
     (["--optimization-level", "0", "-cc.splitting_ops", "[]"], "--optimization-level 0", "-cc.splitting_ops"),
     (["-O", "0", "-cc", "{'custom_ops': ['none']}"], "-O 0", '''-cc "{'custom_ops': ['none']}"'''),
     (["-O0", "--compilation-config={'custom_ops': ['none']}"], "-O0",
      '''--compilation-config="{'custom_ops': ['none']}"'''),
     (["-O0", "-O", "{'custom_ops': ['none']}"], "-O0", '''-O "{'custom_ops': ['none']}"'''),
     (["-O0", "-O.custom_ops=['none']", "-O.splitting_ops=[]"], "-O0", "-O.custom_ops, -O.splitting_ops")],
    ids=["O0-dotted", "dotted-O0", "long-level-cc-dotted", "O-space-0-cc", "O0-long-config", "O0-O-config",
         "O0-two-fields"],
)  # fmt: skip
def test_level_0_and_a_compilation_config_name_what_was_typed_and_why_they_conflict(argv, level, config, capsys):
    """-O0 -O.custom_ops=... blamed --modes and --compilation-config, neither of them typed. -O0 is the eager
    mode, enforce_eager, whose row runs no compilation config (as --modes eager with --compilation-config)."""
    assert _usage_error(argv, capsys) == (
        f"{ERROR}{level} runs the eager mode (enforce_eager), which takes no compilation config, so {config} "
        f"cannot apply; drop {'them' if ', ' in config else 'it'}, or choose a compiled level (-O1 .. -O3) "
        "(see --help)\n"
    )


def test_help_shows_the_dotted_field_spellings(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = "".join(capsys.readouterr().out.split())  # argparse wraps lines, at hyphens too
    for spelling in ("-O.FIELD=VALUE", "-cc.FIELD=VALUE", "--compilation-config.FIELD=VALUE",
                     "-O.inductor_compile_config.max_autotune=true"):  # fmt: skip
        assert spelling in out, spelling


@pytest.mark.eager
def test_a_memory_check_error_ends_like_the_other_usage_errors(capsys):
    """The memory check (kv_cache.check_fits, before the weights are built) is a usage error too: the
    batch and lengths asked for; the CLI adds the '(see --help)' of its other errors, the library does not."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "llama-tiny", "--batch-size", str(10**8), "--input-len", "4", "--output-len", "2",
              "--modes", "eager", "--num-iters-warmup", "0", "--num-iters", "1"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{ERROR}max_num_seqs x max_model_len ({10**8} x 6)") and err.endswith(" (see --help)\n")
    assert len(err.splitlines()) == 1, err
    # the engine's names in the flags' terms: the user gave --batch-size and the two lengths (a new user's try)
    assert "; lower either (here max_num_seqs is --batch-size, max_model_len --input-len + --output-len) (" in err
    from reference.config import ConfigError
    from reference.engine.kv_cache import check_fits

    with pytest.raises(ConfigError) as error:
        check_fits(2**62, torch.device("cpu"), 10**8, 6)
    assert "--help" not in str(error.value)  # the library's message has no CLI wording


def test_help_imports_neither_torch_nor_transformers():
    """--help answers at once: nothing heavy is imported before the flags are parsed."""
    code = (
        "import sys\nfrom reference.bench_latency import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


@pytest.mark.eager
@pytest.mark.no_inductor
def test_the_printed_table_says_what_ran_and_eager_compiles_nothing(capsys):
    main(["--model", "llama-tiny", *TINY_RUN, "--modes", "eager,no_inductor", "--device", "cpu"])
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0].startswith("llama-tiny on cpu") and "float32" in out[0] and "batch 2, 3 prompt + 2 generated" in out[0]
    )
    assert out[1].startswith("note: CUDA graphs need CUDA")
    rows = {
        line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in out if line.startswith("| ")
    }
    compile_column = rows["mode"].index("compile s")
    assert rows["eager"][compile_column] == "-" and rows["no_inductor"][compile_column] != "-"


@pytest.mark.eager
def test_a_truncated_checkpoint_is_one_line_and_exit_2(tmp_path, capsys):
    import shutil
    from pathlib import Path

    checkpoint = tmp_path / "tiny-llama"
    shutil.copytree(Path(__file__).resolve().parents[1] / "fixtures" / "tiny-llama", checkpoint)
    weights = checkpoint / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])  # an interrupted download
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", str(checkpoint), *TINY_RUN, "--modes", "eager", "--device", "cpu"])
    assert exit_info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("python -m reference.bench_latency: error: ") and "model.safetensors: truncated" in last


@pytest.mark.slow
@pytest.mark.no_inductor
@pytest.mark.inductor
def test_torch_native_runs_as_a_baseline_in_the_engine_and_every_mode_gets_its_ratio(tmp_path):
    """torch's own piecewise path, compiled by reference.peers in this engine (on a CPU: Inductor without graphs)."""
    out = tmp_path / "out.json"
    main(["--model", "llama-tiny", *TINY_RUN, "--modes", "no_inductor", "--baselines", "torch-native",
          "--device", "cpu", "--output-json", str(out)])  # fmt: skip
    engine, peer = json.loads(out.read_text())["results"]
    assert (peer["mode"], peer["kind"]) == ("torch-native", "baseline")
    assert peer["compilation_config"]["level"] == 3 and peer["compilation_config"]["use_inductor"] is True
    assert peer["startup"]["first_call_s"] > 0 and peer["iters"] == 2
    assert engine["speedup_vs"]["torch-native"] == pytest.approx(peer["latency_s"]["p50"] / engine["latency_s"]["p50"])


@pytest.mark.eager
def test_threads_are_set_for_the_run_and_given_back(tmp_path):
    if len(os.sched_getaffinity(0)) < 2:  # --threads allows this process's CPUs (taskset -c 1: one)
        pytest.skip("needs two CPUs to set two threads")
    before = torch.get_num_threads()
    main(["--model", "llama-tiny", *TINY_RUN, "--modes", "eager", "--threads", "2", "--output-json", f"{tmp_path}/o"])
    assert json.loads((tmp_path / "o").read_text())["env"]["threads"] == 2
    assert torch.get_num_threads() == before  # the caller's pool, as it was


@pytest.mark.breakable
def test_capture_sizes_no_step_can_use_are_one_line_and_exit_2(capsys):
    """The runner finds it (the sizes exceed batch x (input + output) tokens), after the flags are parsed."""
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "llama-tiny", *TINY_RUN, "--modes", "breakable", "-O.cudagraph_capture_sizes=[512]"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m reference.bench_latency: error: cudagraph_capture_sizes [512] all exceed")
    assert not any("Traceback" in line for line in err)


def test_a_dotted_number_is_that_number_and_every_usage_error_is_one_line(capsys):
    args = parse_args(["--model", "toy-llama", "--modes", "inductor", "-O.max_cudagraph_capture_size=2"])
    assert args.compilation_config == {"max_cudagraph_capture_size": 2}  # not {'level': 2}
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "toy-llama", "--modes", "inductor", "-O.level=0"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sets level, which --modes decides" in err[0], err
    with pytest.raises(SystemExit):  # vLLM's name for the field is the same field
        main(["--model", "toy-llama", "--modes", "inductor", "-O.mode=NONE"])
    assert "sets level, which --modes decides" in capsys.readouterr().err


@pytest.mark.eager
@pytest.mark.parametrize("batch_size", [10**8, 10**23], ids=["past-memory", "past-int64"])
def test_a_batch_no_kv_cache_can_hold_is_one_line_and_exit_2_before_any_work(batch_size, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "llama-tiny", "--batch-size", str(batch_size), "--input-len", "4", "--output-len", "2",
              "--modes", "eager", "--num-iters-warmup", "0", "--num-iters", "1"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert re.match(
        rf"python -m reference.bench_latency: error: max_num_seqs x max_model_len \({batch_size} x 6\)", err
    )


def _interrupted_at(call: int, monkeypatch):
    """Make the ``call``-th timed run of generates raise KeyboardInterrupt, as Ctrl-C would."""
    from reference.benchmark import latency

    real, calls = latency.time_calls, []

    def time_calls(*args, **kwargs):
        calls.append(None)
        if len(calls) == call:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(latency, "time_calls", time_calls)


@pytest.mark.eager
@pytest.mark.breakable
def test_ctrl_c_keeps_the_table_and_files_of_the_modes_that_finished(tmp_path, capsys, monkeypatch):
    """Ctrl-C during the second mode was a 22-43-line traceback, every finished mode's result lost."""
    _interrupted_at(2, monkeypatch)
    out_json = tmp_path / "run.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "llama-tiny", *TINY_RUN, "--modes", "eager,breakable", "--device", "cpu",
              "--output-json", str(out_json)])  # fmt: skip
    assert exit_info.value.code == 130  # the shell's code for a run stopped by SIGINT
    captured = capsys.readouterr()
    assert "| eager |" in captured.out and "| breakable |" not in captured.out
    err = captured.err.strip().splitlines()
    assert err[-1] == "python -m reference.bench_latency: interrupted during breakable: 1 of 2 runs finished"
    assert "Traceback" not in captured.err
    doc = json.loads(out_json.read_text())
    assert [r["mode"] for r in doc["results"]] == ["eager"] and doc["interrupted"] == err[-1].split(": ", 1)[1]


@pytest.mark.eager
def test_ctrl_c_before_any_mode_finished_is_one_line(capsys, monkeypatch):
    _interrupted_at(1, monkeypatch)
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "llama-tiny", *TINY_RUN, "--modes", "eager", "--device", "cpu"])
    assert exit_info.value.code == 130
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines()[-1] == (
        "python -m reference.bench_latency: interrupted during eager: 0 of 1 runs finished"
    )
    assert "Traceback" not in captured.err and "|" not in captured.out
