"""Sampling rules test_sampling.py leaves open: rows of a mixed batch draw independently, the temperature
divides the logits before top-p and is read on every call, and ``seed=0`` is a seed.

Expectations are closed forms (a distribution built to have a known nucleus) or the same draw made alone.
The sampler is called through its module (``sampling.sample``), where the engine looks it up too.
Frequency checks allow 5 binomial standard deviations, so a correct sampler fails one of them with
probability below 1e-6; the faults they target move the frequencies by tens of deviations.
"""

from __future__ import annotations

import math

import pytest
import torch

from conformance.helpers import token_ids
from reference.engine import sampling
from reference.engine.llm import LLM
from reference.engine.sampling import SamplingParams, make_generator

pytestmark = pytest.mark.requires("components")


def _within_5_sigma(count: int, n: int, p: float) -> bool:
    return abs(count - n * p) <= 5 * math.sqrt(n * p * (1 - p))


def test_greedy_and_sampled_rows_of_one_batch_each_draw_what_they_would_draw_alone():
    logits = torch.randn(5, 64, generator=torch.Generator().manual_seed(4))
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.9, seed=11),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.3, top_k=20, seed=12),
        SamplingParams(temperature=0.7, top_p=0.9, seed=13),
    ]

    def generators():
        return [None if p.greedy else make_generator(p.seed, "cpu") for p in params]

    together, alone = generators(), generators()
    # 10 draws in a row from the same generators: a row drawing from another row's generator (or from the
    # global one) repeats all 10 of its own draws by chance with probability far below 1e-6
    for draw in range(10):
        batch = sampling.sample(logits, params, together).tolist()
        single = [sampling.sample(logits[i : i + 1], params[i : i + 1], alone[i : i + 1]).item() for i in range(5)]
        assert batch == single, f"draw {draw}: batch {batch}, each row alone {single}"
        assert [batch[i] for i in (0, 2)] == logits[[0, 2]].argmax(-1).tolist()


def test_the_temperature_divides_the_logits_before_top_p_selects_the_nucleus():
    # softmax(logits / T) = [0.5, 0.3, 0.2]: top_p 0.75 keeps tokens {0, 1} (0.5 < 0.75 <= 0.8). Before the
    # division, softmax(logits) = [0.42, 0.32, 0.26] would need all three tokens (0.74 < 0.75).
    temperature, top_p = 0.5, 0.75
    logits = (torch.tensor([0.5, 0.3, 0.2]).log() * temperature)[None]
    g = make_generator(0, "cpu")
    params = [SamplingParams(temperature=temperature, top_p=top_p)]
    n = 400
    counts = torch.bincount(torch.cat([sampling.sample(logits, params, [g]) for _ in range(n)]), minlength=3).tolist()
    assert counts[2] == 0, f"token 2 is outside the nucleus but was drawn {counts[2]} times"
    assert _within_5_sigma(counts[0], n, 0.5 / 0.8), counts  # renormalised over the nucleus


def test_each_call_uses_its_own_temperature():
    logits = torch.tensor([[0.0, 1.0]])
    g = make_generator(1, "cpu")
    # nearly greedy first: p(token 0) = 1 / (1 + e^100)
    assert sampling.sample(logits, [SamplingParams(temperature=0.01)], [g]).item() == 1
    n, hot = 400, [SamplingParams(temperature=100.0)]  # then nearly uniform: p(token 0) = 1 / (1 + e^0.01)
    zeros = sum(sampling.sample(logits, hot, [g]).item() == 0 for _ in range(n))
    assert _within_5_sigma(zeros, n, 1 / (1 + math.exp(0.01))), f"token 0 drawn {zeros} of {n} times at T=100"


@pytest.mark.eager
def test_seed_zero_is_a_seed_like_any_other():
    llm = LLM("llama-tiny", enforce_eager=True, device="cpu", use_tqdm=False)
    prompts = [token_ids(n, llm.vocab_size, seed=n) for n in (2, 7, 4)]

    def run(seed):
        params = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True, seed=seed)
        return [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]

    assert run(None) != run(None), "control: unseeded requests draw fresh seeds from the engine's stream"
    assert run(0) == run(0)
