"""Latency of one prefill and one decode step per mode, through ``ModelRunner.step`` (see perf/NOTES.md).

Each timed call is one ``runner.step``: host-side metadata, the host->device input copy, the compiled
model (graph replays on CUDA at level 3), attention, the LM head on the last token of each sequence, and on
CUDA a ``torch.cuda.synchronize()`` so the timer stops when the kernels are done.

After the timed rounds, one more round runs under the implementation's replay probe
(reference.compilation.replays): on CUDA a graph mode's steps must each replay graphs and nothing may be
recorded, recompiled, run without its graph or skipped. A row that fails is printed flagged ("GRAPHS DID
NOT REPLAY") with its numbers, and its test fails: its figure is not that mode's.
"""

import warnings

import torch

from reference.benchmark.summary import IQR_WARNING
from reference.compilation import compilation_counter
from reference.compilation.replays import dynamo_graphs

# Explicit rounds (one call each) after explicit warm-up rounds; the runner is compiled and captured before.
PREFILL_ROUNDS, PREFILL_WARMUP = 20, 3
DECODE_ROUNDS, DECODE_WARMUP = 50, 5
# Back-to-back decode: rounds of DECODE_CHAIN steps (pytest-benchmark's iterations) with one synchronize at the end.
DECODE_CHAIN, CHAIN_ROUNDS, CHAIN_WARMUP = 16, 10, 2


def _timed_step(run, device: torch.device):
    def step(new_tokens, context_lens, rows):
        logits = run.runner.step(new_tokens, context_lens, rows)  # [B, V] float32
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return logits

    return step


def _report(perf_report, benchmark, median) -> None:
    """Print the benchmark's line, then refuse the row if its graphs did not replay."""
    perf_report(benchmark.name, median, benchmark.extra_info)
    problems = benchmark.extra_info["replay_problems"]
    assert not problems, f"{benchmark.name}: the graphs did not replay as captured: {'; '.join(problems)}"


def _tokens(vocab_size: int, batch_size: int, length: int) -> list[list[int]]:
    return torch.randint(vocab_size, (batch_size, length), generator=torch.Generator().manual_seed(0)).tolist()


def _check_and_describe(
    benchmark, run, settings, logits, one_round, tokens_per_step: int, chain: int = 1
) -> float | None:
    """Assert the steps ran the warmed-up runner as is; run ``one_round()`` (``chain`` steps) once more under
    the replay probe; fill ``extra_info``; return the median per step (s; pytest-benchmark's stats are per
    step) or None when benchmarking is disabled (``--benchmark-disable`` runs a step once, untimed)."""
    assert logits.shape == (settings.batch_size, run.vocab_size) and logits.dtype == torch.float32
    assert torch.isfinite(logits).all(), "non-finite logits: the timed step did not compute what it should"
    # A re-trace or a capture after warm-up would put start-up work into the timed steps.
    now = compilation_counter.snapshot()
    assert now.num_graphs_seen == run.counters.num_graphs_seen, "the model was re-traced after warm-up"
    assert now.num_cudagraph_captured == run.counters.num_cudagraph_captured, "CUDA graphs captured after warm-up"
    with run.replay_probe() as tally:
        one_round()
    graphs = settings.device.type == "cuda" and run.mode != "eager"  # nothing is captured on a CPU
    info = benchmark.extra_info
    info["replay_problems"] = tally.problems(chain if graphs else 0)
    recompiled = dynamo_graphs() - run.dynamo_graphs  # in any round since warm-up, timed or not
    if recompiled and not tally.recompiles:
        info["replay_problems"].append(f"{recompiled} recompiles since warm-up")
    info["graph_replays_per_step"] = tally.replays / chain
    info.update(
        mode=run.mode,
        model=settings.model,
        device=torch.cuda.get_device_name(settings.device) if settings.device.type == "cuda" else "cpu",
        dtype=str(settings.dtype).removeprefix("torch."),
        batch_size=settings.batch_size,
        input_len=settings.input_len,
        tokens_per_step=tokens_per_step,
        chain=chain,
    )
    info.update(run.take_startup())
    if not benchmark.stats:
        return None
    median, iqr = benchmark.stats.stats.median, benchmark.stats.stats.iqr
    info["tokens_per_s"] = tokens_per_step / median
    if iqr > IQR_WARNING * median:
        warnings.warn(
            f"{benchmark.name}: the rounds spread by {iqr / median:.0%} of the median (IQR); the machine may be "
            "busy (see machine_info's load_avg) or the step host-bound",
            RuntimeWarning,
            stacklevel=2,
        )
    return median


def test_prefill_latency(benchmark, perf_run, perf_settings, perf_report):
    """``batch_size`` prompts of ``input_len`` tokens each, from an empty cache, in one step."""
    b, n = perf_settings.batch_size, perf_settings.input_len
    prompts, rows = _tokens(perf_run.vocab_size, b, n), list(range(b))
    step = _timed_step(perf_run, perf_settings.device)
    logits = benchmark.pedantic(step, args=(prompts, [0] * b, rows), rounds=PREFILL_ROUNDS, warmup_rounds=PREFILL_WARMUP)
    median = _check_and_describe(
        benchmark, perf_run, perf_settings, logits, lambda: step(prompts, [0] * b, rows), tokens_per_step=b * n
    )
    _report(perf_report, benchmark, median)


def test_decode_step_latency(benchmark, perf_run, perf_settings, bandwidth, perf_report):
    """One new token for each of ``batch_size`` sequences with ``input_len`` tokens cached.

    Every round rewrites the same position, so each round does the same work. On CUDA, ``extra_info``
    carries the floor: weight bytes read per step / bandwidth, and the median's ratio to it.
    """
    b, n = perf_settings.batch_size, perf_settings.input_len
    tokens, rows = _tokens(perf_run.vocab_size, b, n + 1), list(range(b))
    perf_run.runner.step([t[:n] for t in tokens], [0] * b, rows)  # prefill: fills the cache the step reads
    step, args = _timed_step(perf_run, perf_settings.device), ([[t[n]] for t in tokens], [n] * b, rows)
    logits = benchmark.pedantic(step, args=args, rounds=DECODE_ROUNDS, warmup_rounds=DECODE_WARMUP)
    median = _check_and_describe(benchmark, perf_run, perf_settings, logits, lambda: step(*args), tokens_per_step=b)
    _describe_floor(benchmark, perf_run, bandwidth, median)
    _report(perf_report, benchmark, median)


def test_decode_steps_back_to_back(benchmark, perf_run, perf_settings, bandwidth, perf_report):
    """Chains of ``DECODE_CHAIN`` decode steps issued without waiting, each fed the previous step's greedy
    tokens on the device (as the engine's decode loop does), and one synchronize at a chain's end.

    This is the step time of a decode loop that never waits: the host's preparation of a step overlaps
    the device's work on the one before, so a step costs the device's time unless the host falls behind
    (``test_decode_step_latency`` pays the host's part and the LM head's launch on every step). A chain is
    one pytest-benchmark round of ``DECODE_CHAIN`` iterations, so its table, ``--benchmark-compare`` and the
    printed line all read per step.
    """
    b, n = perf_settings.batch_size, perf_settings.input_len
    tokens, rows = _tokens(perf_run.vocab_size, b, n + 1), list(range(b))
    perf_run.runner.step([t[:n] for t in tokens], [0] * b, rows)
    first = torch.tensor([t[n] for t in tokens], device=perf_settings.device)
    fed, steps = [first], [0]

    def chain_step():
        logits = perf_run.runner.step(fed[0], [n] * b, rows)  # the same position each step: the same work
        steps[0] += 1
        fed[0] = first if steps[0] % DECODE_CHAIN == 0 else logits.argmax(-1)
        if steps[0] % DECODE_CHAIN == 0 and perf_settings.device.type == "cuda":
            torch.cuda.synchronize(perf_settings.device)  # a chain's last step: the round's timer stops after
        return logits

    def chain():
        fed[0], steps[0] = first, 0
        for _ in range(DECODE_CHAIN):
            logits = chain_step()
        return logits

    # pytest-benchmark calls chain_step DECODE_CHAIN times per round, rounds one after another, then once more
    # for the result; a round's time / DECODE_CHAIN is its per-step figure
    logits = benchmark.pedantic(chain_step, rounds=CHAIN_ROUNDS, warmup_rounds=CHAIN_WARMUP, iterations=DECODE_CHAIN)
    median = _check_and_describe(
        benchmark, perf_run, perf_settings, logits, chain, tokens_per_step=b, chain=DECODE_CHAIN
    )
    _describe_floor(benchmark, perf_run, bandwidth, median)
    _report(perf_report, benchmark, median)


def _describe_floor(benchmark, run, bandwidth, median: float | None) -> None:
    """``extra_info`` of a decode benchmark: weight bytes per step and, on CUDA, the floor (weight bytes /
    bandwidth) and the per-step median's ratio to it."""
    benchmark.extra_info["weight_bytes"] = run.weight_bytes
    if bandwidth is not None and median is not None:
        floor_s = run.weight_bytes / bandwidth.bytes_per_s
        benchmark.extra_info.update(
            bandwidth_bytes_per_s=bandwidth.bytes_per_s,
            bandwidth_source=bandwidth.source,
            measured_copy_bytes_per_s=bandwidth.measured_bytes_per_s,
            floor_ms=floor_s * 1e3,
            ratio_to_floor=median / floor_s,
        )
