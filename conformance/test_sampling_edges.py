"""Sampling rules that mutation testing (./run mutate engine.sampling) found unguarded: the edges of each
parameter's range, top-k and top-p at their boundaries, rows of a batch with different restrictions, and a
call whose lists do not fit its logits."""

import pytest
import torch

from reference.engine.arguments import SEED_LIMIT
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

LOGITS = torch.tensor([[3.0, 1.0, 2.0, 0.0, -1.0]])  # most likely first: tokens 0, 2, 1, 3, 4


def _kept(masked: torch.Tensor) -> list[set[int]]:
    """Per row, the tokens left finite."""
    return [set(torch.nonzero(torch.isfinite(row)).flatten().tolist()) for row in masked]


@pytest.mark.parametrize(
    "field, value",
    [("top_k", -1), ("max_tokens", 1), ("stop_token_ids", [0]), ("seed", SEED_LIMIT - 1), ("temperature", 0.01)],
)
def test_the_edges_of_each_range_are_accepted(field, value):
    assert getattr(SamplingParams(**{field: value}), field) == value


def test_min_tokens_may_equal_max_tokens():
    assert SamplingParams(max_tokens=4, min_tokens=4).min_tokens == 4


@pytest.mark.parametrize(
    "field, value",
    [("temperature", True), ("temperature", "1"), ("top_p", True), ("top_p", "0.5"), ("seed", SEED_LIMIT)],
)
def test_bools_strings_and_the_seed_limit_are_refused_naming_the_field(field, value):
    with pytest.raises(SamplingError, match=rf"^{field}: expected"):
        SamplingParams(**{field: value})


def test_top_k_of_the_whole_vocabulary_keeps_every_token_next_to_a_restricted_row():
    logits = LOGITS.repeat(2, 1)
    kept = _kept(apply_top_k(logits, torch.tensor([5, 2]), k_max=2))
    assert kept == [{0, 1, 2, 3, 4}, {0, 2}]


def test_top_k_of_1_keeps_only_the_largest_next_to_a_wider_row():
    logits = LOGITS.repeat(2, 1)
    assert _kept(apply_top_k(logits, torch.tensor([1, 3]), k_max=3)) == [{0}, {0, 2, 1}]


def test_top_p_reached_exactly_by_the_more_likely_tokens_drops_the_rest():
    """Two equal tokens have probability 0.5 each, exactly: the first alone reaches p = 0.5."""
    kept = _kept(apply_top_k_top_p(torch.zeros(1, 2), torch.tensor([0]), torch.tensor([0.5])))
    assert len(kept[0]) == 1


def test_top_p_of_1_keeps_tokens_whose_mass_before_rounds_to_1():
    """After a token of probability ~1, float32 cumsums reach 1.0: p = 1 must still keep every token."""
    logits = torch.tensor([[0.0, -30.0, -30.0, -30.0]])
    assert _kept(apply_top_k_top_p(logits, torch.tensor([0]), torch.tensor([1.0]))) == [{0, 1, 2, 3}]


def test_a_sampled_row_with_top_k_1_draws_the_largest():
    params = [SamplingParams(temperature=1.0, top_k=1, seed=s) for s in range(4)]
    generators = [make_generator(s, "cpu") for s in range(4)]
    assert sample(LOGITS.repeat(4, 1), params, generators).tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("n_params, n_generators", [(2, 1), (1, 2)])
def test_params_or_generators_that_do_not_fit_the_batch_are_an_error(n_params, n_generators):
    with pytest.raises(ValueError) as err:
        sample(torch.zeros(1, 4), [SamplingParams(temperature=0)] * n_params, [None] * n_generators)
    assert str(err.value) == f"sample: expected 1 params and generators, got {n_params} and {n_generators}"
