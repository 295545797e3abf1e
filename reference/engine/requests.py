"""Requests in and out of the engine: prompts and sampling params checked into :class:`Request` objects,
finished requests turned into vLLM's ``RequestOutput``."""

from __future__ import annotations

import operator
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from reference.config import echo
from reference.engine.sampling import SamplingParams, make_generator
from reference.ops.attention_metadata import int_lists_to_device


@dataclass
class CompletionOutput:
    """One completion of a prompt (vLLM's ``CompletionOutput``).

    Attributes:
        index: completion number (always 0: n=1).
        token_ids: generated token ids, the stop or EOS token included when it ended the sequence.
        text: ``token_ids`` decoded (special tokens and the final stop token left out); None without a
            tokenizer.
        finish_reason: ``'stop'`` (EOS or a stop token) or ``'length'`` (``max_tokens`` reached).
        stop_reason: the stop token id from ``stop_token_ids`` that ended it; None for EOS or length.
    """

    index: int
    token_ids: list[int]
    text: str | None
    finish_reason: str
    stop_reason: int | None = None


@dataclass
class RequestOutput:
    """The result for one prompt (vLLM's ``RequestOutput``).

    Attributes:
        request_id: unique within the :class:`LLM`, in submission order.
        prompt: the prompt text, or None for a token-id prompt.
        prompt_token_ids: the prompt's token ids.
        outputs: one :class:`CompletionOutput`.
        finished: always True (``generate`` returns when every request has finished).
    """

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class Request:
    """A sequence in flight: its prompt, sampling state and KV-cache row."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    banned_early: list[int]  # tokens masked while fewer than min_tokens were generated
    priority: int = 0  # the scheduler's order under scheduling_policy='priority': lower first
    row: int = 0
    num_cached: int = 0  # prompt tokens scheduled into the KV cache (chunked prefill)
    num_sampled: int = 0  # tokens sampled so far, read by the host or still in flight
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None
    _banned_index: torch.Tensor | None = field(default=None, repr=False)

    def banned_index(self, device: torch.device) -> torch.Tensor:
        """``banned_early`` as an int64 tensor on ``device``, copied there once per request (pinned, without
        waiting for the device)."""
        if self._banned_index is None:
            self._banned_index = int_lists_to_device([self.banned_early], device)[0]
        return self._banned_index


def _is_ordered_and_flat(priority) -> bool:
    """A list, tuple, range or 1-d numpy array or torch tensor: values in an order to match the prompts'.
    Sets and mappings have no order of their own; text and bytes are not numbers; a 0-d or 2-d array is not
    one value per prompt."""
    if isinstance(priority, (str, bytes, bytearray, memoryview)):
        return False
    if hasattr(priority, "ndim"):  # numpy arrays and torch tensors
        return priority.ndim == 1
    return isinstance(priority, Sequence)


def _priorities(priority, count: int) -> list[int]:
    """``generate``'s ``priority`` as a list of ``count`` Python ints: a list, tuple or 1-d array of integral
    numbers (numpy and torch integers too, as ``operator.index`` takes them), not bools.

    Raises:
        ValueError: not such a sequence, not ``count`` values or not integral ones; naming the entry that is not.
    """
    if not _is_ordered_and_flat(priority):
        raise ValueError(
            f"priority: expected a list, tuple or 1-d array of ints, one per prompt ({count}), got {echo(priority)}"
        )
    values = list(priority)
    if len(values) != count:
        raise ValueError(
            f"priority: expected one int per prompt ({count}), got {len(values)} value{'s' * (len(values) != 1)}"
        )
    ints = []
    for i, value in enumerate(values):
        try:
            if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
                raise TypeError
            ints.append(operator.index(value))
        except TypeError:
            raise ValueError(f"priority[{i}]: expected an int, got {echo(value)}") from None
    return ints


class RequestBuilder:
    """Turns ``generate``'s arguments into checked requests for one model, and requests into outputs.

    Args:
        model_name: for messages. vocab_size: token ids must lie in ``[0, vocab_size)``.
        max_model_len: prompt + ``max_tokens`` must fit. tokenizer: for text prompts, or None.
        eos_token_ids: ids that end a sequence unless ``ignore_eos``.
        seed: seeds the per-request generators of requests without their own ``seed``.
        device: where the generators live.
        max_prompt_len: None, or the most prompt tokens a request may have (the step budget when prompts
            are not chunked, so that one longer could never run).
    """

    def __init__(
        self,
        model_name: str,
        vocab_size: int,
        max_model_len: int,
        tokenizer,
        eos_token_ids: frozenset[int],
        seed: int,
        device: torch.device,
        max_prompt_len: int | None = None,
    ):
        self.model_name, self.vocab_size, self.max_model_len = model_name, vocab_size, max_model_len
        self.max_prompt_len = max_prompt_len
        self.tokenizer, self.eos_token_ids, self.device = tokenizer, eos_token_ids, device
        self._seeds = random.Random(seed)  # per-request seeds for requests without one
        self._next_request = 0

    def make(self, prompts, sampling_params, priority=None, scheduling_policy: str = "fcfs") -> list[Request]:
        """Checked requests, one per prompt (see ``LLM.generate`` for the accepted forms); ``priority``: one
        int per prompt (the scheduler's order under ``scheduling_policy='priority'``), or None for 0 each;
        under ``'fcfs'``, the engine's default as vLLM's, only 0s (vLLM's rule: any other value would be ignored).

        Raises:
            ValueError: as ``LLM.generate`` documents; nothing is consumed (request ids, seeds) on error.
        """
        items = prompt_list(prompts)
        priority = [0] * len(items) if priority is None else _priorities(priority, len(items))
        if scheduling_policy == "fcfs" and any(priority):
            raise ValueError(
                f"priority: {echo(priority)} is not 0 everywhere, but scheduling_policy is 'fcfs', which ignores it; "
                "build the LLM with scheduling_policy='priority'"
            )
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(items)
        else:
            params = list(sampling_params)
            if len(params) != len(items) or not all(isinstance(p, SamplingParams) for p in params):
                raise ValueError(
                    f"sampling_params: expected one SamplingParams or a list of {len(items)} (one per prompt), "
                    f"got {type(sampling_params).__name__} of {len(params)}"
                )
        checked = []
        for i, (item, p) in enumerate(zip(items, params)):
            text, ids = self._tokens(i, item)
            if len(ids) + p.max_tokens > self.max_model_len:
                raise ValueError(
                    f"prompts[{i}]: prompt ({len(ids)} tokens) + max_tokens ({p.max_tokens}) = "
                    f"{len(ids) + p.max_tokens} exceeds max_model_len ({self.max_model_len})"
                )
            if self.max_prompt_len is not None and len(ids) > self.max_prompt_len:
                raise ValueError(
                    f"prompts[{i}]: prompt ({len(ids)} tokens) exceeds max_num_batched_tokens ({self.max_prompt_len}) "
                    "with enable_chunked_prefill=False, so it could never run; enable chunked prefill or raise "
                    "max_num_batched_tokens"
                )
            bad_stop = [t for t in p.stop_token_ids if t >= self.vocab_size]
            if bad_stop:
                raise ValueError(
                    f"sampling_params.stop_token_ids: {echo(bad_stop)} outside the vocabulary [0, {self.vocab_size})"
                )
            eos = set() if p.ignore_eos else {t for t in self.eos_token_ids if t < self.vocab_size}
            if p.min_tokens > 0 and len(eos | set(p.stop_token_ids)) >= self.vocab_size:
                raise ValueError(
                    f"sampling_params.min_tokens: {p.min_tokens} bans EOS and stop_token_ids until then, and they "
                    f"cover every one of the {self.vocab_size} token ids: nothing could be sampled"
                )
            checked.append((text, ids, p))
        requests = []  # made once every prompt is valid, so a refused call consumes no ids or seeds
        for (text, ids, p), rank in zip(checked, priority):
            eos = set() if p.ignore_eos else {t for t in self.eos_token_ids if t < self.vocab_size}
            seed = p.seed if p.seed is not None else self._seeds.getrandbits(63)
            generator = None if p.greedy else make_generator(seed, self.device)
            banned = sorted(eos | set(p.stop_token_ids))
            requests.append(Request(str(self._next_request), text, ids, p, generator, banned, priority=rank))
            self._next_request += 1
        return requests

    def _tokens(self, i: int, item) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of prompt ``i``, validated: a string, vLLM's ``{'prompt': str}`` (TextPrompt),
        token ids as a list or tensor, or vLLM's ``{'prompt_token_ids': ids}`` (TokensPrompt)."""
        if isinstance(item, Mapping) and "prompt_token_ids" not in item and isinstance(item.get("prompt"), str):
            item = item["prompt"]
        if isinstance(item, str) and item:
            if self.tokenizer is None:
                raise ValueError(
                    f"prompts[{i}] is a string but {echo(self.model_name)} has no tokenizer; pass tokenizer=PATH "
                    "to LLM(...) or give token ids ([[1, 2, 3]] or {'prompt_token_ids': [...]})"
                )
            try:
                # verbose=False: transformers' warning about its own length limit; max_model_len is checked below
                text, ids = item, list(self.tokenizer.encode(item, verbose=False))
            except (TypeError, ValueError) as err:  # transformers' own, e.g. a lone surrogate's TypeError
                raise ValueError(f"prompts[{i}]: the tokenizer cannot encode it ({err})") from None
        elif isinstance(item, Mapping) and "prompt_token_ids" in item:
            text, ids = None, item["prompt_token_ids"]
        else:
            text, ids = None, item
        ids = _as_lists(ids)
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids:
            raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids or a string, got {echo(item)}")
        for position, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompts[{i}]: token ids must be ints in [0, {self.vocab_size}), got {echo(t)} at position "
                    f"{position} of {len(ids)}"
                )
        return text, list(ids)

    def output(self, r: Request) -> RequestOutput:
        """The finished request ``r`` as vLLM's ``RequestOutput`` (text decoded when there is a tokenizer)."""
        text = None
        if self.tokenizer is not None:
            shown = r.output[:-1] if r.finish_reason == "stop" else r.output
            text = self.tokenizer.decode(shown, skip_special_tokens=True)
        completion = CompletionOutput(0, list(r.output), text, r.finish_reason, r.stop_reason)
        return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids, [completion])


def _as_lists(value):
    """A tensor or a numpy array (anything array-like with ``tolist``, a string aside) as nested lists of Python
    numbers; anything else as it is."""
    if isinstance(value, torch.Tensor) or (hasattr(value, "tolist") and hasattr(value, "ndim")):
        return value.tolist()
    return value


def prompt_list(prompts) -> list:
    """``generate``'s ``prompts`` as a list of single prompts.

    Raises:
        ValueError: no prompt, or a flat list of ints (ambiguous: one prompt or many?).
    """
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    prompts = _as_lists(prompts)
    if not isinstance(prompts, Sequence) or not prompts:
        raise ValueError(
            f"prompts: expected a string, a token-id prompt or a non-empty list of them, got {echo(prompts)}"
        )
    if all(isinstance(t, int) for t in prompts):
        raise ValueError(
            "prompts: a flat list of ints is ambiguous; pass one token-id prompt as [[1, 2, 3]] or "
            "{'prompt_token_ids': [1, 2, 3]}"
        )
    return list(prompts)
