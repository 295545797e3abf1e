"""Faults of the model runner (padding, slot mapping, the gather of the outputs) and of the engine's
scheduling (cache rows, context lengths, stopping rules), all visible on the CPU: the runner pads steps to
capture sizes there too."""

from __future__ import annotations

import bisect
import dataclasses
import types
from unittest import mock

import torch

from conformance.faults.fault import Fault, patches
from reference.engine import kernel_warm_up, llm_engine
from reference.engine.llm_engine import LLMEngine
from reference.engine.runner import ModelRunner
from reference.engine.scheduler import Scheduler
from reference.ops import kernel_launch
from reference.ops.attention_metadata import AttentionMetadata

_real_slot_mapping = AttentionMetadata.slot_mapping_list
_real_engine_run = LLMEngine._run
_real_runner_step = ModelRunner.step
_real_append = LLMEngine._append
_real_schedule = Scheduler.schedule
_real_finish = Scheduler.finish


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


def _decodes_with(rewrite):
    """``LLMEngine._run`` whose runner steps get ``rewrite(context_lens, rows, num_decodes) -> (context_lens,
    rows)`` (the decodes are the step's first ``num_decodes`` sequences)."""

    def run_with(self, step):
        run = self.runner.step

        def rewritten(tokens, context_lens, rows, fed=None):
            return run(tokens, *rewrite(context_lens, rows, len(step.decodes)), fed=fed)

        with mock.patch.object(self.runner, "step", rewritten):
            return _real_engine_run(self, step)

    return run_with


def _decode_rows_by_batch_position(context_lens, rows, num_decodes):
    return context_lens, list(range(num_decodes)) + rows[num_decodes:]


def _decode_context_one_past(context_lens, rows, num_decodes):
    return [c + (i < num_decodes) for i, c in enumerate(context_lens)], rows


def _without(method: str, field: str, value):
    """``LLMEngine.<method>(requests, ...)`` seeing each request's params with ``field`` set to ``value``
    (restored afterwards)."""
    real = getattr(LLMEngine, method)

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
    """``LLMEngine._append`` testing the end of a sequence in ``checks``' order ('eos', 'stop', 'length')."""

    def append(self, requests, tokens):
        ended = []
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
                    ended.append(r)
                    break
        return ended

    return append


def _queued_with(insort):
    """``Scheduler.add`` that queues a request with ``insort(waiting, request)`` under the priority policy."""

    def add(self, request):
        if self.by_priority:
            insort(self.waiting, request)
        else:
            self.waiting.append(request)

    return add


_real_sample = LLMEngine._sample


def _min_tokens_one_too_many(self, requests, logits, counts):
    """Stop tokens stay banned one token longer than min_tokens says (``count <= min_tokens``)."""
    return _real_sample(self, requests, logits, [c - 1 for c in counts])


def _gathered_by_batch_position(values, index):
    """Rows are taken by position, the first ``len(index)``, not the indexed ones: once a sequence finishes
    the decodes after it are fed their neighbours' samples, and a mixed step samples a chunk's logits from
    the wrong row."""
    return values[: len(index)]


def _continuing_chunk_one_token_late(self, step, r, take):
    """A continuing prompt chunk starts one token after the previous chunk ended: the token at the boundary
    is never cached (a last chunk of nothing runs as an empty sequence)."""
    start = r.num_cached + (r.num_cached > 0)
    take = max(min(len(r.prompt_token_ids) - start, take), 0)
    step.chunks.append((r, start, take))
    r.num_cached = start + take


def _mixed_step_taken_for_a_decode(self, new_tokens, context_lens, rows, fed=None):
    """A step is taken for a uniform decode when its fed decodes are (its prompt chunks are not looked at):
    a mixed step then returns the logits of every token, not of each sequence's last."""
    if fed is not None and len(fed):
        hidden = self.forward(new_tokens, context_lens, rows, fed=fed)
        return self.model.compute_logits(hidden)
    return _real_runner_step(self, new_tokens, context_lens, rows, fed=fed)


def _late_token_given_to_the_next_sequence(self, requests, tokens):
    """The requests that have already finished are dropped from a read step, but their tokens are not: the
    sequences after a stopped one take the tokens of their neighbours in the step it ran too late."""
    return _real_append(self, [r for r in requests if r.finish_reason is None], tokens)


def _row_handed_out_in_its_last_step(self):
    """A running request whose decode in this step samples its last token gives its row back before the step
    admits new requests (it "ends this step"): a request admitted now prefills into that row, over the
    context the last decode still reads in the same step. Its later finish does not free the row again."""
    for r in self.running:
        last = r.num_cached >= len(r.prompt_token_ids) and r.num_sampled + 1 == r.params.max_tokens
        if last and r.row not in self.free_rows and not getattr(r, "_row_given_back", False):
            r._row_given_back = True
            self.free_rows = sorted([*self.free_rows, r.row])
    return _real_schedule(self)


def _finish_without_the_row_given_back(self, request):
    if getattr(request, "_row_given_back", False):
        self.running = [r for r in self.running if r is not request]
    else:
        _real_finish(self, request)


def _prefill_alone(max_num_seqs, max_model_len):
    """The kernel warm-up's step without its decode: the decode attention kernel compiles after the trace."""
    return [2], [2], [0]


def _launcher_that_always_launches(kernel, grid):
    """The launcher ignores ``compile_only``: the warm-up's first pass launches each kernel, waiting for its
    compile first, one after another."""
    return kernel[grid]


def _compiled_left_unready(compile_kernel, device, *args, **kwargs):
    """The compile pool returns each kernel as compiled, not readied: its launcher is built (with the C compiler)
    and its binary loaded at its first launch, one kernel after another on the launching thread."""
    return compile_kernel(*args, **kwargs)


def _wanted_whatever_the_compiler(device, config):
    """The kernel warm-up's choice without ``use_inductor``: an Inductor start pays for a step it does not need."""
    return device.type in kernel_warm_up.DEVICE_TYPES


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
        plant=patches(mock.patch.object(LLMEngine, "_run", _decodes_with(_decode_rows_by_batch_position))),
        tests="test_each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="decode-context-one-past",
        kind="engine",
        description="decode steps count one cached token too many per sequence, so each new token goes one "
        "position too far and leaves a hole in the cache",
        plant=patches(mock.patch.object(LLMEngine, "_run", _decodes_with(_decode_context_one_past))),
        tests="test_greedy_generate_equals_token_by_token_recompute and eager-one-wave",
    ),
    Fault(
        id="decode-feeds-survivors-by-batch-position",
        kind="engine",
        description="when a sequence finishes, the next decode step feeds the first samples of the last step "
        "instead of each surviving sequence's own, so the sequences after it continue from a neighbour's token "
        "(and a mixed step samples chunks from the wrong logits rows)",
        plant=patches(mock.patch.object(llm_engine, "_gather", _gathered_by_batch_position)),
        tests="test_each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="late-token-given-to-the-next-sequence",
        kind="engine",
        description="when the tokens of the step a stopped sequence ran in too late (the loop sees stops one step "
        "late) are read, the stopped sequence is skipped but its token is not, so each sequence after it in that "
        "step takes its neighbour's token",
        plant=patches(mock.patch.object(LLMEngine, "_append", _late_token_given_to_the_next_sequence)),
        tests="test_a_stop_token_at_any_position_ends_the_sequence_there_and_the_other_goes_on",
    ),
    Fault(
        id="stop-token-not-checked",
        kind="engine",
        description="stop_token_ids do not end a sequence: it runs on to max_tokens",
        plant=patches(mock.patch.object(LLMEngine, "_append", _without("_append", "stop_token_ids", []))),
        tests="test_a_stop_token_ends_the_sequence_and_is_reported",
    ),
    Fault(
        id="min-tokens-ignored",
        kind="engine",
        description="min_tokens does not keep EOS and stop tokens from being sampled early",
        plant=patches(mock.patch.object(LLMEngine, "_sample", _without("_sample", "min_tokens", 0))),
        tests="test_min_tokens_keeps_stop_tokens_from_being_sampled_early",
    ),
    Fault(
        id="length-checked-before-stop-token",
        kind="engine",
        description="a stop token that is also the max_tokens-th token is reported as finish_reason 'length' "
        "with no stop_reason (vLLM reports 'stop' and the token)",
        plant=patches(mock.patch.object(LLMEngine, "_append", _checks_in_order("length", "eos", "stop"))),
        tests="test_a_stop_token_at_any_position_ends_the_sequence_there",
    ),
    Fault(
        id="stop-token-checked-before-eos",
        kind="engine",
        description="a token that is both EOS and a stop token is reported with the stop token as its reason "
        "(vLLM checks EOS first: no stop_reason)",
        plant=patches(mock.patch.object(LLMEngine, "_append", _checks_in_order("stop", "eos", "length"))),
        tests="test_eos_wins_over_a_stop_token_that_is_also_eos",
    ),
    Fault(
        id="min-tokens-one-too-many",
        kind="engine",
        description="min_tokens bans stop tokens while count <= min_tokens, one token longer than asked",
        plant=patches(mock.patch.object(LLMEngine, "_sample", _min_tokens_one_too_many)),
        tests="test_min_tokens_allows_a_stop_token_exactly_from_its_count_on",
    ),
    Fault(
        id="continuing-chunk-one-token-late",
        kind="engine",
        description="a prompt chunk that continues an earlier one starts a token after it ended, so the token at "
        "each chunk boundary never reaches the KV cache",
        plant=patches(mock.patch.object(Scheduler, "_chunk", _continuing_chunk_one_token_late)),
        tests="test_chunked_prefill_generates_what_one_step_prefill_generates",
    ),
    Fault(
        id="mixed-step-taken-for-a-decode",
        kind="runner",
        description="a step whose first sequences are fed decodes is taken for a uniform decode although prompt "
        "chunks follow them, so it returns every token's logits and the chunks sample from the wrong rows",
        plant=patches(mock.patch.object(ModelRunner, "step", _mixed_step_taken_for_a_decode)),
        tests="test_each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="row-handed-out-in-its-last-step",
        kind="engine",
        description="a request whose decode samples its last token gives its KV-cache row back before the step "
        "admits new requests, so a request admitted in that step prefills into the row its last decode reads",
        plant=patches(
            mock.patch.object(Scheduler, "schedule", _row_handed_out_in_its_last_step),
            mock.patch.object(Scheduler, "finish", _finish_without_the_row_given_back),
        ),
        tests="each_request_generates_what_it_generates_alone",
    ),
    Fault(
        id="priority-ties-last-come-first",
        kind="engine",
        description="under scheduling_policy='priority' a request is queued before the waiting requests of its "
        "own priority, so equal priorities run last come, first served",
        plant=patches(mock.patch.object(
            Scheduler, "add", _queued_with(lambda q, r: bisect.insort_left(q, r, key=lambda w: w.priority))
        )),  # fmt: skip
        tests="test_the_priority_policy_admits_the_lowest_value_first",
    ),
    Fault(
        id="priority-policy-ignored",
        kind="engine",
        description="scheduling_policy='priority' queues requests in arrival order, whatever their priority",
        plant=patches(mock.patch.object(Scheduler, "add", _queued_with(list.append))),
        tests="test_every_step_keeps_the_scheduling_rules_and_every_request_ends",
    ),
    Fault(
        id="kernel-warm-up-without-a-decode",
        kind="runner",
        description="the kernel warm-up's eager step is a prefill alone, so the decode attention kernel still "
        "compiles on the main thread, at the first decode graph's capture",
        plant=patches(mock.patch.object(kernel_warm_up, "warm_up_step", _prefill_alone)),
        tests="test_kernel_warm_up",
    ),
    Fault(
        id="kernel-warm-up-ends-before-its-kernels",
        kind="runner",
        description="the kernel warm-up's thread ends without waiting for the device to run its launches, so a "
        "capture can begin while the step's kernels still run",
        plant=patches(mock.patch.object(kernel_warm_up, "_launches_done", lambda device: None)),
        tests="test_on_cuda_the_warm_ups_launches_are_done_when_wait_returns",
        device="cuda",
    ),
    Fault(
        id="kernel-warm-up-with-inductor",
        kind="runner",
        description="the runner starts the kernel warm-up for an Inductor start too, whose kernels are Inductor's "
        "own, so the step only takes the interpreter's lock from Inductor's compile",
        plant=patches(mock.patch.object(kernel_warm_up, "wanted", _wanted_whatever_the_compiler)),
        tests="test_the_runner_warms_up_no_kernels_for_inductor",
    ),
    Fault(
        id="kernel-warm-up-compiles-on-one-thread",
        kind="runner",
        description="the kernel warm-up hands its compiles to a pool of one thread, so they run one after another "
        "as before the pool",
        plant=patches(mock.patch.object(kernel_warm_up, "COMPILE_WORKERS", 1)),
        tests="test_on_cuda_the_warm_up_compiles_its_kernels_at_once",
        device="cuda",
    ),
    Fault(
        id="compile-only-switch-shared-by-every-thread",
        kind="runner",
        description="compile_only's switch is one flag for the process, not one per thread: while the kernel "
        "warm-up compiles, every other thread's launches compile too and launch nothing",
        plant=patches(mock.patch.object(kernel_launch, "_thread", types.SimpleNamespace(compiling=False))),
        tests="test_compile_only_is_the_switch_of_its_own_thread_alone",
    ),
    Fault(
        id="compile-pool-leaves-its-kernels-unready",
        kind="runner",
        description="the kernel warm-up's compile pool leaves each kernel's launcher and binary to its first "
        "launch, so the warm-up's launching pass builds them one after another",
        plant=patches(mock.patch.object(kernel_launch, "_compiled_and_ready", _compiled_left_unready)),
        tests="test_on_cuda_the_warm_up_compiles_its_kernels_at_once",
        device="cuda",
    ),
    Fault(
        id="compile-only-pass-launches",
        kind="runner",
        description="the launcher ignores compile_only: the warm-up's first pass launches its kernels (writing the "
        "KV cache) and compiles them one at a time",
        plant=patches(mock.patch.object(kernel_launch, "launcher", _launcher_that_always_launches)),
        tests="test_on_cuda_a_launch_inside_compile_only",
        device="cuda",
    ),
]
