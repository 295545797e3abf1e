"""Tensor parallelism: a model sharded over two CPU processes (gloo) computes what one process computes.

For each tiny preset one launch of two ranks (conformance/tensor_parallel_worker.py, started with the variables
``torchrun --standalone --nproc-per-node 2`` gives its workers, by ``forked.run_ranks``; the benchmark's test
runs torchrun itself) builds the whole model and each rank's shard from the same weights, runs both in every mode over a
prefill of three prompts and four greedy decode steps (three rows, padded to capture size 4), and
generates with ``LLM(tensor_parallel_size=1)`` and ``2``. The rules:

* logits within ``ORACLE_ATOL`` of the one-process model's (fp32: the all-reduce adds the two halves
  of each row-parallel GEMM in another order than one GEMM sums them), and equal on both ranks (the LM
  head's all-gather hands every rank the same bits);
* greedy tokens equal, where the one-process model's two best logits are at least ``MARGIN`` apart;
* per rank, the compilation counters of the one-process model (one graph, the same pieces; the
  all-reduce is not a splitting op) and ``2 * layers + 1`` all-reduces, all inside compiled pieces;
* ``LLM`` generates the same tokens with either size.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conformance import forked
from conformance.once import computed_once, shared_folder
from conformance.oracle import ORACLE_ATOL
from conformance.tensor_parallel_worker import MODELS
from reference.engine import LLM
from reference.models.registry import model_config

ROOT = Path(__file__).resolve().parents[1]
MARGIN = 1e-3  # as the oracle tests: closer than this, rounding may pick either token
SIZE = 2
# The worker's default --modes. The graph kinds of the other modes (breakable, full) change nothing a CPU run
# over gloo can see: there they run as eager and as their base modes.
MODES = ("eager", "no_inductor", "inductor")

# One launch of two ranks per model serves every test of it, on whichever worker needs it first (conformance/once.py).
# slow: the tests launch two processes per model, every mode, 10-40 s each on two cores
pytestmark = [pytest.mark.requires("tensor_parallel"), pytest.mark.slow]


def _launch(model: str, impl_spec: str, modes: list[str], llm: bool, out: Path) -> list[dict] | str:
    """Every rank's results for ``model`` in ``modes`` (and its LLM generations if ``llm``), or why there are
    none. The ranks are the ones torchrun would start, forked from the preloaded server (``forked.run_ranks``);
    torchrun itself starts the benchmark's ranks below."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "conformance.tensor_parallel_worker", "--model", model, "--impl", impl_spec]
    cmd += ["--out", str(out), f"--modes={','.join(modes)}", *([] if llm else ["--no-llm"])]
    ranks = forked.run_ranks(cmd, SIZE, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=900)
    for rank, proc in enumerate(ranks):
        if proc.returncode != 0:
            return f"rank {rank} exited {proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}"
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(SIZE)]


def _needed(session, model: str) -> tuple[list[str], bool]:
    """The modes the session's selected tests of ``model`` read, and whether one reads the LLM generations
    (the tests without a mode): a fault's run that selects one eager test launches no Inductor compile."""
    mine = [item for item in session.items if item.path == Path(__file__) and hasattr(item, "callspec")]
    params = [item.callspec.params for item in mine if item.callspec.params.get("model") == model]
    modes = [mode for mode in MODES if any(p.get("mode") == mode for p in params)]
    return modes, any("mode" not in p for p in params)


@pytest.fixture
def ranks(request, impl):
    """``ranks(model)``: the worker's results of each rank, for the implementation under test (one launch
    per model and session, of what the session's selected tests read). It takes ``impl``: the worker runs the
    implementation ``--impl`` names, so these tests are ``--impl-tests-only``'s too."""

    def results(model: str) -> list[dict]:
        out = shared_folder(request) / f"tp-{model}"
        modes, llm = _needed(request.session, model)
        launch = functools.partial(_launch, model, request.config.getoption("impl"), modes, llm, out)
        launched = computed_once(request, f"tensor-parallel {model}", launch)
        if isinstance(launched, str):
            pytest.fail(launched)
        return launched

    return results


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_logits_match_one_process_on_every_rank(model, mode, ranks):
    results = ranks(model)
    for rank in results:
        logits = rank["modes"][mode]["logits"]
        for step, (shard, whole) in enumerate(zip(logits["shard"], logits["whole"])):
            where = f"rank {rank['rank']}, step {step}"
            torch.testing.assert_close(shard, whole, rtol=0, atol=ORACLE_ATOL, msg=lambda m: f"{where}: {m}")
    first, *others = (r["modes"][mode]["logits"]["shard"] for r in results)
    for other in others:
        assert all(torch.equal(a, b) for a, b in zip(first, other)), "ranks disagree on the gathered logits"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_greedy_tokens_equal_one_process(model, mode, ranks):
    logits = ranks(model)[0]["modes"][mode]["logits"]
    for step, (shard, whole) in enumerate(zip(logits["shard"], logits["whole"])):
        top2 = whole.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) >= MARGIN
        assert clear.any(), f"step {step}: no row has a clear best token; the rule checks nothing"
        assert torch.equal(shard.argmax(-1)[clear], whole.argmax(-1)[clear]), f"step {step}"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_counters_per_rank_and_all_reduces_inside_pieces(model, mode, ranks):
    results = ranks(model)
    layers = model_config(model).num_hidden_layers
    for rank in results:
        run = rank["modes"][mode]
        assert run["counters"]["shard"] == run["counters"]["whole"], f"rank {rank['rank']}"
        if mode == "eager":
            assert run["counters"]["shard"]["num_graphs_seen"] == 0
            continue
        assert run["counters"]["shard"]["num_graphs_seen"] == 1  # no graph break at a collective
        pieces = run["all_reduces"]
        if pieces is None:
            pytest.skip("the implementation exposes no pieces")
        assert [n for split, n in pieces if split] == [0] * layers, "an all-reduce in a splitting-op piece"
        # the embedding's, then each layer's o_proj and down_proj
        assert sum(n for split, n in pieces if not split) == 2 * layers + 1, pieces


@pytest.mark.no_inductor  # the worker's LLMs run level 3 with use_inductor=False
@pytest.mark.parametrize("model", MODELS)
def test_tensor_parallel_llm_generates_the_tokens_of_one_process(model, ranks):
    for rank in ranks(model):
        assert rank["llm"]["shard"] == rank["llm"]["whole"], f"rank {rank['rank']}"


# ---------------------------------------------------------------------- bad sizes, in this process
@pytest.mark.parametrize(
    "size, message",
    [
        (3, "tensor_parallel_size=3 does not divide the model's num_attention_heads (4)"),
        (4, "tensor_parallel_size=4 does not divide the model's num_key_value_heads (2)"),
        (0, "tensor_parallel_size: expected an int >= 1, got 0"),
        (True, "tensor_parallel_size: expected an int >= 1, got True"),
        ("2", "tensor_parallel_size: expected an int >= 1, got '2'"),
        (2, "tensor_parallel_size=2 needs 2 processes, one per device, but this process is one of 1 (WORLD_SIZE)"),
    ],
)
def test_tensor_parallel_size_errors_are_one_line_naming_it(size, message, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        LLM("llama-tiny", device="cpu", tensor_parallel_size=size, use_tqdm=False)
    assert "\n" not in str(err.value)


def test_tensor_parallel_refuses_a_model_without_parallel_layers():
    with pytest.raises(ValueError, match=r"tensor_parallel_size=2: model_type 'toy' has no tensor-parallel"):
        LLM("toy-llama", device="cpu", tensor_parallel_size=2, use_tqdm=False)


# ---------------------------------------------------------------------- the benchmark CLI under torchrun
BENCH = ["-m", "reference.bench_latency", "--model", "llama-tiny", "--device", "cpu", "--batch-size", "2"]
BENCH += ["--input-len", "4", "--output-len", "4", "--num-iters-warmup", "0", "--num-iters", "1"]


@pytest.mark.eager
@pytest.mark.no_inductor
def test_tensor_parallel_bench_latency_under_torchrun_reports_once_from_rank_0(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={SIZE}", *BENCH]
    cmd += ["--modes", "eager,no_inductor", "--tensor-parallel-size", str(SIZE), "--output-json", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.count("| no_inductor |") == 1, proc.stdout  # one table, from rank 0
    doc = json.loads(out.read_text())
    assert doc["settings"]["tensor_parallel_size"] == SIZE
    assert [r["same_tokens_as_first"] for r in doc["results"]] == [1.0, 1.0]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["-tp", "2"], "error: tensor_parallel_size=2 needs 2 processes"),
        (["-tp", "2", "--baselines", "hf-eager"], "--baselines hf-eager: the baselines run in one process"),
        (["-tp", "0"], "--tensor-parallel-size"),
        (["-tp", "1", "WORLD_SIZE=2"], "--tensor-parallel-size 1 under 2 processes (WORLD_SIZE); pass"),
    ],
)
def test_tensor_parallel_bench_latency_errors_are_one_line_with_exit_2(extra, message):
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    env.update(arg.split("=", 1) for arg in extra if "=" in arg)
    args = [arg for arg in extra if "=" not in arg]
    proc = forked.run([sys.executable, *BENCH, *args], env=env)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
