"""The latency benchmark's command line: runs end to end on tiny models, writes the documented JSON and
markdown, and rejects bad flags with argparse's exit code 2 and a message naming the flag."""

import json
import re

import numpy as np
import pytest
import torch

from reference.bench_latency import MODES, latency_stats, main, mode_kwargs

TINY_RUN = ["--batch-size", "2", "--input-len", "3", "--output-len", "2", "--num-iters-warmup", "1", "--num-iters", "2"]


def test_bench_runs_end_to_end_and_writes_the_documented_json_and_markdown(tmp_path, capsys):
    argv = ["--model", "toy-llama", *TINY_RUN, "--modes", "eager,no_inductor", "--device", "cpu"]
    argv += ["--output-json", str(tmp_path / "out.json"), "--results-dir", str(tmp_path / "results")]
    main(argv)
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["model"] == "toy-llama"
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
    assert doc["results"][1]["same_tokens_as_first"] == 1.0  # no_inductor runs eager's ops: same tokens
    assert doc["weight_bytes_per_decode_step"] > 0
    env = doc["env"]
    assert {"gpu", "torch", "date", "command"} <= set(env)
    assert env["command"] == "python -m reference.bench_latency " + " ".join(argv)
    # the results dir holds <model>-<date>.json (same document) and .md with one table row per mode
    (json_file,) = (tmp_path / "results").glob("toy-llama-*.json")
    assert json.loads(json_file.read_text())["results"] == doc["results"]
    (md_file,) = (tmp_path / "results").glob("toy-llama-*.md")
    table = [line for line in md_file.read_text().splitlines() if line.startswith("| ")]
    assert [line.split("|")[1].strip() for line in table] == ["mode", "eager", "no_inductor"]
    printed = capsys.readouterr().out
    assert "| eager |" in printed and "| no_inductor |" in printed


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


BAD_FLAGS = [
    (["--modes", "eager,fast"], r"argument --modes: unknown \['fast'\]"),
    (["--modes", "eager,eager"], "argument --modes: 'eager,eager' names an entry twice"),
    (["--baselines", "hf-fast"], r"argument --baselines: unknown \['hf-fast'\]"),
    (["--compilation-config", "{level: 3"], "argument --compilation-config: .*neither JSON"),
    (["--compilation-config", '{"levle": 3}'], r"argument --compilation-config: .*unknown key\(s\) \['levle'\]"),
    (
        ["--modes", "no_inductor", "--compilation-config", "{'inductor_compile_config': {'max_autotune': True}}"],
        "--compilation-config: with mode 'no_inductor': inductor_compile_config is set but use_inductor=False",
    ),
    (["--modes", "eager", "--compilation-config", "{'level': 3}"], "--compilation-config applies only to compiled"),
    (["--enforce-eager", "--modes", "inductor"], "--enforce-eager contradicts --modes inductor"),
    (["--batch-size", "0"], "argument --batch-size: expected an int >= 1, got '0'"),
    (["--model", "no-such-model"], "argument --model: model: 'no-such-model' is neither a preset"),
    (["--dtype", "float64"], "argument --dtype: invalid choice: 'float64'"),
    (["--input-len", "1000", "--output-len", "100"], r"--input-len \+ --output-len = 1100 exceeds"),
]


@pytest.mark.parametrize("argv, message", BAD_FLAGS, ids=[" ".join(argv)[:45] for argv, _ in BAD_FLAGS])
def test_bad_flags_exit_with_code_2_and_name_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", "toy-llama", *argv])
    assert exit_info.value.code == 2
    assert re.search(message, capsys.readouterr().err)


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--batch-size", "--input-len", "--output-len", "--num-iters-warmup", "--num-iters",
                 "--compilation-config", "--enforce-eager", "--dtype", "--device", "--modes", "--baselines",
                 "--output-json", "--results-dir", "--num-iters-baseline", "--num-iters-warmup-baseline"):
        assert flag in out


@pytest.mark.gpu
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
    assert all(r["startup"]["capture_sizes"] == [2, 1] for r in compiled)  # up to --batch-size 2
