"""The real pretrained model of the suite (Gemma 3 270M, ``reference.models.pretrained``): its prompts, the
oracle's greedy choices, teacher-forced negative log-likelihoods and the per-mode verdict.

Random weights have flat logits, so greedy tokens tie and flip on the last bit; a trained model has clear
winners at most positions, which makes "the same tokens as transformers" a meaningful rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

MODEL = "gemma-3-270m"
NEW_TOKENS = 32
# A pretrained model's run in our suite must not skip silently in CI: .ci/run sets this, so a missing
# package fails there instead of skipping.
REQUIRED_ENV = "REFERENCE_REAL_MODEL_REQUIRED"
# Real prose and code of our own: the opening of this project's README.md as of 2026-12-02, frozen as a fixture
# so that README edits move neither the rules' inputs nor their budgets.
TEXT = (Path(__file__).parents[1] / "fixtures" / "real-model-text.md").read_text()

# Varied real prompts, all generated in one batch (different lengths: the engine batches and pads them):
# code, facts, a list, a dialogue, markup, prose, and one longer than the model's 512-token sliding window
# (``TEXT``, 681 tokens), so the local layers' window mask is crossed in prefill and decode.
PROMPTS = (
    "def fibonacci(n):",
    "import numpy as np\n\ndef softmax(x):\n",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of Italy is",
    "Monday, Tuesday, Wednesday,",
    "Q: What is the boiling point of water at sea level in degrees Celsius?\nA:",
    "<html>\n<head>\n<title>",
    "Once upon a time, in a small village at the edge of a great forest, there lived an old woodcutter and his"
    " daughter. Every morning, before the sun rose, the woodcutter",
    TEXT,
)
# The teacher-forced text of the bf16 rule: a few hundred tokens of ``TEXT`` (from its part on why
# use_inductor=False).
NLL_TEXT_SLICE = slice(1000, 2000)


def nll_text() -> str:
    """The teacher-forced text of the bf16 likelihood rule."""
    return TEXT[NLL_TEXT_SLICE]


@dataclass(frozen=True)
class OracleChoices:
    """transformers' greedy choice at each new token of one continuation of a prompt (``oracle_choices``).

    Attributes:
        best: at each new token, the oracle's argmax given the prompt and the continuation before that token.
        gaps: at each new token, the oracle's best logit minus its second best (float32 logits, nats).
    """

    best: list[int]
    gaps: list[float]


# Prompts at most this many tokens apart in length share one left-padded forward of the oracle; a longer one runs
# alone: padding the short prompts to ``TEXT``'s 681 tokens would multiply the work.
BATCHED_LENGTH_SPREAD = 64


@torch.no_grad()
def oracle_choices(
    hf_model: nn.Module, prompts: list[list[int]], continuations: list[list[int]]
) -> list[OracleChoices]:
    """transformers' greedy choices along each prompt's continuation, from one teacher-forced forward: the
    prompt and the continuation (but its last token) fed at once, the logits of the continuation's positions.

    Why this is the rule "our greedy tokens are transformers' ``generate``": greedy decoding takes the argmax
    given the tokens so far, so a continuation is transformers' own greedy one exactly where it is the oracle's
    argmax at each position given its own prefix, and the first position where it is not is where ``generate``
    would have left it (``first_divergence``). One forward gives what ``generate``'s KV-cache steps give, up
    to the order of the sums: on Gemma 3 270M the same tokens and gaps within 6e-5 of ``generate``'s, for
    13.1 s against 27.6 s on one thread of a 2-core AMD EPYC, whose BLAS runs the decode steps' few-row
    GEMMs 3-4x below their bandwidth (2026-12-06).

    Prompts of similar lengths (``BATCHED_LENGTH_SPREAD``) run as one left-padded batch with its attention mask
    and positions counted from each row's first token, as ``generate`` batches them; the padding changes the
    logits by rounding only (the GEMMs see more rows), far below the rules' ``NEAR_TIE``.

    Args:
        prompts, continuations: token ids, one continuation per prompt, each of the same length n >= 1.
    """
    (n,) = {len(c) for c in continuations}
    results: dict[int, OracleChoices] = {}
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    while order:
        batch = [i for i in order if len(prompts[i]) - len(prompts[order[0]]) <= BATCHED_LENGTH_SPREAD]
        order = order[len(batch) :]
        rows = [prompts[i] + continuations[i][:-1] for i in batch]  # the last token is predicted, never fed
        width = max(map(len, rows))
        ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])  # [B, width]: left padding, masked out
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # each row's own, from its first real token
        logits = hf_model(ids, attention_mask=mask, position_ids=positions, logits_to_keep=n).logits  # [B, n, V]
        top2 = logits.float().topk(2, dim=-1).values  # [B, n, 2]
        best = logits.argmax(-1)  # [B, n]
        for row, i in enumerate(batch):
            results[i] = OracleChoices(best[row].tolist(), (top2[row, :, 0] - top2[row, :, 1]).tolist())
    return [results[i] for i in range(len(prompts))]


def first_divergence(ours: list[int], oracle: OracleChoices, near_tie: float) -> int | None:
    """The first position where ``ours`` is not the oracle's greedy choice (``oracle`` computed along ``ours``)
    and that choice was not a near tie (its two best logits more than ``near_tie`` apart); None if there is
    none. Past a tied divergence transformers' ``generate`` would have gone on from the other token, so the
    comparison stops there."""
    for i, (a, b) in enumerate(zip(ours, oracle.best)):
        if a != b:
            return None if oracle.gaps[i] <= near_tie else i
    return None


def bf16_logits(model: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    """What ``model.compute_logits(hidden)`` gives a bf16 model without a final softcap, [N, V] float32 from
    hidden [N, H] bf16, with the LM head's GEMM done in float32 arithmetic over the same bf16 values and each
    logit rounded to bf16 once: a bf16 GEMM's own arithmetic (bf16 operands, float32 sums, one rounding), in
    another order of the sums. On a CPU without bf16 instructions the bf16 GEMM is 5x slower: 10.5 s against
    2.0 s for a 290-row prefill of Gemma 3 270M's 262,144-token head, per mode (AMD EPYC, 2026-12-06)."""
    assert hidden.dtype == torch.bfloat16 and getattr(model.config, "final_logit_softcapping", None) is None
    weight = model.lm_head.weight  # [V, H] bf16
    return torch.nn.functional.linear(hidden.float(), weight.float()).to(torch.bfloat16).float()


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood, nats: ``logits`` [T, vocab] (any float dtype, computed in float32),
    ``targets`` [T] int64 -> [T] float32."""
    return -torch.log_softmax(logits.float(), dim=-1).gather(-1, targets[:, None])[:, 0]


@dataclass(frozen=True)
class Drift:
    """A bf16 run's teacher-forced likelihood against float32's, over T tokens.

    Attributes:
        mean: mean over tokens of (bf16 NLL - float32 NLL), nats per token.
        stderr: standard error of that mean: std of the per-token differences / sqrt(T).
        agreement: fraction of positions where the bf16 argmax equals the float32 argmax.
    """

    mean: float
    stderr: float
    agreement: float


def drift(nll: torch.Tensor, ref_nll: torch.Tensor, argmax: torch.Tensor, ref_argmax: torch.Tensor) -> Drift:
    """The :class:`Drift` of per-token NLLs ``nll`` against ``ref_nll`` ([T] float32 each) and argmaxes."""
    diff = (nll - ref_nll).double()
    return Drift(
        float(diff.mean()),
        float(diff.std() / math.sqrt(diff.numel())),
        float((argmax == ref_argmax).double().mean()),
    )


# The budget of a mode's bf16 drift (conformance/test_real_gemma3.py explains it): SIGMAS standard errors.
SIGMAS = 5


def drift_budget(eager: Drift) -> float:
    """Nats per token a bf16 mode's |mean drift| may reach: twice eager's plus ``SIGMAS`` of eager's
    standard errors (the suite's rule "a mode may round differently, not be less accurate", with the noise
    of a mean over finitely many tokens)."""
    return 2 * abs(eager.mean) + SIGMAS * eager.stderr


# The per-mode verdict: what the tests record (``record_property`` names starting with VERDICT_PREFIX, each a
# dict with a "mode"), merged per mode by conformance/report.py, printed at the end of a run and written to
# --conformance-report's JSON under "real_model".
VERDICT_PREFIX = "real_model_"


def verdict_lines(verdict: dict[str, dict]) -> list[str]:
    """The verdict table's lines: per mode, greedy tokens equal to transformers' (prompts), the bf16 NLL
    drift from float32 in nats per token against its budget, and the bf16 greedy agreement with float32."""
    lines = [f"{'mode':<17} {'fp32 tokens equal':>17} {'bf16 NLL drift':>15} {'budget':>8} {'bf16 agreement':>15}"]
    for mode, row in verdict.items():
        equal = f"{row['equal']}/{row['prompts']}" if "equal" in row else "-"
        nll = f"{row['nll_drift']:+.4f}" if "nll_drift" in row else "-"
        budget = f"{row['budget']:.4f}" if "budget" in row else "-"
        agree = f"{row['agreement']:.1%}" if "agreement" in row else "-"
        lines.append(f"{mode:<17} {equal:>17} {nll:>15} {budget:>8} {agree:>15}")
    return lines
