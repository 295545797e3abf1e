"""The engine loop (vLLM's ``LLMEngine``): requests added at any time, one step per :meth:`LLMEngine.step`.

Each step runs what :class:`~reference.engine.scheduler.Scheduler` chose (decodes first, then prompt
chunks) on the :class:`~reference.engine.runner.ModelRunner`, samples one token for every sequence that
decodes or whose prompt that step completes, and reads the tokens of the step before. The host never
waits for a step before issuing the next: a step feeds its decodes the previous step's samples straight
from the device (the runner copies them into its input buffer there), and the host reads a step's
tokens (one non-blocking copy to pinned memory) only once the next step is queued. So an EOS or stop
token ends its sequence one step late: the sequence has run in the next step too, that token is
dropped, and its row is freed once that step is queued. ``max_tokens`` is known ahead: the row of a
sequence that has sampled its last token is freed as soon as that step is queued.

The price: the step after a sequence's stop token may run for nothing (on a GPU one step's device time,
against the host time saved on every step; vLLM's asynchronous scheduling makes the same trade). On a
CPU nothing overlaps and the extra steps are pure cost; the loop is the same there anyway, so that the
CPU suite checks the loop GPUs run.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from reference.config.parsing import echo
from reference.engine.requests import Request, RequestBuilder, RequestOutput
from reference.engine.runner import ModelRunner
from reference.engine.sampling import sample
from reference.engine.scheduler import ScheduledStep, Scheduler
from reference.ops.attention_metadata import int_lists_to_device


class LLMEngine:
    """Continuous batching over a runner (module doc).

    Args:
        runner: the compiled model, its KV cache and its limits (``max_num_seqs``, ``max_num_tokens``).
        requests: checks prompts and sampling params into requests and finished requests into outputs.
        enable_chunked_prefill, scheduling, scheduling_policy: the :class:`Scheduler`'s.
    """

    def __init__(
        self,
        runner: ModelRunner,
        requests: RequestBuilder,
        *,
        enable_chunked_prefill: bool,
        scheduling: str,
        scheduling_policy: str,
    ):
        self.runner, self.requests = runner, requests
        self.scheduler = Scheduler(
            runner.max_num_seqs,
            runner.max_num_tokens,
            enable_chunked_prefill=enable_chunked_prefill,
            scheduling=scheduling,
            scheduling_policy=scheduling_policy,
        )
        self._previous: tuple[list[Request], torch.Tensor] | None = None  # last step's samplers, samples [S]
        self._in_flight: tuple | None = None  # (samplers, host copy of their samples [S], event after the copy)

    def add_requests(self, prompts, sampling_params=None, priority=None) -> list[str]:
        """Queue prompts (the forms ``LLM.generate`` takes); each joins the first step with a free row and
        budget for it, in the order given, or under ``scheduling_policy='priority'`` in ``priority`` order
        (one int per prompt, lower first; ties in the order given).

        Returns:
            Their request ids, which the ``RequestOutput`` objects :meth:`step` returns carry.

        Raises:
            ValueError: as ``LLM.generate`` documents; nothing is queued then.
        """
        requests = self.requests.make(prompts, sampling_params, priority, self.scheduler.scheduling_policy)
        for request in requests:
            self.scheduler.add(request)
        return [r.request_id for r in requests]

    def has_unfinished_requests(self) -> bool:
        """Requests waiting or running, or a step's tokens not yet read."""
        return self.scheduler.has_unfinished() or self._in_flight is not None

    def abort_requests(self, request_ids: str | Iterable[str]) -> None:
        """Drop the unfinished requests among ``request_ids``: one id, or an iterable of ids, from
        :meth:`add_requests` (as vLLM's ``abort_request`` takes them); ids of requests already finished or unknown
        are ignored, as vLLM ignores them. No :meth:`step` returns them; their rows are free for the next step.

        Raises:
            ValueError: ``request_ids`` is neither a string nor an iterable of strings (nothing is aborted then).
        """
        ids = {request_ids} if isinstance(request_ids, str) else _id_set(request_ids)
        for r in [*self.scheduler.waiting, *self.scheduler.running]:
            if r.request_id in ids:
                r.finish_reason = "abort"  # a token of it still in flight is read and dropped (_append)
                self.scheduler.abort(r)
        if not self.scheduler.has_unfinished():
            self._previous = self._in_flight = None

    def step(self) -> list[RequestOutput]:
        """Issue the next step (if a request is left to run) and read the step before it.

        Returns:
            The requests that the read tokens finished, as vLLM's ``RequestOutput``.

        Raises:
            Whatever the model, the sampler or an interrupt (``KeyboardInterrupt``) raises inside the step. The
            engine's state then no longer matches the KV cache (a chunk may be counted as cached that never
            ran, a sample may be missing), so every unfinished request is aborted first: the engine is
            empty, and usable, when the exception reaches the caller.
        """
        try:
            return self._step()
        except BaseException:
            # the engine is then empty, so abort_requests also drops what the step left half-made
            self.abort_requests([r.request_id for r in [*self.scheduler.waiting, *self.scheduler.running]])
            raise

    @torch.inference_mode()
    def _step(self) -> list[RequestOutput]:
        issued = None
        if self.scheduler.has_unfinished():
            step = self.scheduler.schedule()
            logits = self._run(step)  # [decodes + chunks, V]
            samplers = step.samplers
            self._previous = None
            if samplers:
                picked = _gather(logits, step.sampling_rows)  # [S, V]
                sampled = self._sample(samplers, picked, [r.num_sampled for r in samplers])  # [S] int64
                self._previous = (samplers, sampled)
                for r in samplers:
                    r.num_sampled += 1
                    if r.num_sampled == r.params.max_tokens:
                        self.scheduler.finish(r)  # its last token is sampled: its row is free for the next step
                issued = (samplers, *_copy_to_host(sampled))
        ended = self._read(*self._in_flight) if self._in_flight is not None else []
        self._in_flight = issued
        return [self.requests.output(r) for r in ended]

    def _run(self, step: ScheduledStep) -> torch.Tensor:
        """Run ``step`` on the runner: its decodes fed from the last step's samples on the device, its
        prompt chunks from the host.

        Returns:
            [len(step.decodes) + len(step.chunks), V] float32 logits, decodes first.
        """
        fed = None
        if step.decodes:
            samplers, sampled = self._previous  # every decode sampled in the last step (scheduler module doc)
            index = {id(r): i for i, r in enumerate(samplers)}
            fed = _gather(sampled, [index[id(r)] for r in step.decodes])
        context = [len(r.prompt_token_ids) + r.num_sampled - 1 for r in step.decodes]  # the fed token is new
        context += [start for _, start, _ in step.chunks]
        rows = [r.row for r in step.decodes] + [r.row for r, _, _ in step.chunks]
        chunks = [r.prompt_token_ids[start : start + length] for r, start, length in step.chunks]
        return self.runner.step(chunks, context, rows, fed=fed)

    def _read(self, requests: list[Request], host_tokens: torch.Tensor, copied) -> list[Request]:
        """Wait for a step's sampled tokens to reach the host, append them (:meth:`_append`) and free the
        rows of the requests they ended that still hold one; returns the requests that finished."""
        if copied is not None:
            copied.synchronize()
        ended = self._append(requests, host_tokens.tolist())
        for r in ended:
            if r.num_sampled < r.params.max_tokens:  # else its row was freed when its last token was sampled
                self.scheduler.finish(r)
        return ended

    def _sample(self, requests: list[Request], logits: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """One token per request from ``logits`` [len(requests), V] float32, where request ``i`` has
        generated ``counts[i]`` tokens so far (``min_tokens`` bans its early stop tokens until then).

        Returns:
            [len(requests)] int64 on the logits' device, without waiting for the device.
        """
        for i, (r, count) in enumerate(zip(requests, counts)):
            if r.banned_early and count < r.params.min_tokens:
                logits[i].index_fill_(0, r.banned_index(logits.device), float("-inf"))
        return sample(logits, [r.params for r in requests], [r.generator for r in requests])

    def _append(self, requests: list[Request], tokens: list[int]) -> list[Request]:
        """Append each request's new token and check for the end, in vLLM's order: EOS (unless
        ``ignore_eos``; no stop reason), then ``stop_token_ids`` (the token is the reason), then
        ``max_tokens``. Requests already finished (their token came from the step after their last) are
        left as they are. Returns the requests this call finished."""
        ended = []
        for r, token in zip(requests, tokens):
            if r.finish_reason is not None:
                continue
            r.output.append(token)
            if not r.params.ignore_eos and token in self.requests.eos_token_ids:
                r.finish_reason = "stop"
            elif token in r.params.stop_token_ids:
                r.finish_reason, r.stop_reason = "stop", token
            elif len(r.output) >= r.params.max_tokens:
                r.finish_reason = "length"
            if r.finish_reason is not None:
                ended.append(r)
        return ended


def _gather(values: torch.Tensor, index: list[int]) -> torch.Tensor:
    """``values[index]`` by a staged device index (no wait for the device); ``values`` itself when
    ``index`` is ``0..len(values) - 1``, as in a step where no sequence finished."""
    if index == list(range(len(values))):
        return values
    return values[int_lists_to_device([index], values.device)[0]]


def _copy_to_host(tokens: torch.Tensor) -> tuple[torch.Tensor, "torch.cuda.Event | None"]:
    """A non-blocking copy of ``tokens`` into pinned host memory and the event that marks it done (on a
    CPU the tensor itself and None)."""
    if not tokens.is_cuda:
        return tokens, None
    host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
    host.copy_(tokens, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return host, copied


def _id_set(request_ids: object) -> set[str]:
    """``request_ids`` (an iterable of ids) as a set; a ValueError naming what is no id. An error the iterable
    itself raises (a generator's) comes through as it is."""
    expected = "request_ids: expected a request id (str) or an iterable of them, as add_requests returns"
    if isinstance(request_ids, (bytes, bytearray)):  # iterable, but of ints
        raise ValueError(f"{expected}; got {echo(request_ids)}")
    try:
        iterator = iter(request_ids)
    except TypeError:
        raise ValueError(f"{expected}; got {echo(request_ids)}") from None
    ids = list(iterator)
    not_ids = [i for i in ids if not isinstance(i, str)]
    if not_ids:
        raise ValueError(f"{expected}; got {echo(not_ids[0])} among them")
    return set(ids)
