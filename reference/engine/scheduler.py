"""Which requests run in the next step, and with how many tokens: continuous batching with chunked prefill.

Each step has a token budget (``max_num_batched_tokens``). It goes first to the running requests that
decode (one token each, always: the engine refuses a budget below ``max_num_seqs``), then to the running
requests whose prompts are still being prefilled, in admission order, then to waiting requests in the
policy's order (below: arrival order by default) while a KV-cache row is free (``max_num_seqs`` rows, one per
running request). A prompt longer than what is left is cut into chunks (``enable_chunked_prefill``, vLLM's
default) that continue in later steps; without chunking a prompt is admitted only when all of it fits, and
a waiting request never jumps the queue. This
is vLLM's scheduler in its simplest form (vLLM's ``Scheduler.schedule`` also preempts and pages the KV
cache; here every row holds ``max_model_len`` tokens, so an admitted request always fits and none is ever
preempted).

``scheduling='static'`` admits new requests only when none is running: the batch of requests runs to its
end before the next starts (static batching, the engine before continuous batching; kept as the
throughput benchmark's baseline).

Which waiting request goes first is vLLM's ``scheduling_policy``: ``'fcfs'`` (the default), arrival order;
``'priority'``, the lowest ``Request.priority`` value first and equal values in arrival order. vLLM's priority
policy also preempts a running request of a later priority when the KV cache is full; here a request needs
one free row, which only a finished one frees, so none is preempted and a running request always runs on.

The scheduler counts tokens, not outcomes: the engine tells it when a request has sampled its last token
(:meth:`Scheduler.finish`), which frees the request's row for the next step.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from reference.config import echo
from reference.engine.requests import Request

SCHEDULING = ("continuous", "static")
SCHEDULING_POLICIES = ("fcfs", "priority")


@dataclass
class ScheduledStep:
    """One step's work.

    Attributes:
        decodes: running requests that add one token each (their previous step's sample), in admission
            order; they come first in the step.
        chunks: ``(request, start, length)``: prompt tokens ``start .. start + length - 1`` of each request
            whose prompt is not yet cached, after the decodes.
    """

    decodes: list[Request] = field(default_factory=list)
    chunks: list[tuple[Request, int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(length for _, _, length in self.chunks)

    @property
    def sampling_rows(self) -> list[int]:
        """Where the samplers' logits are among the step's sequences (decodes, then chunks)."""
        first = len(self.decodes)
        ends = [i for i, (r, start, length) in enumerate(self.chunks) if start + length == len(r.prompt_token_ids)]
        return list(range(first)) + [first + i for i in ends]

    @property
    def samplers(self) -> list[Request]:
        """The requests that sample a token from this step, in step order: every decode, and every request
        whose last prompt chunk this is."""
        sequences = self.decodes + [r for r, _, _ in self.chunks]
        return [sequences[i] for i in self.sampling_rows]


def check_scheduling(scheduling, scheduling_policy) -> None:
    """Raises ValueError, naming the field and its choices, unless ``scheduling`` is one of :data:`SCHEDULING`
    and ``scheduling_policy`` one of :data:`SCHEDULING_POLICIES`, both ``str`` (a numpy string would compare
    elementwise). ``LLM`` calls it before any weights load."""
    if not isinstance(scheduling, str) or scheduling not in SCHEDULING:
        raise ValueError(f"scheduling: expected one of {list(SCHEDULING)}, got {echo(scheduling)}")
    if not isinstance(scheduling_policy, str) or scheduling_policy not in SCHEDULING_POLICIES:
        choices = list(SCHEDULING_POLICIES)
        raise ValueError(f"scheduling_policy: expected one of {choices}, got {echo(scheduling_policy)}")


class Scheduler:
    """Continuous batching over ``max_num_seqs`` KV-cache rows with a token budget per step (module doc).

    Args:
        max_num_seqs: running requests at most (KV-cache rows 0..max_num_seqs - 1).
        max_num_batched_tokens: tokens per step at most, >= max_num_seqs.
        enable_chunked_prefill: cut prompts to what is left of the budget (else a prompt waits until all of
            it fits, and one longer than the budget is refused by :meth:`add`).
        scheduling: ``'continuous'`` or ``'static'`` (module doc).
        scheduling_policy: ``'fcfs'`` or ``'priority'``: the order of the waiting queue (module doc).

    Raises:
        ValueError: ``scheduling`` not one of :data:`SCHEDULING`, ``scheduling_policy`` not one of
            :data:`SCHEDULING_POLICIES`, or a budget below ``max_num_seqs``.
    """

    def __init__(
        self,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        *,
        enable_chunked_prefill: bool = True,
        scheduling: str = "continuous",
        scheduling_policy: str = "fcfs",
    ):
        check_scheduling(scheduling, scheduling_policy)
        if max_num_batched_tokens < max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                "every running request decodes one token per step"
            )
        self.max_num_seqs, self.budget = max_num_seqs, max_num_batched_tokens
        self.chunked, self.static = enable_chunked_prefill, scheduling == "static"
        self.scheduling_policy = scheduling_policy
        self.by_priority = scheduling_policy == "priority"
        self.waiting: list[Request] = []  # the queue, first to be admitted first
        self.running: list[Request] = []  # admission order
        self.free_rows = list(range(max_num_seqs))  # lowest first

    def add(self, request: Request) -> None:
        """Queue ``request`` (its ``num_cached`` prompt tokens already cached: 0 for a new one).

        Raises:
            ValueError: without chunked prefill, a prompt longer than the step budget (it could never run).
        """
        if not self.chunked and len(request.prompt_token_ids) > self.budget:
            raise ValueError(
                f"request {request.request_id}: its prompt ({len(request.prompt_token_ids)} tokens) exceeds "
                f"max_num_batched_tokens ({self.budget}) and enable_chunked_prefill is False: it can never run; "
                "enable chunked prefill or raise max_num_batched_tokens"
            )
        if self.by_priority:  # after every request of the same priority: ties in arrival order
            bisect.insort_right(self.waiting, request, key=lambda r: r.priority)
        else:
            self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledStep:
        """The next step: decodes, then prompt chunks of running requests, then new requests (module doc).
        Advances each scheduled request's ``num_cached`` past its chunk. Empty when nothing is left."""
        step = ScheduledStep()
        if self.static and not self.running:  # a new batch: as many requests as there are rows
            while self.waiting and self.free_rows:
                self._admit()
        prefilling = []
        for r in self.running:
            (prefilling if r.num_cached < len(r.prompt_token_ids) else step.decodes).append(r)
        left = self.budget - len(step.decodes)
        for r in prefilling:
            take = self._fits(r, left)
            if take == 0:
                break  # in admission order: a later prompt never goes first
            self._chunk(step, r, take)
            left -= take
        while not self.static and self.waiting and self.free_rows:
            take = self._fits(self.waiting[0], left)
            if take == 0:
                break
            self._chunk(step, self._admit(), take)
            left -= take
        return step

    def _fits(self, r: Request, left: int) -> int:
        """How many of ``r``'s uncached prompt tokens the step can take with ``left`` tokens of budget:
        all of them or none without chunked prefill."""
        remaining = len(r.prompt_token_ids) - r.num_cached
        if not self.chunked:
            return remaining if remaining <= left else 0
        return min(remaining, left)

    def _admit(self) -> Request:
        """Move the first waiting request to the running ones, in the lowest free row."""
        r = self.waiting.pop(0)
        r.row = self.free_rows.pop(0)
        self.running.append(r)
        return r

    def _chunk(self, step: ScheduledStep, r: Request, take: int) -> None:
        """Schedule ``r``'s next ``take`` uncached prompt tokens."""
        step.chunks.append((r, r.num_cached, take))
        r.num_cached += take

    def abort(self, request: Request) -> None:
        """Drop ``request``, waiting or running (its row is freed for the next step); one that is neither is
        left alone."""
        if any(r is request for r in self.running):
            self.finish(request)
        else:
            self.waiting = [r for r in self.waiting if r is not request]

    def finish(self, request: Request) -> None:
        """``request`` runs in no later step: free its row for the next one.

        Raises:
            ValueError: ``request`` is not running.
        """
        where = [i for i, r in enumerate(self.running) if r is request]
        if not where:
            raise ValueError(f"request {request.request_id} is not running")
        del self.running[where[0]]
        self.free_rows.append(request.row)
        self.free_rows.sort()
