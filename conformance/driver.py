"""The one driver of the suite: feed the same steps to runners and collect their logits.

A *step* is the new tokens of every sequence (``steps[s][i]``: a list of ids); sequence ``i`` lives in
KV-cache row ``i`` and starts at position 0. :func:`run_steps` feeds given steps to one runner (the
oracle tests give the transcript their oracle chose); :func:`prefill_and_decode` makes the steps as it
goes, greedily from one runner's logits, and feeds them to every runner, so all of them see identical
inputs even where their logits differ.
"""

from __future__ import annotations

import torch

from reference.engine import ModelRunner


def run_steps(runner: ModelRunner, steps: list[list[list[int]]]) -> list[torch.Tensor]:
    """``runner``'s logits after each step: ``len(steps)`` tensors [num_seqs, vocab] float32 on the CPU."""
    rows = list(range(len(steps[0])))
    context = [0] * len(rows)
    logits = []
    for new in steps:
        logits.append(runner.step(new, context, rows).cpu())
        context = [c + len(tokens) for c, tokens in zip(context, new)]
    return logits


def prefill_and_decode(
    runners: dict[str, ModelRunner], prompts: list[list[int]], num_decode: int, *, leader: str
) -> dict[str, list[torch.Tensor]]:
    """Prefill ``prompts`` in one step, then ``num_decode`` greedy decode steps, on every runner.

    The decode tokens are the argmax of ``runners[leader]``'s logits.

    Returns:
        runner name -> ``1 + num_decode`` tensors [len(prompts), vocab] float32 (on the runner's device).
    """
    rows = list(range(len(prompts)))
    context = [0] * len(prompts)
    new_tokens = prompts
    logits: dict[str, list[torch.Tensor]] = {name: [] for name in runners}
    for _ in range(1 + num_decode):
        for name, runner in runners.items():
            logits[name].append(runner.step(new_tokens, context, rows))
        context = [c + len(t) for c, t in zip(context, new_tokens)]
        new_tokens = [[t] for t in logits[leader][-1].argmax(-1).tolist()]
    return logits
