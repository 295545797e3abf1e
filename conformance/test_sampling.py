"""Sampling: greedy is argmax, top-k/top-p keep exactly the right tokens, seeds make draws repeat."""

import math

import pytest
import torch

from reference.engine.sampling import (
    SamplingError,
    SamplingParams,
    apply_top_k,
    apply_top_k_top_p,
    make_generator,
    sample,
)

# The reference's own components (not the compilation mechanism): skipped for other --impl.
pytestmark = pytest.mark.requires("components")


def _kept(masked: torch.Tensor) -> set[int]:
    return set(torch.nonzero(torch.isfinite(masked)).flatten().tolist())


def _nucleus(probs: list[float], p: float) -> set[int]:
    """Holtzman et al.'s nucleus, computed independently: the smallest most-likely-first set with mass >= p."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    kept, mass = set(), 0.0
    for i in order:
        kept.add(i)
        mass += probs[i]
        if mass >= p:
            break
    return kept


def test_greedy_rows_take_the_argmax_without_a_generator():
    logits = torch.randn(5, 97, generator=torch.Generator().manual_seed(0))
    tokens = sample(logits, [SamplingParams(temperature=0)] * 5, [None] * 5)
    assert tokens.dtype == torch.int64
    assert torch.equal(tokens, logits.argmax(-1))


@pytest.mark.parametrize("k", [1, 3, 10])
def test_top_k_keeps_the_k_largest_logits(k):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(k))
    masked = apply_top_k_top_p(logits, torch.full((4,), k), torch.ones(4))
    for row in range(4):
        assert _kept(masked[row]) == set(logits[row].topk(k).indices.tolist())
        kept = sorted(_kept(masked[row]))
        assert torch.equal(masked[row, kept], logits[row, kept])  # kept logits are unchanged


@pytest.mark.parametrize("k", [0, -1, 50, 1000])
def test_top_k_off_or_at_least_the_vocabulary_keeps_every_token(k):
    logits = torch.randn(2, 50, generator=torch.Generator().manual_seed(1))
    assert torch.equal(apply_top_k_top_p(logits, torch.full((2,), k), torch.ones(2)), logits)


@pytest.mark.parametrize("seed", range(5))
def test_top_k_alone_masks_exactly_what_the_sorting_path_masks(seed):
    """The sampler's top-k-only path (one topk, no sort): bitwise the general path with top_p = 1, ties included
    (integer logits tie often), k off (0, V, above V) and k of 1 and V - 1 among the rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(-3, 4, (6, 50), generator=generator).float()
    top_k = torch.tensor([0, 1, 7, 49, 50, 80])
    fast = apply_top_k(logits, top_k, k_max=49)
    assert torch.equal(fast, apply_top_k_top_p(logits, top_k, torch.ones(6)))
    assert torch.isinf(fast[1]).sum() < 49  # ties with the largest value are kept: the rule checks ties


@pytest.mark.parametrize("p", [0.3, 0.6, 0.75, 0.9, 0.97, 1.0])
def test_top_p_keeps_the_smallest_most_likely_set_reaching_p(p):
    probs = [0.05, 0.5, 0.15, 0.3]  # no prefix sum equals a tested p, so rounding cannot decide the answer
    logits = torch.tensor([probs]).log()
    masked = apply_top_k_top_p(logits, torch.zeros(1, dtype=torch.int64), torch.tensor([p]))
    assert _kept(masked[0]) == _nucleus(probs, p)


def test_top_p_applies_to_the_distribution_left_by_top_k():
    probs = [0.4, 0.3, 0.2, 0.1]
    logits = torch.tensor([probs]).log()
    # top-k=2 leaves 0.4/0.7 and 0.3/0.7; p=0.5 then needs only the first of them (0.57 >= 0.5), whereas
    # top-p on the full distribution would need two tokens (0.4 < 0.5).
    masked = apply_top_k_top_p(logits, torch.tensor([2]), torch.tensor([0.5]))
    assert _kept(masked[0]) == {0}


def test_each_row_uses_its_own_top_k_and_top_p():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(2))
    top_k, top_p = torch.tensor([1, 0, 5]), torch.tensor([1.0, 1.0, 1.0])
    masked = apply_top_k_top_p(logits, top_k, top_p)
    assert [len(_kept(row)) for row in masked] == [1, 40, 5]


def _draws(seed: int, n: int = 20, logits=None) -> list[int]:
    logits = torch.zeros(1, 1000) if logits is None else logits  # uniform over 1000 tokens
    g = make_generator(seed, "cpu")
    return [sample(logits, [SamplingParams(seed=seed)], [g]).item() for _ in range(n)]


def test_same_seed_repeats_and_different_seeds_differ():
    assert _draws(7) == _draws(7)
    # 20 uniform draws over 1000 tokens coincide by chance with probability 1e-60
    assert _draws(7) != _draws(8)


def test_a_rows_draw_does_not_depend_on_the_other_rows_in_the_batch():
    logits = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=s) for s in (11, 12, 13)]
    alone = sample(logits[1:2], params[1:2], [make_generator(12, "cpu")])
    together = sample(logits, params, [make_generator(s, "cpu") for s in (11, 12, 13)])
    assert together[1] == alone[0]


def test_sampled_frequencies_follow_the_temperature_scaled_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1])
    temperature = 2.0
    logits = (probs.log() * temperature)[None]  # softmax(logits / temperature) == probs
    n = 2000
    g = make_generator(0, "cpu")
    params = [SamplingParams(temperature=temperature)]
    counts = torch.bincount(torch.cat([sample(logits, params, [g]) for _ in range(n)]), minlength=3)
    # each count is binomial(n, p); 5 standard deviations makes a false failure astronomically unlikely
    for c, p in zip(counts.tolist(), probs.tolist()):
        assert abs(c - n * p) <= 5 * math.sqrt(n * p * (1 - p)), (counts, probs)


def test_a_sampled_row_without_a_generator_is_an_error():
    with pytest.raises(ValueError, match="row 0 samples"):
        sample(torch.zeros(1, 4), [SamplingParams(temperature=1.0)], [None])


@pytest.mark.parametrize(
    "field, value",
    [
        ("n", 2),
        ("temperature", -0.5),
        ("temperature", 0.001),
        ("temperature", float("nan")),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("top_k", 2.5),
        ("max_tokens", 0),
        ("min_tokens", -1),
        ("min_tokens", 17),  # more than max_tokens (16)
        ("ignore_eos", "yes"),
        ("stop_token_ids", [1, -3]),
        ("stop_token_ids", "12"),
        ("stop_token_ids", 5),  # one id, not a list of them: a one-line error, not a TypeError
        ("stop_token_ids", {1: 2}),
        ("seed", 1.5),
        ("seed", -1),  # the LLM's own seed refuses it too
        ("seed", 2**64),  # torch.Generator.manual_seed overflows
    ],
)
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(SamplingError, match=rf"^{field}: expected|^{field}: only"):
        SamplingParams(**{field: value})


def test_stop_token_ids_none_is_vllms_default_spelling_of_no_stop_tokens():
    assert SamplingParams(stop_token_ids=None).stop_token_ids == []
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
