"""Peer faithfulness: once warmed up, a graph mode's steps replay the graphs captured at start-up.

A step that quietly re-records, recompiles or runs without its graph still returns the right logits, so
no equivalence rule sees it; it only shows as a slower step (the torch-native peer once ran 1.8x slower
unnoticed: a view of the runner's whole input buffer made Dynamo recompile at the first decode step).
The implementation's own account of each graph-able call (``impl.replay_probe()``, capability
``replays``) must show, over a prefill and device- and host-fed decode steps at capture sizes: no new
recording, no run without a graph, no recompile, no piece skipped, and on CUDA at least one replay per
step. One step has a single token, which Dynamo specializes (a second graph, due at warm-up). On a CPU
nothing is captured, so the rule there is: no recompile, no recording, nothing skipped.
"""

from __future__ import annotations

import pytest
import torch

from conformance.helpers import DEVICES, build_llama, small_llama_config, token_ids
from conformance.implementation import make_runner
from reference.engine.arguments import engine_config
from reference.config import MODES

GRAPH_MODES = [m for m in MODES if m != "eager"]
MAX_NUM_SEQS, MAX_MODEL_LEN, MAX_NUM_BATCHED_TOKENS = 4, 16, 32


@pytest.mark.requires("replays")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_warmed_up_steps_replay_graphs_without_recompiling_or_recording(impl, mode, device):
    # The engine's own capture sizes (1, 2, 4, 8, 16, 24, 32): the largest is the whole input buffer, as
    # in bench_latency and perf/, so a first call on a view as long as its base is part of the rule.
    config = engine_config(
        MODES[mode], enforce_eager=False, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS
    )
    hf_config = small_llama_config()
    model = build_llama(hf_config, config, device=device)
    runner = make_runner(
        impl,
        model,
        config,
        max_num_seqs=MAX_NUM_SEQS,
        max_model_len=MAX_MODEL_LEN,
        max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
    )
    runner.warm_up()
    prompts = [token_ids(n, hf_config.vocab_size, seed=n) for n in (5, 3, 2)]  # 10 tokens: padded to 16
    rows, lengths = [0, 1, 2], [5, 3, 2]
    steps = 0
    with impl.replay_probe() as tally:
        logits = runner.step(prompts, [0, 0, 0], rows)
        steps += 1
        fed = logits.argmax(-1)  # a [3] device tensor: the decode loop's device-fed step, padded to 4
        for _ in range(3):
            fed = runner.step(fed, lengths, rows).argmax(-1)
            lengths = [n + 1 for n in lengths]
            steps += 1
        runner.step([[t] for t in fed.tolist()], lengths, rows)  # host-fed
        runner.step([[5]], [0], [3])  # one token: Dynamo specializes size 1, a second graph if guards are kept
        steps += 2
    expected = steps if device == "cuda" else 0  # nothing is captured on a CPU
    problems = tally.problems(expected)
    if device == "cpu" and tally.replays:
        problems.append(f"{tally.replays} graph replays on a CPU")
    assert not problems, f"{impl.name} {mode} on {device}, {steps} warmed-up steps: {'; '.join(problems)}"
    assert torch.isfinite(logits).all()
