"""The small-M GEMM's tuned configs: the table's checks, the lookup the kernel makes, and the tuning tool's
flags and merge (``python -m reference.tune_gemm``). The timings themselves need a GPU; the sweep runs here
only under Triton's interpreter."""

from __future__ import annotations

import json
import os

import pytest

from reference import tune_gemm
from reference.benchmark.gemm import decode_gemms
from reference.ops import linear_configs
from reference.ops.library import HAS_TRITON
from reference.ops.linear_configs import check_config, read_table, row_tile, shape_key, tuned_config

pytestmark = pytest.mark.requires("components")

CONFIG = {"BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 2, "num_warps": 4}
GPU = "NVIDIA H200"


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    """A config file of the test's own, read afresh."""
    path = tmp_path / "linear_configs.json"
    monkeypatch.setattr(linear_configs, "CONFIG_FILE", path)
    linear_configs._gpu_table.cache_clear()
    yield path
    linear_configs._gpu_table.cache_clear()


def test_rows_pad_to_the_kernels_row_tiles():
    assert [row_tile(m) for m in (0, 1, 15, 16, 17, 32, 33, 64)] == [16, 16, 16, 16, 32, 32, 64, 64]


def test_the_lookup_finds_a_gpus_shape_and_row_tile_and_nothing_else(table_file):
    shapes = {shape_key(6144, 4096, False): {"16": {**CONFIG, "us": 15.1}},
              shape_key(14336, 4096, True): {"64": CONFIG}}  # fmt: skip
    table_file.write_text(json.dumps({"gpus": {GPU: shapes}, "runs": {}}))
    assert tuned_config(GPU, 6144, 4096, 8, gated=False) == CONFIG  # "us" is the tool's note, not a launch setting
    assert tuned_config(GPU, 14336, 4096, 64, gated=True) == CONFIG
    for gpu, n, k, rows, gated in [("NVIDIA H100", 6144, 4096, 8, False), (GPU, 6144, 4096, 17, False),
                                   (GPU, 4096, 6144, 8, False), (GPU, 14336, 4096, 64, False)]:  # fmt: skip
        assert tuned_config(gpu, n, k, rows, gated) is None, (gpu, n, k, rows, gated)


def test_a_gated_weight_has_a_key_of_its_own():
    assert (shape_key(14336, 4096, False), shape_key(14336, 4096, True)) == ("14336 x 4096", "14336 x 4096 gated")


def test_the_boundaries_of_a_config_are_accepted():
    smallest = {**CONFIG, "BLOCK_N": 16, "BLOCK_K": 16, "SPLIT_K": 1}
    largest = {**CONFIG, "BLOCK_N": 1024, "BLOCK_K": 1024, "SPLIT_K": 64}
    for config in (smallest, largest, *({**CONFIG, "num_warps": w} for w in (1, 2, 4, 8, 16))):
        assert check_config(config, "x") == config


def test_no_file_is_no_tuned_config(table_file):
    assert read_table(table_file) == {"gpus": {}, "runs": {}}
    assert tuned_config(GPU, 6144, 4096, 8, gated=False) is None


@pytest.mark.parametrize(
    "config, message",
    [
        ({**CONFIG, "BLOCK_N": 48}, "BLOCK_N must be a power of two from 16 to 1024, got 48"),
        ({**CONFIG, "BLOCK_K": 8}, "BLOCK_K must be a power of two from 16 to 1024, got 8"),
        ({**CONFIG, "BLOCK_N": 2048}, "BLOCK_N must be a power of two from 16 to 1024, got 2048"),
        ({**CONFIG, "SPLIT_K": 0}, "SPLIT_K must be from 1 to 64 and num_warps one of [1, 2, 4, 8, 16]"),
        ({**CONFIG, "SPLIT_K": 65}, "SPLIT_K must be from 1 to 64"),
        ({**CONFIG, "num_warps": 3}, "SPLIT_K must be from 1 to 64 and num_warps one of [1, 2, 4, 8, 16]"),
        ({**CONFIG, "SPLIT_K": True}, "expected ints"),
        ({**CONFIG, "SPLIT_K": 2.0}, "expected ints"),
        ({"BLOCK_N": 32}, "expected a dict of ['BLOCK_N', 'BLOCK_K', 'SPLIT_K', 'num_warps']"),
        ({}, "expected a dict of"),
        ({**CONFIG, "stages": 3}, "expected a dict of"),
    ],
    ids=["block-n", "block-k", "block-n-too-large", "split-k", "split-k-too-large", "warps", "bool", "float",
         "missing-keys", "empty", "unknown-key"],  # fmt: skip
)
def test_a_bad_config_is_one_line_naming_its_entry(config, message):
    with pytest.raises(ValueError) as error:
        check_config(config, "file / gpu / shape / 16")
    assert str(error.value).startswith("file / gpu / shape / 16: ") and message in str(error.value)


def test_a_damaged_file_costs_one_warning_and_the_default_configs(table_file):
    """A start must not fail for a table that only makes GEMMs faster; it must not pass unnoticed either."""
    table_file.write_text(json.dumps({"gpus": {GPU: {"6144 x 4096": {"16": {**CONFIG, "BLOCK_N": 48}}}}, "runs": {}}))
    with pytest.raises(ValueError, match=r"linear_configs.json: NVIDIA H200 / 6144 x 4096 / 16: BLOCK_N must be"):
        read_table(table_file)
    with pytest.warns(RuntimeWarning, match="small-M GEMM configs not used: .*BLOCK_N must be") as caught:
        assert tuned_config(GPU, 6144, 4096, 8, gated=False) is None
        assert tuned_config(GPU, 4096, 4096, 8, gated=False) is None
    assert len(caught) == 1
    table_file.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable JSON file"):
        read_table(table_file)
    for doc in ([], {"gpus": {}}, {"runs": {}}, {"gpus": [], "runs": {}}):
        table_file.write_text(json.dumps(doc))
        with pytest.raises(ValueError, match=r"linear_configs.json: expected \{'gpus': \{...\}, 'runs': \{...\}\}$"):
            read_table(table_file)
    table_file.write_text(json.dumps({"gpus": {GPU: {"6144 x 4096": {"24": CONFIG}}}, "runs": {}}))
    with pytest.raises(ValueError, match=r"row tile '24' is not one of \[16, 32, 64\]"):
        read_table(table_file)


def test_writing_the_winners_keeps_other_gpus_and_shapes_and_records_the_run(tmp_path):
    path = tmp_path / "linear_configs.json"
    other = {"gpus": {"NVIDIA H100": {"4096 x 4096": {"16": CONFIG}}, GPU: {"4096 x 4096": {"64": CONFIG}}},
             "runs": {"NVIDIA H100": {"date": "2026-12-01"}}}  # fmt: skip
    path.write_text(json.dumps(other))
    winners = {("4096 x 4096", 16): {"triton": {"config": {**CONFIG, "SPLIT_K": 4}, "us": 12.345}, "cublas": {}}}
    tune_gemm.write_configs(winners, {"gpu": GPU, "date": "2026-12-05"}, path)
    doc = read_table(path)
    assert doc["gpus"]["NVIDIA H100"] == other["gpus"]["NVIDIA H100"]
    tuned = {**CONFIG, "SPLIT_K": 4, "us": 12.35, "run": "2026-12-05"}
    assert doc["gpus"][GPU]["4096 x 4096"] == {"64": CONFIG, "16": tuned}
    # the other GPU's record, a dict as files before 2026-12-06 kept it, reads as a list of one
    assert doc["runs"] == {"NVIDIA H100": [{"date": "2026-12-01"}], GPU: [{"gpu": GPU, "date": "2026-12-05"}]}


def test_a_second_write_for_the_same_gpu_keeps_the_first_runs_record(tmp_path):
    """A later run that sweeps other shapes keeps the earlier shapes' configs, so it must keep their record
    (command, commit, date) too, and each config names its run: on 2026-12-06 the Qwen3 and Gemma 3 sweep
    replaced the record of the 8B's sweep on the H100, whose configs stayed (two shapes of the 16-row tile,
    Qwen3's too, it made anew)."""
    path = tmp_path / "linear_configs.json"
    first = {("4096 x 4096", 16): {"triton": {"config": CONFIG, "us": 12.0}},
             ("6144 x 4096", 16): {"triton": {"config": CONFIG, "us": 20.0}}}  # fmt: skip
    second = {("6144 x 4096", 16): {"triton": {"config": CONFIG, "us": 21.0}}}
    llama = {"gpu": GPU, "date": "2026-12-06T07:30:30+00:00", "command": "--model llama-3.1-8b"}
    qwen = {"gpu": GPU, "date": "2026-12-06T07:36:00+00:00", "command": "--model qwen3-8b"}
    tune_gemm.write_configs(first, llama, path)
    tune_gemm.write_configs(second, qwen, path)
    doc = read_table(path)
    assert doc["runs"][GPU] == [llama, qwen]
    assert doc["gpus"][GPU]["4096 x 4096"]["16"]["run"] == llama["date"]
    assert doc["gpus"][GPU]["6144 x 4096"]["16"] == {**CONFIG, "us": 21.0, "run": qwen["date"]}


@pytest.mark.parametrize("records", [None, "2026-12-06", [{"date": "2026-12-06"}, "2026-12-06"]])
def test_a_gpus_runs_that_are_no_records_are_refused_naming_the_file_and_gpu(records, table_file, monkeypatch):
    """Before a sweep, not after it: tune_gemm --write reads the table first, before it looks for Triton or
    a GPU (a record that is no dict made the merge fail with an AttributeError after the whole sweep)."""
    table_file.write_text(json.dumps({"gpus": {}, "runs": {GPU: records}}))
    refusal = rf"linear_configs.json: runs / {GPU}: expected a list of run records"
    with pytest.raises(ValueError, match=refusal):
        read_table(table_file)
    monkeypatch.setattr(tune_gemm, "sweep", lambda args: pytest.fail("swept before reading the table"))
    with pytest.raises(ValueError, match=refusal):
        tune_gemm.main(["--model", "llama-tiny", "--write"])


def test_the_winner_is_the_fastest_config_that_launched():
    """A config whose tiles need more shared memory than an SM has fails to launch (the H200 refused 288 KiB of
    BLOCK_N 128 x BLOCK_K 256 gated tiles): it is recorded, and no candidate."""
    base = {"shape": "4096 x 4096", "row_tile": 16}
    rows = [{**base, "impl": "cublas", "us": 12.0}, {**base, "impl": "triton", "config": {"BLOCK_N": 128}, "us": None},
            {**base, "impl": "triton", "config": {"BLOCK_N": 64}, "us": 13.0},
            {**base, "impl": "triton", "config": {"BLOCK_N": 32}, "us": 12.5}]  # fmt: skip
    winners = tune_gemm.best(rows)
    assert winners[("4096 x 4096", 16)]["triton"]["config"] == {"BLOCK_N": 32}
    assert winners[("4096 x 4096", 16)]["cublas"]["us"] == 12.0


def test_a_shape_where_no_config_launched_is_said_and_not_written(tmp_path):
    """Every config of a sweep can be skipped (K slices narrower than the tiles, or out of resources): the table
    says so and the file keeps nothing for it; it was a KeyError after the whole sweep."""
    base = {"shape": "4096 x 4096", "row_tile": 16, "model": "m", "gemm": "o", "rows": 8}
    rows = [{**base, "impl": "cublas", "us": 12.0}, {**base, "impl": "triton", "config": {"BLOCK_N": 128}, "us": None}]
    winners = tune_gemm.best(rows)
    assert "| m | o | 4096 x 4096 | 8 | no config launched | - | - | 12.0 | - |" in tune_gemm.table(winners)
    path = tmp_path / "linear_configs.json"
    tune_gemm.write_configs(winners, {"gpu": GPU}, path)
    assert read_table(path)["gpus"] == {GPU: {}}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "llama-tiny", "--rows", "65"], "argument --rows: the kernel takes at most 64 rows, got 65"),
        (["--model", "llama-tiny", "--rows", "0,8"], "argument --rows: expected ints >= 1, got [0]"),
        (["--model", "llama-tiny", "--block-n", "48"],
         "argument --block-n: expected powers of two from 16 to 1024, got [48]"),
        (["--model", "llama-tiny", "--block-k", "128,2048"],
         "argument --block-k: expected powers of two from 16 to 1024, got [2048]"),
        (["--model", "llama-tiny", "--split-k", "1,65"], "argument --split-k: expected ints from 1 to 64, got [65]"),
        (["--model", "llama-tiny", "--split-k", "two"], "argument --split-k: expected comma-separated ints"),
        (["--model", "llama-tiny", "--num-warps", "4,3"],
         "argument --num-warps: expected some of [1, 2, 4, 8, 16], got [3]"),
        (["--model", "no-such-model"], "argument --model: "),
        (["--rows", "8"], "the following arguments are required: --model"),
    ],
    ids=["too-many-rows", "zero-rows", "block-n", "block-k-too-large", "split-k-too-large", "split-k", "warps", "model",
         "no-model"],  # fmt: skip
)
def test_a_bad_flag_is_one_line_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tune_gemm.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{tune_gemm.PROG}: error: {message}") and len(err.splitlines()) == 1, err


def test_the_cpu_is_the_interpreter_and_never_written_down(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(SystemExit):
        tune_gemm.main(["--model", "llama-tiny", "--device", "cpu"])
    assert "--device cpu runs the kernel under Triton's interpreter: set TRITON_INTERPRET=1" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the refusal that holds whatever is set comes first
        tune_gemm.main(["--model", "llama-tiny", "--device", "cpu", "--write"])
    assert "--write keeps a GPU's timings" in capsys.readouterr().err
    if HAS_TRITON:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        with pytest.raises(SystemExit):
            tune_gemm.main(["--model", "llama-tiny", "--device", "cpu", "--write"])
        assert "--write keeps a GPU's timings" in capsys.readouterr().err


@pytest.mark.skipif(
    not (HAS_TRITON and os.environ.get("TRITON_INTERPRET") == "1"), reason="needs Triton's interpreter"
)
def test_the_sweep_times_every_config_beside_cublas_and_the_kernel_uses_the_winner(table_file, tmp_path, monkeypatch):
    """Under the interpreter the numbers mean nothing; the rows, the winner per (shape, tile) and the lookup that
    hands the winner to the next launch are the same as on a GPU."""
    out = tmp_path / "tune.json"
    sweep = ["--block-n", "32,64", "--block-k", "64", "--split-k", "1", "--num-warps", "4", "--rounds", "1"]
    argv = ["--model", "llama-tiny,qwen3-tiny", "--device", "cpu", "--dtype", "float16", "--rows", "4", *sweep]
    argv += ["--output-json", str(out)]
    from reference.ops import linear_kernels

    real, called = linear_kernels.small_m_linear, set()

    def spy(x, weight, *, epilogue="none", residual=None, norm=None, **kwargs):
        called.add((tuple(weight.shape), epilogue, norm is not None, residual is not None))
        return real(x, weight, epilogue=epilogue, residual=residual, norm=norm, **kwargs)

    monkeypatch.setattr(linear_kernels, "small_m_linear", spy)
    tune_gemm.main(argv)
    monkeypatch.setattr(linear_kernels, "small_m_linear", real)
    # the two presets share every shape: one sweep each, credited to both
    assert {r["model"] for r in json.loads(out.read_text())["rows"]} == {"llama-tiny, qwen3-tiny"}
    gemms = {g.name: g for g in decode_gemms("llama-tiny")}
    assert called == {  # each GEMM timed as the fused model calls it: (weight, epilogue, norm, residual)
        ((gemms["qkv"].n, gemms["qkv"].k), "none", True, False),
        ((gemms["o"].n, gemms["o"].k), "residual", False, True),
        ((2 * gemms["gate_up"].n, gemms["gate_up"].k), "silu_and_mul", True, False),
        ((gemms["down"].n, gemms["down"].k), "residual", False, True),
    }
    rows = json.loads(out.read_text())["rows"]
    calls = {r["gemm"]: r["call"] for r in rows if r["impl"] == "triton"}  # the LM head stays on cuBLAS: not swept
    assert calls == {"qkv": "norm + GEMM", "o": "GEMM + residual", "gate_up": "norm + GEMM + silu_and_mul",
                     "down": "GEMM + residual"}  # fmt: skip
    assert all(r["row_tile"] == 16 for r in rows)
    assert sorted(r["impl"] for r in rows if r["shape"] == "128 x 64") == ["cublas", "triton", "triton"]
    winners = tune_gemm.best(rows)
    table_file.write_text(json.dumps({"gpus": {"cpu": {}}, "runs": {}}))
    tune_gemm.write_configs(winners, {"gpu": "cpu"}, table_file)
    linear_configs._gpu_table.cache_clear()

    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append((grid, kwargs["BLOCK_N"]))

    monkeypatch.setattr(linear_kernels, "_small_m_linear_kernel", Recorder())
    import torch

    linear_kernels.small_m_linear(torch.randn(4, 64, dtype=torch.float16), torch.randn(128, 64, dtype=torch.float16))
    best_block_n = winners[("128 x 64", 16)]["triton"]["config"]["BLOCK_N"]
    assert launches == [((128 // best_block_n, 1), best_block_n)]
