"""Faults of the model runner (padding, slot mapping, the gather of the outputs) and of the engine's
scheduling (cache rows, context lengths, stopping rules), all visible on the CPU: the runner pads steps to
capture sizes there too."""

from __future__ import annotations

import bisect
import dataclasses
from unittest import mock

import torch

from conformance.faults.fault import Fault, patches
from reference.engine import llm
from reference.engine.llm import LLM
from reference.engine.runner import ModelRunner
from reference.ops.attention_metadata import AttentionMetadata

_real_slot_mapping = AttentionMetadata.slot_mapping_list
_real_decode = LLM._decode
_real_append = LLM._append


def _gathered_behind_the_padding(self, new_tokens, context_lens, rows):
    """Each sequence's last row is counted from the end of the padded batch (``hidden[-num_seqs:]`` in
    decode), which holds padding rows once the step is padded."""
    hidden, last_rows = self._run(new_tokens, context_lens, rows)
    n = hidden.shape[0]
    if last_rows is None:  # a decode step: every token is its sequence's last
        last_rows = torch.arange(n, device=hidden.device)
    padded = hidden.as_strided((max(self.padded_size(n), n), hidden.shape[1]), hidden.stride())
    return self.model.compute_logits(padded[last_rows + padded.shape[0] - n])


def _slots_one_ahead(query_lens, seq_lens, rows, max_model_len):
    return [slot + 1 for slot in _real_slot_mapping(query_lens, seq_lens, rows, max_model_len)]


def _padded_past_an_exact_size(self, num_tokens):
    """A step of exactly a capture size is padded to the next one (``bisect_right``)."""
    i = bisect.bisect_right(self.capture_sizes, num_tokens)
    return self.capture_sizes[i] if i < len(self.capture_sizes) else num_tokens


def _decode_with(rewrite):
    """``LLM._decode`` whose runner steps get ``rewrite(context_lens, rows) -> (context_lens, rows)``."""

    def decode(self, wave):
        step = self.runner.step

        def rewritten(tokens, context_lens, rows):
            return step(tokens, *rewrite(context_lens, rows))

        with mock.patch.object(self.runner, "step", rewritten):
            _real_decode(self, wave)

    return decode


def _rows_by_batch_position(context_lens, rows):
    return context_lens, list(range(len(rows)))


def _context_one_past(context_lens, rows):
    return [c + 1 for c in context_lens], rows


def _without(method: str, field: str, value):
    """``LLM.<method>(requests, ...)`` seeing each request's params with ``field`` set to ``value``
    (restored afterwards)."""
    real = getattr(LLM, method)

    def run(self, requests, *args):
        params = [r.params for r in requests]
        for r in requests:
            r.params = dataclasses.replace(r.params, **{field: value})
        try:
            return real(self, requests, *args)
        finally:
            for r, p in zip(requests, params):
                r.params = p

    return run


def _checks_in_order(*checks: str):
    """``LLM._append`` testing the end of a sequence in ``checks``' order ('eos', 'stop', 'length')."""

    def append(self, requests, tokens):
        for r, token in zip(requests, tokens):
            if r.finish_reason is not None:
                continue
            r.output.append(token)
            for check in checks:
                if check == "eos" and not r.params.ignore_eos and token in self.requests.eos_token_ids:
                    r.finish_reason = "stop"
                elif check == "stop" and token in r.params.stop_token_ids:
                    r.finish_reason, r.stop_reason = "stop", token
                elif check == "length" and len(r.output) >= r.params.max_tokens:
                    r.finish_reason = "length"
                if r.finish_reason is not None:
                    break

    return append


_real_sample = LLM._sample


def _min_tokens_one_too_many(self, requests, logits, counts):
    """Stop tokens stay banned one token longer than min_tokens says (``count <= min_tokens``)."""
    return _real_sample(self, requests, logits, [c - 1 for c in counts])


def _survivors_by_batch_position(sampled, keep):
    """The next decode step feeds the first ``len(keep)`` samples instead of the survivors' own: once a
    sequence finishes, the ones after it continue from their neighbours' tokens."""
    return sampled[: len(keep)]


def _append_late_tokens_too(self, requests, tokens):
    """The token a finished sequence got from the one step it ran too late is appended as well."""
    for r in requests:
        r.finish_reason = None if len(r.output) < r.params.max_tokens else r.finish_reason
    _real_append(self, requests, tokens)


FAULTS = [
    Fault(
        id="logits-gathered-behind-the-padding",
        kind="runner",
        description="each sequence's logits are taken at its last token counted from the end of the padded step, "
        "so a padded step reads padding rows",
        plant=patches(mock.patch.object(ModelRunner, "step", _gathered_behind_the_padding)),
        tests="test_padding_rows_do_not_change_the_real_rows",
    ),
    Fault(
        id="slot-mapping-one-ahead",
        kind="runner",
        description="every token's key and value go to the KV-cache slot after its position, so position 0 of a "
        "sequence is never written and attention reads an empty slot",
        plant=patches(mock.patch.object(AttentionMetadata, "slot_mapping_list", staticmethod(_slots_one_ahead))),
        tests="test_llama_oracle and test_logits_match and llama-tiny-eager-cpu",
    ),
    Fault(
        id="padded-past-an-exact-size",
        kind="runner",
        description="a step of exactly a capture size is padded to the next size, so the graphs of the size it "
        "has are captured but never replayed",
        plant=patches(mock.patch.object(ModelRunner, "padded_size", _padded_past_an_exact_size)),
        tests="test_padded_size_is_the_smallest_capture_size_that_fits",
    ),
    Fault(
        id="decode-rows-by-batch-position",
        kind="engine",
        description="decode steps address the KV cache by position in the batch of unfinished sequences, so once "
        "a sequence finishes, the ones after it read their neighbours' cache rows",
        plant=patches(mock.patch.object(LLM, "_decode", _decode_with(_rows_by_batch_position))),
        tests="test_each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="decode-context-one-past",
        kind="engine",
        description="decode steps count one cached token too many per sequence, so each new token goes one "
        "position too far and leaves a hole in the cache",
        plant=patches(mock.patch.object(LLM, "_decode", _decode_with(_context_one_past))),
        tests="test_greedy_generate_equals_token_by_token_recompute and eager-one-wave",
    ),
    Fault(
        id="decode-feeds-survivors-by-batch-position",
        kind="engine",
        description="when a sequence finishes, the next decode step feeds the first samples of the last step "
        "instead of each surviving sequence's own, so the sequences after it continue from a neighbour's token",
        plant=patches(mock.patch.object(llm, "_survivors", _survivors_by_batch_position)),
        tests="test_each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="late-token-of-a-finished-sequence-kept",
        kind="engine",
        description="the token a stopped sequence got from the step it ran in after its stop token (the decode "
        "loop sees stops one step late) is appended to its output",
        plant=patches(mock.patch.object(LLM, "_append", _append_late_tokens_too)),
        tests="test_a_stop_token_ends_the_sequence_and_is_reported",
    ),
    Fault(
        id="stop-token-not-checked",
        kind="engine",
        description="stop_token_ids do not end a sequence: it runs on to max_tokens",
        plant=patches(mock.patch.object(LLM, "_append", _without("_append", "stop_token_ids", []))),
        tests="test_a_stop_token_ends_the_sequence_and_is_reported",
    ),
    Fault(
        id="min-tokens-ignored",
        kind="engine",
        description="min_tokens does not keep EOS and stop tokens from being sampled early",
        plant=patches(mock.patch.object(LLM, "_sample", _without("_sample", "min_tokens", 0))),
        tests="test_min_tokens_keeps_stop_tokens_from_being_sampled_early",
    ),
    Fault(
        id="length-checked-before-stop-token",
        kind="engine",
        description="a stop token that is also the max_tokens-th token is reported as finish_reason 'length' "
        "with no stop_reason (vLLM reports 'stop' and the token)",
        plant=patches(mock.patch.object(LLM, "_append", _checks_in_order("length", "eos", "stop"))),
        tests="test_a_stop_token_at_any_position_ends_the_sequence_there",
    ),
    Fault(
        id="stop-token-checked-before-eos",
        kind="engine",
        description="a token that is both EOS and a stop token is reported with the stop token as its reason "
        "(vLLM checks EOS first: no stop_reason)",
        plant=patches(mock.patch.object(LLM, "_append", _checks_in_order("stop", "eos", "length"))),
        tests="test_eos_wins_over_a_stop_token_that_is_also_eos",
    ),
    Fault(
        id="min-tokens-one-too-many",
        kind="engine",
        description="min_tokens bans stop tokens while count <= min_tokens, one token longer than asked",
        plant=patches(mock.patch.object(LLM, "_sample", _min_tokens_one_too_many)),
        tests="test_min_tokens_allows_a_stop_token_exactly_from_its_count_on",
    ),
]
