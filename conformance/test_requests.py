"""The engine's intake and output of requests (reference.engine.requests): every prompt form ``generate``
accepts, the limits a request is checked against, its ids and seeds, what ``min_tokens`` keeps out, and the
``RequestOutput`` vLLM's users read. No model runs: ``RequestBuilder`` is what ``LLM.generate`` calls."""

from __future__ import annotations

import pytest
import torch

from reference.engine.requests import Request, RequestBuilder, prompt_list
from reference.engine.sampling import SamplingParams

pytestmark = pytest.mark.requires("components")

VOCAB = 10
MAX_MODEL_LEN = 32  # past SamplingParams's default max_tokens (16) and a short prompt
EOS = frozenset({2, VOCAB})  # VOCAB: an EOS id just past the vocabulary, as a tokenizer's added tokens may be


class Tokenizer:
    """Encodes a string as its characters' ordinals mod VOCAB; decodes to the ids' repr and the flag."""

    def encode(self, text: str, verbose: bool = True) -> list[int]:
        return [ord(c) % VOCAB for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return f"{ids} skip={skip_special_tokens}"


def builder(tokenizer=None, max_prompt_len=None) -> RequestBuilder:
    cpu = torch.device("cpu")
    return RequestBuilder("toy", VOCAB, MAX_MODEL_LEN, tokenizer, EOS, seed=0, device=cpu, max_prompt_len=max_prompt_len)


# ---------------------------------------------------------------------- prompt forms
def test_every_prompt_form_gives_its_token_ids_and_a_text_only_for_strings():
    forms = [[1, 2], {"prompt_token_ids": [3, 4]}, torch.tensor([5, 6]), "ab"]
    made = builder(Tokenizer()).make(forms, None)
    assert [r.prompt_token_ids for r in made] == [[1, 2], [3, 4], [5, 6], [7, 8]]  # 'a' = 97, 'b' = 98
    assert [r.prompt for r in made] == [None, None, None, "ab"]


def test_a_two_dimensional_tensor_is_one_prompt_per_row():
    assert prompt_list(torch.tensor([[1, 2], [3, 4]])) == [[1, 2], [3, 4]]
    assert [r.prompt_token_ids for r in builder().make(torch.tensor([[1, 2], [3, 4]]), None)] == [[1, 2], [3, 4]]


@pytest.mark.parametrize("prompts", [5, {1, 2}, [], None])
def test_prompts_that_are_no_prompt_list_are_one_line_naming_what_was_given(prompts):
    with pytest.raises(ValueError) as err:
        prompt_list(prompts)
    assert str(err.value) == f"prompts: expected a string, a token-id prompt or a non-empty list of them, got {prompts!r}"


def test_a_flat_list_of_ints_is_refused_with_both_unambiguous_spellings():
    with pytest.raises(ValueError) as err:
        prompt_list([1, 2, 3])
    assert str(err.value) == (
        "prompts: a flat list of ints is ambiguous; pass one token-id prompt as [[1, 2, 3]] or "
        "{'prompt_token_ids': [1, 2, 3]}"
    )


def test_a_string_prompt_without_a_tokenizer_says_how_to_give_one_or_token_ids():
    with pytest.raises(ValueError) as err:
        builder().make(["hello"], None)
    assert str(err.value) == (
        "prompts[0] is a string but 'toy' has no tokenizer; pass tokenizer=PATH to LLM(...) or give token ids "
        "([[1, 2, 3]] or {'prompt_token_ids': [...]})"
    )


@pytest.mark.parametrize("token", [True, 1.0, -1, VOCAB])
def test_a_token_id_that_is_no_int_in_the_vocabulary_is_refused_naming_it(token):
    with pytest.raises(ValueError, match=rf"^prompts\[0\]: token ids must be ints in \[0, {VOCAB}\), got .* at position 1"):
        builder().make([[3, token]], None)


def test_the_ends_of_the_vocabulary_are_token_ids():
    assert builder().make([[0, VOCAB - 1]], None)[0].prompt_token_ids == [0, VOCAB - 1]


# ---------------------------------------------------------------------- sampling params and limits
def test_no_sampling_params_means_vllms_defaults_for_every_prompt():
    made = builder().make([[1], [2]], None)
    assert [r.params for r in made] == [SamplingParams(), SamplingParams()]


def test_a_list_of_sampling_params_of_the_wrong_length_is_one_line_naming_both_counts():
    with pytest.raises(ValueError) as err:
        builder().make([[1], [2]], [SamplingParams()])
    assert str(err.value) == (
        "sampling_params: expected one SamplingParams or a list of 2 (one per prompt), got list of 1"
    )


def test_a_prompt_and_max_tokens_may_fill_max_model_len_exactly_and_not_one_token_more():
    assert len(builder().make([[1, 2, 3]], SamplingParams(max_tokens=MAX_MODEL_LEN - 3))) == 1
    with pytest.raises(ValueError, match=r"^prompts\[0\]: prompt \(3 tokens\) \+ max_tokens \(30\) = 33 exceeds"):
        builder().make([[1, 2, 3]], SamplingParams(max_tokens=MAX_MODEL_LEN - 2))


def test_a_stop_token_id_must_lie_in_the_vocabulary():
    assert builder().make([[1]], SamplingParams(stop_token_ids=[VOCAB - 1]))[0].params.stop_token_ids == [VOCAB - 1]
    with pytest.raises(ValueError, match=rf"^sampling_params.stop_token_ids: \[{VOCAB}\] outside the vocabulary"):
        builder().make([[1]], SamplingParams(stop_token_ids=[VOCAB]))


# ---------------------------------------------------------------------- ids, seeds, min_tokens' bans
def test_request_ids_count_from_zero_in_submission_order_across_calls():
    requests = builder()
    first = [r.request_id for r in requests.make([[1], [2]], None)]
    assert first + [r.request_id for r in requests.make([[3]], None)] == ["0", "1", "2"]


def test_without_chunked_prefill_a_prompt_longer_than_the_step_budget_is_refused_naming_both_ways_out():
    requests = builder(max_prompt_len=2)
    assert len(requests.make([[1, 2]], None)) == 1
    with pytest.raises(ValueError) as err:
        requests.make([[1, 2, 3]], None)
    assert str(err.value) == (
        "prompts[0]: prompt (3 tokens) exceeds max_num_batched_tokens (2) with enable_chunked_prefill=False, so it "
        "could never run; enable chunked prefill or raise max_num_batched_tokens"
    )


def test_the_builders_default_policy_is_fcfs_which_takes_only_priorities_of_0():
    """As the engine's default (vLLM's): a priority other than 0 needs scheduling_policy='priority'."""
    assert [r.priority for r in builder().make([[1], [2]], None, [0, 0])] == [0, 0]
    with pytest.raises(ValueError, match=r"^priority: \[0, 1\] is not 0 everywhere, but scheduling_policy is 'fcfs'"):
        builder().make([[1], [2]], None, [0, 1])
    assert [r.priority for r in builder().make([[1], [2]], None, [0, 1], "priority")] == [0, 1]


def test_greedy_requests_get_no_generator_and_sampled_ones_one_on_the_builders_device():
    greedy, sampled = builder().make([[1], [2]], [SamplingParams(temperature=0), SamplingParams(temperature=1)])
    assert greedy.generator is None
    assert sampled.generator is not None and sampled.generator.device == torch.device("cpu")


def test_min_tokens_bans_the_eos_ids_in_the_vocabulary_and_the_stop_ids_unless_eos_is_ignored():
    params = dict(min_tokens=2, stop_token_ids=[5])
    plain, ignoring = builder().make([[1], [1]], [SamplingParams(**params), SamplingParams(**params, ignore_eos=True)])
    assert plain.banned_early == [2, 5]  # VOCAB, past the vocabulary, has no logit to mask
    assert ignoring.banned_early == [5]


def test_min_tokens_whose_bans_cover_the_whole_vocabulary_is_refused_and_one_token_short_is_not():
    """Nothing could be sampled before ``min_tokens``: greedy would pick a banned id anyway (every logit
    -inf), sampling would divide by zero. One allowed id left is a valid (if odd) request."""
    everything_but_eos = [t for t in range(VOCAB) if t not in EOS]
    with pytest.raises(ValueError, match=rf"^sampling_params.min_tokens: 1 bans .* every one of the {VOCAB} token ids"):
        builder().make([[1]], SamplingParams(min_tokens=1, stop_token_ids=everything_but_eos))
    assert builder().make([[1]], SamplingParams(min_tokens=1, stop_token_ids=everything_but_eos[1:]))
    assert builder().make([[1]], SamplingParams(min_tokens=1, ignore_eos=True, stop_token_ids=everything_but_eos))
    assert builder().make([[1]], SamplingParams(min_tokens=0, stop_token_ids=list(range(VOCAB))))


# ---------------------------------------------------------------------- outputs
def _finished(output: list[int], finish_reason: str) -> Request:
    request = builder().make([[1]], None)[0]
    request.output, request.finish_reason = output, finish_reason
    return request


def test_an_output_without_a_tokenizer_has_the_tokens_and_no_text():
    out = builder().output(_finished([4, 5], "length"))
    assert (out.request_id, out.prompt_token_ids, out.finished) == ("0", [1], True)
    (completion,) = out.outputs
    assert (completion.index, completion.token_ids, completion.text, completion.finish_reason) == (0, [4, 5], None, "length")


@pytest.mark.parametrize("reason, shown", [("stop", [4, 5]), ("length", [4, 5, 6])])
def test_the_text_leaves_out_the_token_that_stopped_the_sequence_and_special_tokens(reason, shown):
    completion = builder(Tokenizer()).output(_finished([4, 5, 6], reason)).outputs[0]
    assert completion.text == f"{shown} skip=True" and completion.token_ids == [4, 5, 6]


def test_a_sampled_requests_generator_is_made_on_the_engines_device(monkeypatch):
    """CUDA sampling refuses a CPU generator: a generator made without the engine's device fails only there."""
    made_on = []

    def recording(seed, device):
        made_on.append(device)
        return torch.Generator()

    monkeypatch.setattr("reference.engine.requests.make_generator", recording)
    engine_device = torch.device("cuda", 1)  # nothing is allocated there: the device is only passed on
    builder = RequestBuilder("toy", VOCAB, MAX_MODEL_LEN, None, EOS, seed=0, device=engine_device)
    builder.make([[1, 2]], SamplingParams(temperature=1.0))
    assert made_on == [engine_device]


def test_a_text_longer_than_the_tokenizers_limit_is_our_one_line_only(monkeypatch):
    """A 20,000-token text printed transformers' warning ("Token indices sequence length is longer than the
    specified maximum sequence length ...") before the engine's own error (a new user's try): the engine checks
    lengths itself, against max_model_len, so the tokenizer's limit says nothing here. transformers' logger
    does not propagate and holds the stream it found at import, so a handler of the test's own listens."""
    import logging

    from transformers import AutoTokenizer

    heard = []
    listener = logging.Handler()
    listener.emit = heard.append
    logging.getLogger("transformers").addHandler(listener)
    try:
        tokenizer = AutoTokenizer.from_pretrained("fixtures/tiny-llama")
        text = "hello world " * tokenizer.model_max_length  # past the tokenizer's 512
        made = RequestBuilder("tiny-llama", len(tokenizer), 600, tokenizer, EOS, seed=0, device=torch.device("cpu"))
        with pytest.raises(ValueError, match=r"^prompts\[0\]: prompt \(\d+ tokens\) .* exceeds max_model_len \(600\)"):
            made.make([text], None)
    finally:
        logging.getLogger("transformers").removeHandler(listener)
    assert [r.getMessage() for r in heard if "Token indices" in r.getMessage()] == []
