"""The throughput benchmark (``python -m reference.bench_throughput``): the workload it draws, the steps it
counts against the closed forms of static and continuous batching, the documented JSON, and one-line
errors for bad flags, given before any model is built."""

import heapq
import json
import weakref

import pytest

from reference import bench_throughput
from reference.bench_throughput import SCHEDULINGS, main
from reference.benchmark import throughput, throughput_results
from reference.benchmark.throughput import FIRST_PROMPT_TOKEN, draw_workload
from reference.engine.scheduler import SCHEDULING, SCHEDULING_POLICIES

pytestmark = pytest.mark.requires("components")

ERROR = "python -m reference.bench_throughput: error: "
NOT_A_LENGTH = "expected an int >= 1 or MIN:MAX (ints >= 1, MIN <= MAX), got"
# 7 requests over 3 rows: static runs three batches, continuous starts requests in freed rows
SMALL = ["--model", "llama-tiny", "--num-prompts", "7", "--input-len", "2:9", "--output-len", "1:6"]
SMALL += ["--max-num-seqs", "3", "--device", "cpu"]


def _run(tmp_path, *argv: str) -> dict:
    """The tool over SMALL with ``--modes eager``, ``argv``'s flags in place of those (each flag once)."""
    out = tmp_path / "throughput.json"
    base = [*SMALL, "--modes", "eager"]
    pairs = [(flag, value) for flag, value in zip(base[::2], base[1::2]) if flag not in argv]
    main([*(word for pair in pairs for word in pair), *argv, "--output-json", str(out)])
    return json.loads(out.read_text())


def _static_steps(output_lens: list[int], rows: int) -> int:
    """Static batching with a budget that holds every prompt of a batch: each batch of ``rows`` requests
    prefills in one step (sampling each request's first token) and decodes until its longest one ends."""
    return sum(max(output_lens[i : i + rows]) for i in range(0, len(output_lens), rows))


def _continuous_steps(output_lens: list[int], rows: int) -> int:
    """Continuous batching with such a budget is greedy list scheduling: requests in order, each starting in
    the first step where a row is free and holding it for as many steps as it generates tokens."""
    free_at = [0] * rows
    for n in output_lens:
        heapq.heappush(free_at, heapq.heappop(free_at) + n)
    return max(free_at)


@pytest.mark.eager
def test_the_cli_times_both_schedulings_over_the_drawn_workload_and_writes_the_documented_json(tmp_path, capsys):
    doc = _run(tmp_path, "--seed", "3")
    work = doc["workload"]
    assert work["token_range"] == [FIRST_PROMPT_TOKEN, 256]  # llama-tiny's vocabulary
    drawn = draw_workload(3, 7, (2, 9), (1, 6), 256)
    assert (work["input_lens"], work["output_lens"]) == ([len(p) for p in drawn.prompts], drawn.output_lens)
    assert work["output_tokens"] == sum(work["output_lens"]) and work["prompt_tokens"] == sum(work["input_lens"])
    assert (work["seed"], work["num_prompts"], work["input_len"], work["output_len"]) == (3, 7, [2, 9], [1, 6])
    assert doc["engine"]["max_model_len"] == 9 + 6 and doc["engine"]["max_num_seqs"] == 3
    assert doc["engine"]["scheduling_policy"] == "fcfs"
    assert [(r["mode"], r["scheduling"]) for r in doc["rows"]] == [("eager", "continuous"), ("eager", "static")]
    continuous, static = doc["rows"]
    for row in doc["rows"]:
        assert row["output_tokens"] == sum(work["output_lens"]), row  # ignore_eos: every length exact
        # every prompt token is fed once, every generated token but each request's last is fed back once
        assert row["tokens_run"] == work["prompt_tokens"] + work["output_tokens"] - work["num_prompts"], row
        assert row["requests_per_s"] == pytest.approx(7 / row["elapsed_s"])
        assert row["output_tokens_per_s"] == pytest.approx(work["output_tokens"] / row["elapsed_s"])
        total = work["prompt_tokens"] + work["output_tokens"]
        assert row["total_tokens_per_s"] == pytest.approx(total / row["elapsed_s"])
    assert static["num_steps"] == _static_steps(work["output_lens"], 3)
    assert continuous["num_steps"] == _continuous_steps(work["output_lens"], 3)
    assert continuous["num_steps"] < static["num_steps"]  # the drawn lengths leave static rows idle
    for row in doc["rows"]:  # every step timed once, under its kind
        assert sum(kind["count"] for kind in row["step_ms"].values()) == row["num_steps"], row["step_ms"]
        assert all(kind["mean_ms"] > 0 for kind in row["step_ms"].values()), row["step_ms"]
    # continuous batching starts requests beside decodes; static only into an empty engine, in one step
    assert "mixed" in continuous["step_ms"] and "mixed" not in static["step_ms"]
    assert static["step_ms"]["prefill"]["count"] == -(-7 // 3)
    assert continuous["speedup_vs_static"] == pytest.approx(static["elapsed_s"] / continuous["elapsed_s"])
    assert static["speedup_vs_static"] is None
    env = doc["env"]
    assert {"cpu", "threads", "gpu", "torch", "commit", "date", "command"} <= set(env) and env["gpu"] is None
    assert env["command"].startswith("python -m reference.bench_throughput --model llama-tiny --num-prompts 7 ")
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("llama-tiny on cpu") and "7 requests" in printed[0]
    table = [line for line in printed if line.startswith("| eager | none |")]
    assert [line.split(" | ")[2] for line in table] == ["continuous", "static"]
    assert table[0].split(" | ")[12] == f"{continuous['speedup_vs_static']:.2f}x" and table[1].split(" | ")[12] == "-"
    assert [line.split(" | ")[11] for line in table] == ["-", "-"]  # no floor on a CPU
    assert doc["bandwidth_Bps"] is None and all(row["decode_floor"]["x_floor"] is None for row in doc["rows"])


@pytest.mark.eager
def test_the_priority_policy_runs_the_longest_outputs_first_so_the_steps_are_those_of_that_order(tmp_path):
    """``--scheduling-policy priority`` gives each request its output length, negated, as its priority: the
    longest first (the longest-processing-time rule of list scheduling). Both schedulings then run the closed
    forms over the lengths sorted longest first."""
    doc = _run(tmp_path, "--seed", "3", "--scheduling-policy", "priority")
    longest_first = sorted(doc["workload"]["output_lens"], reverse=True)
    continuous, static = doc["rows"]
    assert continuous["num_steps"] == _continuous_steps(longest_first, 3)
    assert static["num_steps"] == _static_steps(longest_first, 3)
    assert doc["engine"]["scheduling_policy"] == "priority"
    assert all(row["output_tokens"] == sum(longest_first) for row in doc["rows"])
    assert bench_throughput.header(doc).splitlines()[0].endswith(", scheduling_policy priority (longest output first)")
    doc["engine"]["scheduling_policy"] = "fcfs"
    assert bench_throughput.header(doc).splitlines()[0].endswith(", scheduling_policy fcfs")


@pytest.mark.eager
@pytest.mark.no_inductor
def test_no_earlier_rows_kv_cache_is_alive_when_a_later_row_is_built(tmp_path):
    """The first row's LLM lends its weights to every later row, and nothing else: on issue 23's workload each
    row's KV cache is 48 GiB beside 16 GB of weights, and two caches do not fit an 80 GB GPU. So when a row's
    LLM is built, no cache of an earlier row may still be referenced (weak references tell)."""
    caches, alive_at_build = [], []
    build = throughput._build_llm

    def spy(*args, **kwargs):
        alive_at_build.append(sum(ref() is not None for ref in caches))
        llm = build(*args, **kwargs)
        caches.extend(weakref.ref(layer.kv_cache) for layer in llm.runner.attention_layers.values())
        return llm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(throughput, "_build_llm", spy)
        rows = _run(tmp_path, "--modes", "eager,no_inductor")["rows"]
    assert len(rows) == len(alive_at_build) == 4
    assert alive_at_build == [0, 0, 0, 0]


@pytest.mark.eager
def test_a_decode_steps_floor_counts_the_weights_and_the_kv_cache_it_reads_and_writes(tmp_path, capsys, monkeypatch):
    """Three requests of 5 prompt tokens and 4 generated ones in one batch: a prefill step, then decode steps
    feeding tokens 1-3 at contexts 5, 6 and 7 (token 4 is sampled by the last and never fed). Each reads its
    contexts' keys and values and writes one token's per sequence: 3 x (5 + 1), 3 x (6 + 1), 3 x (7 + 1)
    tokens, 21 on average, at 2 x layers x Hkv x D float32 elements a token (the model's config, not the
    code's count). A bandwidth of 1e9 B/s stands in for a GPU's, so the floor's arithmetic is checked."""
    from reference.benchmark.floor import Bandwidth
    from reference.models import registry

    monkeypatch.setattr(throughput, "floor_bandwidth", lambda device: Bandwidth(1e9, "a stand-in", 1e9))
    out = tmp_path / "throughput.json"
    main(["--model", "llama-tiny", "--num-prompts", "3", "--input-len", "5", "--output-len", "4", "--max-num-seqs",
          "3", "--device", "cpu", "--modes", "eager", "--output-json", str(out)])  # fmt: skip
    doc = json.loads(out.read_text())
    c = registry.model_config("llama-tiny").get_text_config()
    assert not c.tie_word_embeddings  # so the LM head is streamed and the embedding table only gathered
    per_token = 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4
    q_o = 2 * c.hidden_size * c.num_attention_heads * c.head_dim
    k_v = 2 * c.hidden_size * c.num_key_value_heads * c.head_dim
    layer = q_o + k_v + 3 * c.hidden_size * c.intermediate_size + 2 * c.hidden_size  # + its two norms
    weights = 4 * (c.num_hidden_layers * layer + c.hidden_size + c.vocab_size * c.hidden_size)  # final norm, head
    assert (doc["kv_bytes_per_token"], doc["weight_bytes_per_decode_step"]) == (per_token, weights)
    for row in doc["rows"]:
        assert row["step_ms"]["decode"]["count"] == 3, row["step_ms"]
        floor = row["decode_floor"]
        assert (floor["seqs_per_step"], floor["kv_bytes_per_step"]) == (3, 21 * per_token)
        assert floor["bytes_per_step"] == weights + 21 * per_token
        assert floor["floor_ms"] == pytest.approx(floor["bytes_per_step"] / 1e9 * 1e3)
        assert floor["x_floor"] == pytest.approx(row["step_ms"]["decode"]["mean_ms"] / floor["floor_ms"])
    printed = capsys.readouterr().out
    first = doc["rows"][0]["decode_floor"]
    cell = f"{first['x_floor']:.2f} (floor {first['floor_ms']:.3g} ms)"
    assert f"| {cell} |" in printed
    assert f"{per_token:,} B a token) / 1.000e+09 B/s" in printed


@pytest.mark.eager
def test_a_sliding_window_layer_moves_at_most_its_window_of_keys_and_values(tmp_path, capsys, monkeypatch):
    """gemma-3-tiny: one full-attention layer and two with a window of 4 tokens. One request of 10 prompt
    tokens and 3 generated ones decodes at contexts 10 and 11: the full layer moves 11 and 12 tokens, each
    windowed layer the 4 positions it attends to, twice (the config's layer types and window, not the code's)."""
    from reference.benchmark.floor import Bandwidth
    from reference.models import registry

    monkeypatch.setattr(throughput, "floor_bandwidth", lambda device: Bandwidth(1e9, "a stand-in", 2e9))
    out = tmp_path / "throughput.json"
    main(["--model", "gemma-3-tiny", "--num-prompts", "1", "--input-len", "10", "--output-len", "3",
          "--max-num-seqs", "1", "--device", "cpu", "--modes", "eager", "--scheduling", "static",
          "--output-json", str(out)])  # fmt: skip
    doc = json.loads(out.read_text())
    c = registry.model_config("gemma-3-tiny").get_text_config()
    per_layer = 2 * c.num_key_value_heads * c.head_dim * 4
    full, windowed = (c.layer_types.count(kind) for kind in ("full_attention", "sliding_attention"))
    assert (full, windowed, c.sliding_window) == (1, 2, 4)
    assert doc["kv_bytes_per_token"] == 3 * per_layer and doc["kv_sliding_windows"] == [[4, 2 * per_layer]]
    assert doc["bandwidth_measured_Bps"] == 2e9 and doc["bandwidth_Bps"] == 1e9
    moved = (11 + 12) * full * per_layer + (4 + 4) * windowed * per_layer
    assert doc["rows"][0]["decode_floor"]["kv_bytes_per_step"] == moved / 2
    assert f"of which {2 * per_layer:,} B in layers that read at most the last 4 tokens" in capsys.readouterr().out


def test_a_decode_steps_kv_bytes_count_each_window_apart():
    """Contexts 0, 3 and 9 under a window of 4: 1, 4 and 4 tokens; without a window: 1, 4 and 10."""
    assert throughput.decode_kv_bytes([0, 3, 9], {None: 10, 4: 1000}) == 15 * 10 + 9 * 1000
    assert throughput.decode_kv_bytes([0, 3, 9], {4: 1}) == 9 and throughput.decode_kv_bytes([], {None: 7}) == 0


@pytest.mark.eager
def test_a_run_without_a_decode_step_has_no_decode_floor(tmp_path):
    """One generated token per request: the prefill samples it and no decode step runs."""
    doc = _run(tmp_path, "--output-len", "1", "--scheduling", "static")
    assert [row["decode_floor"] for row in doc["rows"]] == [None]
    assert "decode" not in doc["rows"][0]["step_ms"]


@pytest.mark.no_inductor
@pytest.mark.no_inductor_full
def test_each_cudagraph_mode_is_a_row_of_every_mode_and_says_what_ran(tmp_path, capsys):
    """issue 23's comparison: 'full' against 'full_and_piecewise' over the same workload. On a CPU both pad
    every step to the same capture size (nothing is captured), so the tokens agree; the rows say what ran."""
    out = tmp_path / "throughput.json"
    main([*SMALL, "--modes", "no_inductor", "--cudagraph-mode", "full_and_piecewise,FULL", "--scheduling",
          "continuous", "--output-json", str(out)])  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["mode"], r["cudagraph_mode"]) for r in rows] == [("no_inductor", "full_and_piecewise"),
                                                                 ("no_inductor", "full")]  # fmt: skip
    assert [r["same_tokens_as_first_mode"] for r in rows] == [1.0, 1.0]
    assert "| no_inductor | full | continuous |" in capsys.readouterr().out


@pytest.mark.no_inductor
@pytest.mark.no_inductor_full
def test_two_graph_kinds_lowered_to_one_stay_two_rows_each_against_its_own_static_row(tmp_path, capsys, monkeypatch):
    """An attention that serves decode steps only lowers 'full' to 'full_and_piecewise': the rows say what was
    asked and what ran, and each continuous row's speed-up is over the static row of the same request."""
    from reference.engine import graph_plan
    from reference.ops.attention import AttentionCGSupport

    decodes_only = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE
    monkeypatch.setattr(graph_plan, "cudagraph_support", lambda device, dtype: decodes_only)
    out = tmp_path / "throughput.json"
    main([*SMALL, "--modes", "no_inductor", "--cudagraph-mode", "full_and_piecewise,full", "--output-json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    asked = [(r["requested_cudagraph_mode"], r["cudagraph_mode"], r["scheduling"]) for r in rows]
    assert asked == [(a, "full_and_piecewise", s) for a in ("full_and_piecewise", "full") for s in SCHEDULINGS]
    for continuous, static in (rows[0:2], rows[2:4]):
        assert continuous["speedup_vs_static"] == pytest.approx(static["elapsed_s"] / continuous["elapsed_s"])
    assert "| no_inductor | full_and_piecewise (asked: full) | static |" in capsys.readouterr().out


@pytest.mark.eager
@pytest.mark.no_inductor
def test_each_mode_is_compared_with_the_first_modes_tokens_under_the_same_scheduling(tmp_path, capsys):
    """Same batches, same tokens: no_inductor runs eager's ops (bitwise on the CPU), so each of its rows
    agrees with eager's row of its scheduling; a row that ran other requests' tokens would not."""
    doc = _run(tmp_path, "--modes", "eager,no_inductor")
    assert [(r["mode"], r["scheduling"]) for r in doc["rows"]] == [
        ("eager", "continuous"), ("eager", "static"), ("no_inductor", "continuous"), ("no_inductor", "static"),
    ]  # fmt: skip
    assert [r["same_tokens_as_first_mode"] for r in doc["rows"]] == [1.0] * 4
    head = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| mode |"))
    assert head.endswith("| vs static | same tokens as eager (same scheduling) |")


@pytest.mark.eager
def test_the_same_seed_draws_the_same_workload_and_another_seed_another(tmp_path):
    docs = [_run(tmp_path, "--scheduling", "static", "--seed", s)["workload"] for s in ("5", "5", "6")]
    assert docs[0] == docs[1]
    assert (docs[0]["input_lens"], docs[0]["output_lens"]) != (docs[2]["input_lens"], docs[2]["output_lens"])


def test_a_workload_is_drawn_within_its_ranges_and_a_single_length_is_every_requests():
    work = draw_workload(11, 200, (2, 9), (4, 4), 256)
    inputs = [len(p) for p in work.prompts]
    assert set(inputs) == set(range(2, 10))  # uniform over MIN..MAX inclusive: 200 draws hit all 8
    assert work.output_lens == [4] * 200
    tokens = {t for p in work.prompts for t in p}
    assert min(tokens) == FIRST_PROMPT_TOKEN and max(tokens) == 255  # [3, vocab): no pad, BOS or EOS
    assert draw_workload(11, 200, (2, 9), (4, 4), 256) == work and draw_workload(12, 200, (2, 9), (4, 4), 256) != work


def test_the_cli_offers_the_engines_schedulings_and_policies():
    assert SCHEDULINGS == SCHEDULING
    assert bench_throughput.SCHEDULING_POLICIES == SCHEDULING_POLICIES == tuple(throughput_results.POLICY_WORDS)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--input-len", "0"], f"argument --input-len: {NOT_A_LENGTH} '0'"),
        (["--input-len", "9:3"], "argument --input-len: MIN:MAX with MIN 9 above MAX 3 in '9:3'; give MIN <= MAX"),
        (["--input-len", "a:b"], f"argument --input-len: {NOT_A_LENGTH} 'a:b'"),
        (["--output-len", "0:4"], f"argument --output-len: {NOT_A_LENGTH} '0:4'"),
        (["--output-len", "1:2:3"], f"argument --output-len: {NOT_A_LENGTH} '1:2:3'"),
        (["--modes", "eager,fast"], "argument --modes: unknown ['fast']; choose from eager, breakable, no_inductor,"),
        (["--modes", ""], "argument --modes: no mode given in ''"),
        (["--scheduling", "fifo"], "argument --scheduling: unknown ['fifo']; choose from continuous, static"),
        (["--scheduling", ","], "argument --scheduling: no scheduling given in ','; choose from continuous, static"),
        (["--scheduling", "static,static"], "argument --scheduling: 'static,static' names a scheduling twice"),
        (["--cudagraph-mode", "fulll"], "argument --cudagraph-mode: unknown ['fulll'] in 'fulll'; choose from none,"),
        (["--cudagraph-mode", "full,FULL"], "argument --cudagraph-mode: 'full,FULL' names a cudagraph_mode twice"),
        (["--cudagraph-mode", "Full,full_AND_piecewise"], "argument --cudagraph-mode: unknown ['Full', 'full_AND_"),
        (
            ["--modes", "eager,no_inductor", "--cudagraph-mode", "full"],
            "--cudagraph-mode replaces each mode's graph kind, and eager runs enforce_eager, which takes none; drop "
            "eager from --modes or drop --cudagraph-mode",
        ),
        (["--max-num-seqs", "0"], "argument --max-num-seqs: expected an int >= 1, got '0'"),
        (["--num-prompts", "0"], "argument --num-prompts: expected an int >= 1, got '0'"),
        (["--seed", "-1"], "argument --seed: expected an int in [0, 2**63), got '-1'"),
        (["--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
        (["--model", "no-such-model"], "argument --model: "),
        (["--output-json", ""], "argument --output-json: empty; give a file path"),
        (["--output-json", "conformance"], "--output-json: 'conformance' is a directory; give a file path"),
        (
            ["--max-num-seqs", "8", "--max-num-batched-tokens", "4"],
            "--max-num-batched-tokens 4 is below --max-num-seqs 8: a step decodes one token of every running request",
        ),
        (
            ["--input-len", "500", "--output-len", "8:13"],
            "--input-len 500 + --output-len 8:13: the longest request needs 513 positions; llama-tiny has 512 "
            "(max_position_embeddings)",
        ),
        (
            ["--max-model-len", "50"],
            "--max-model-len 50 is below the longest request: --input-len 8:64 + --output-len 4:32 = 96 tokens",
        ),
        (
            ["--input-len", "4", "--output-len", "4", "--max-model-len", "600"],
            "--max-model-len 600 exceeds llama-tiny's 512 positions (max_position_embeddings)",
        ),
        (
            ["--max-num-seqs", "2", "--max-model-len", "100", "--max-num-batched-tokens", "201"],
            "--max-num-batched-tokens 201 exceeds --max-num-seqs x --max-model-len (2 x 100 = 200)",
        ),
        (
            ["--max-num-batched-tokens", "32", "--no-enable-chunked-prefill"],
            "--input-len 8:64 with --no-enable-chunked-prefill: a prompt of 64 tokens never fits a step of "
            "--max-num-batched-tokens 32; raise it or allow chunked prefill",
        ),
    ],
    ids=[
        "input-len-0", "min-above-max", "not-ints", "output-min-0", "three-parts", "unknown-mode", "no-mode",
        "unknown-scheduling", "no-scheduling", "scheduling-twice", "unknown-graphs", "graphs-twice",
        "graphs-mixed-case",
        "graphs-for-eager", "max-num-seqs-0", "num-prompts-0", "seed",
        "dtype", "model", "empty-output-json", "output-json-is-dir", "budget-below-seqs", "past-positions",
        "max-model-len-below-requests", "max-model-len-past-positions", "budget-above-cache", "unchunked-too-long",
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_line_naming_it_before_any_model_is_built(argv, message, capsys, monkeypatch):
    def no_run(args):
        raise AssertionError("a bad flag reached the run")

    monkeypatch.setattr(throughput, "run", no_run)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(ERROR + message) and err.endswith(" (see --help)\n") and len(err.splitlines()) == 1, err


def test_a_workload_beyond_the_hosts_memory_is_refused_before_it_is_drawn(capsys, monkeypatch):
    """--num-prompts 10**9 drew requests for minutes, its memory growing, with nothing printed: each token id
    is a Python int in a list (about 41 bytes, measured) before the engine holds its own copy."""
    monkeypatch.setattr(throughput, "run", lambda args: pytest.fail("a workload beyond memory reached the run"))
    with pytest.raises(SystemExit) as exit_info:
        main(["--num-prompts", str(10**9), "--input-len", "2", "--output-len", "1"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    said = "--num-prompts 1000000000 with --input-len 2 + --output-len 1: the workload needs"
    assert err.startswith(ERROR + said), err
    assert "GiB of host memory" in err and len(err.splitlines()) == 1, err
    need = throughput.workload_host_bytes(64, (8, 64), (4, 32))  # the defaults: far below any machine's memory
    assert 64 * (64 + 32) * 40 < need < 2**20


@pytest.mark.eager
def test_without_chunked_prefill_no_prompt_is_cut_and_the_document_says_so(tmp_path, monkeypatch):
    """Budget 10 with prompts of 2-9 tokens: chunked prefill cuts a prompt that does not fit what a step has
    left; without it every prompt runs whole in one step."""
    chunks = []
    real_step = throughput.LLM.generate

    def generate(llm, prompts, params, use_tqdm, priority=None):
        step = llm.runner.step

        def spy(new_tokens, context_lens, rows, fed=None):
            skip = 0 if fed is None else len(fed)
            chunks.extend((len(t), context_lens[skip + i]) for i, t in enumerate(new_tokens))
            return step(new_tokens, context_lens, rows, fed=fed)

        llm.runner.step = spy
        try:
            return real_step(llm, prompts, params, use_tqdm=use_tqdm, priority=priority)
        finally:
            llm.runner.step = step

    monkeypatch.setattr(throughput.LLM, "generate", generate)
    budget = ["--max-num-batched-tokens", "10", "--scheduling", "continuous"]
    for flag, cut in (("--enable-chunked-prefill", True), ("--no-enable-chunked-prefill", False)):
        chunks.clear()
        doc = _run(tmp_path, *budget, flag)
        assert doc["engine"]["enable_chunked_prefill"] is cut
        assert any(context > 0 for _, context in chunks) is cut, chunks  # a chunk continuing an earlier one


@pytest.mark.eager
def test_a_kv_cache_beyond_memory_is_one_line_naming_the_limits(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", "eager", "--device", "cpu", "--input-len", "4", "--output-len", "4",
              "--max-num-seqs", str(10**12)])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(ERROR + "max_num_seqs x max_model_len (1000000000000 x 8)") and len(err.splitlines()) == 1


@pytest.mark.eager
def test_ctrl_c_keeps_the_rows_that_finished(tmp_path, capsys, monkeypatch):
    timed = throughput._time_generate

    def interrupted_on_static(llm, *args):
        if llm.llm_engine.scheduler.static:
            raise KeyboardInterrupt
        return timed(llm, *args)

    monkeypatch.setattr(throughput, "_time_generate", interrupted_on_static)
    with pytest.raises(SystemExit) as exit_info:
        _run(tmp_path)
    assert exit_info.value.code == 130
    doc = json.loads((tmp_path / "throughput.json").read_text())
    assert [r["scheduling"] for r in doc["rows"]] == ["continuous"] and doc["rows"][0]["speedup_vs_static"] is None
    assert doc["interrupted"] == "interrupted during eager/static: 1 of 2 rows finished"
    captured = capsys.readouterr()
    assert "| eager | none | continuous |" in captured.out
    assert captured.err.splitlines()[-1].endswith(doc["interrupted"])


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_throughput.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--model", "--modes", "--scheduling", "--num-prompts", "--input-len", "--output-len",
                 "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--dtype", "--device", "--seed",
                 "--output-json", "--cudagraph-mode"):  # fmt: skip
        assert flag in out
