"""Faults of the sampler (reference/engine/sampling.py) and of the requests' generators (requests.py).

Each wraps the reference's own ``sample`` / ``apply_top_k_top_p`` / ``RequestBuilder.make`` (or the one torch
call the sampler makes, ``torch.multinomial``) and changes only what goes in or comes out, so the fault is
the one sentence its description states. ``sample`` is patched in the sampling module and where the engine
looks it up (``reference.engine.llm_engine``); tests that bound the name at import see only the torch-level ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
from unittest import mock

import torch

from conformance.faults.fault import Fault, patches
from reference.engine import llm_engine, requests, sampling

_real_sample = sampling.sample
_real_top_k_top_p = sampling.apply_top_k_top_p
_real_make = requests.RequestBuilder.make
_real_multinomial = torch.multinomial


def _default_generator(device: torch.device) -> torch.Generator:
    return torch.cuda.default_generators[device.index or 0] if device.type == "cuda" else torch.default_generator


def _generators_by_sampled_position(logits, params, generators):
    """The j-th sampled row draws from the batch's j-th generator (None: torch's global one), not its own."""
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    shifted = list(generators)
    for j, i in enumerate(sampled):
        shifted[i] = generators[j] or _default_generator(logits.device)
    return _real_sample(logits, params, shifted)


def _temperature_after_top_k_top_p(logits, params, generators):
    """Top-k and top-p choose their tokens from the logits before the temperature divides them."""
    masked = logits.clone()
    for i, p in enumerate(params):
        if not p.greedy:
            masked[i] = _real_top_k_top_p(logits[i : i + 1], torch.tensor([p.top_k]), torch.tensor([p.top_p]))[0]
    unfiltered = [dataclasses.replace(p, top_k=0, top_p=1.0) for p in params]
    return _real_sample(masked, unfiltered, generators)


def _multinomial_without_generator(probs, num_samples, generator=None):
    """Draws from torch's global generator, whatever generator the sampler passes."""
    return _real_multinomial(probs, num_samples)


@contextlib.contextmanager
def _noise_drawn_once():
    """Each generator yields one uniform number, at its first draw, and the sampler reuses it for every later
    draw: what replaying a graph that captured its random numbers does."""
    frozen: dict[int, torch.Tensor] = {}

    def multinomial(probs, num_samples, generator=None):
        u = frozen.setdefault(id(generator), torch.rand((), generator=generator, device=probs.device))
        index = torch.searchsorted(probs.cumsum(-1), u * probs.sum(-1)).clamp(max=probs.shape[-1] - 1)
        return index.reshape(1).expand(num_samples)

    with mock.patch("torch.multinomial", multinomial):
        yield


@contextlib.contextmanager
def _temperatures_frozen_per_batch_size():
    """The temperatures of the first call of each batch size are kept and reused by later calls of that size,
    as a sampler captured in a graph would hold them."""
    frozen: dict[int, list[float]] = {}

    def sample(logits, params, generators):
        temperatures = frozen.setdefault(len(params), [p.temperature for p in params])
        held = [
            p if p.greedy or t == 0 else dataclasses.replace(p, temperature=t) for p, t in zip(params, temperatures)
        ]
        return _real_sample(logits, held, generators)

    with mock.patch.object(sampling, "sample", sample), mock.patch.object(llm_engine, "sample", sample):
        yield


def _nucleus_one_short(logits, top_k, top_p):
    """Top-p drops the least likely token of each nucleus (of more than one token)."""
    masked = _real_top_k_top_p(logits, top_k, top_p)
    for row, p in zip(masked, top_p.tolist()):
        kept = torch.isfinite(row).nonzero().flatten()
        if p < 1 and len(kept) > 1:
            row[kept[row[kept].argmin()]] = float("-inf")
    return masked


def _make_with_seed_zero_as_none(self, prompts, sampling_params):
    """``SamplingParams(seed=0)`` is treated as unseeded (``if p.seed:`` instead of ``is not None``)."""
    if isinstance(sampling_params, sampling.SamplingParams):
        sampling_params = [sampling_params] * len(requests.prompt_list(prompts))
    if sampling_params is not None:
        sampling_params = [
            dataclasses.replace(p, seed=None) if isinstance(p, sampling.SamplingParams) and p.seed == 0 else p
            for p in sampling_params
        ]
    return _real_make(self, prompts, sampling_params)


FAULTS = [
    Fault(
        id="mixed-batch-generators-shifted",
        kind="sampling",
        description="in a batch of greedy and sampled rows, the j-th sampled row draws from the j-th generator of "
        "the batch (a greedy row's missing one means torch's global generator), not from its own request's",
        plant=patches(
            mock.patch.object(sampling, "sample", _generators_by_sampled_position),
            mock.patch.object(llm_engine, "sample", _generators_by_sampled_position),
        ),
        tests="test_greedy_and_sampled_rows_of_one_batch_each_draw_what_they_would_draw_alone",
    ),
    Fault(
        id="temperature-after-top-p",
        kind="sampling",
        description="top-k and top-p select tokens from the logits before they are divided by the temperature, so "
        "the nucleus is that of another distribution",
        plant=patches(
            mock.patch.object(sampling, "sample", _temperature_after_top_k_top_p),
            mock.patch.object(llm_engine, "sample", _temperature_after_top_k_top_p),
        ),
        tests="test_the_temperature_divides_the_logits_before_top_p_selects_the_nucleus",
        bug="https://github.com/vllm-project/tpu-inference/pull/1385",
    ),
    Fault(
        id="request-generator-ignored",
        kind="sampling",
        description="sampled rows draw from torch's global generator instead of their request's own, so a seed "
        "does not make a request repeat",
        plant=patches(mock.patch("torch.multinomial", _multinomial_without_generator)),
        tests="test_same_seed_repeats_and_different_seeds_differ",
    ),
    Fault(
        id="random-numbers-frozen",
        kind="sampling",
        description="the sampler's random number is drawn once per generator and replayed at every later draw, as "
        "a CUDA graph that captured its random numbers replays them: every step of a request draws the same "
        "quantile",
        plant=_noise_drawn_once,
        tests="test_sampled_frequencies_follow_the_temperature_scaled_distribution",
    ),
    Fault(
        id="temperature-frozen-per-batch-size",
        kind="sampling",
        description="the temperatures of a batch size's first call are kept as constants and reused by every later "
        "call of that size, as a sampler captured into a graph would hold its host values",
        plant=_temperatures_frozen_per_batch_size,
        tests="test_each_call_uses_its_own_temperature",
    ),
    Fault(
        id="top-p-one-token-short",
        kind="sampling",
        description="top-p keeps one token too few: the token that brings the nucleus to p is dropped",
        plant=patches(mock.patch.object(sampling, "apply_top_k_top_p", _nucleus_one_short)),
        tests="test_the_temperature_divides_the_logits_before_top_p_selects_the_nucleus",
    ),
    Fault(
        id="seed-zero-unseeded",
        kind="sampling",
        description="SamplingParams(seed=0) is treated as no seed, so such a request draws a different seed from "
        "the engine's stream at every generate call",
        plant=patches(mock.patch.object(requests.RequestBuilder, "make", _make_with_seed_zero_as_none)),
        tests="test_seed_zero_is_a_seed_like_any_other",
    ),
]
