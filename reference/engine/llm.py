"""Offline generation with vLLM's interface: ``LLM(model).generate(prompts, SamplingParams(...))``.

The engine batches statically. Prompts run in waves of at most ``max_num_seqs`` sequences; a wave is
prefilled (all prompts together, prompts of different lengths in one step, split into several steps
when the wave has more than ``max_num_batched_tokens`` prompt tokens), then every unfinished sequence
of the wave decodes one token per step until each one has finished (``max_tokens`` reached, EOS unless
``ignore_eos``, or a stop token). The runner pads each step to a CUDA-graph capture size. There is no
continuous batching: a new wave starts only when the last one is done, which keeps the engine small and
makes a wave's decode batch exactly its unfinished sequences.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from tqdm.auto import tqdm

from reference.config import CompilationConfig, echo, parse_config_text
from reference.engine.runner import ModelRunner, StartupStats
from reference.engine.sampling import SamplingParams, make_generator, sample
from reference.models import registry
from reference.ops import CustomOpSelection

DEFAULT_MAX_MODEL_LEN = 2048  # cap on the default; long-context models would otherwise get huge KV caches
MAX_DEFAULT_CAPTURE_SIZE = 512  # vLLM's largest default capture size
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
_CAPTURE_FIELDS = ("cudagraph_capture_sizes", "max_cudagraph_capture_size")


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
class _Request:
    """A sequence in flight: its prompt, sampling state and KV-cache row."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    generator: torch.Generator | None
    banned_early: list[int]  # tokens masked while fewer than min_tokens were generated
    row: int = 0
    num_cached: int = 0  # prompt tokens already in the KV cache (chunked prefill)
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output)


class LLM:
    """A model compiled per a :class:`~reference.config.CompilationConfig`, ready to generate.

    Construction loads the weights, compiles the model and captures its CUDA graphs (a progress bar
    shows each stage), so ``generate`` never pays for compilation.

    Args:
        model: a preset name of :mod:`reference.models.registry` (e.g. ``'llama-3.1-8b'``) or a local
            checkpoint directory.
        compilation_config: a :class:`CompilationConfig`, a dict, a JSON / Python-literal string or a level
            digit, parsed by :meth:`CompilationConfig.parse`. When given as anything but a
            ``CompilationConfig`` and without ``cudagraph_capture_sizes`` / ``max_cudagraph_capture_size``,
            capture sizes go up to ``min(max_num_seqs, 512)``: decode steps never have more tokens
            than sequences, and larger (prefill) steps run compiled without graphs. A
            ``CompilationConfig`` object is used exactly as built.
        enforce_eager: apply :meth:`CompilationConfig.for_eager` (level 0, no CUDA graphs).
        dtype: ``'auto'`` (the checkpoint config's dtype if it is one of the others, else bfloat16 on CUDA
            and float32 on CPU), ``'float32'``, ``'bfloat16'`` or ``'float16'``.
        max_model_len: tokens per sequence (prompt + generated); default
            ``min(max_position_embeddings, 2048)``; at most ``max_position_embeddings``.
        max_num_seqs: sequences per wave (KV-cache rows), >= 1.
        max_num_batched_tokens: most tokens per step; prefills with more prompt tokens are chunked.
            Default ``max_num_seqs * max_model_len`` (a wave always prefills in one step); at least
            ``max_num_seqs``.
        device: ``'cuda'`` if available, else ``'cpu'``.
        seed: seed of the weights (presets are randomly initialised) and of the per-request generators of
            requests without their own ``seed``.
        tokenizer: path of a transformers tokenizer; default: the model directory's, if it has one.
        share_weights_with: another ``LLM`` of the same model whose weight tensors this one uses (one set
            of weights for several compilation modes in one process).
        use_tqdm: show start-up progress.

    Attributes:
        config: the resolved compilation config. runner: the :class:`ModelRunner`.
        startup: its :class:`StartupStats`. load_s: weight loading time, s.
        custom_ops: ``{'enabled': [...], 'disabled': [...]}`` custom op names.

    Raises:
        ValueError: an argument is out of range (the message names it).
        reference.config.ConfigError: the compilation config is invalid or contradicts ``enforce_eager``.
    """

    def __init__(
        self,
        model: str,
        *,
        compilation_config: CompilationConfig | Mapping[str, Any] | str | int | None = None,
        enforce_eager: bool = False,
        dtype: str = "auto",
        max_model_len: int | None = None,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int | None = None,
        device: str | torch.device | None = None,
        seed: int = 0,
        tokenizer: str | None = None,
        share_weights_with: "LLM | None" = None,
        use_tqdm: bool = True,
    ):
        _check_positive("max_num_seqs", max_num_seqs)
        self.model_name = model
        self.device = _resolve_device(device)
        self.hf_config = registry.model_config(model)
        text_config = self.hf_config.get_text_config()  # the language model's (multimodal configs nest it)
        self.vocab_size = text_config.vocab_size
        self.dtype = _resolve_dtype(dtype, getattr(text_config, "dtype", None) or self.hf_config.dtype, self.device)
        self.max_model_len = _resolve_max_model_len(max_model_len, text_config.max_position_embeddings)
        if max_num_batched_tokens is not None:
            _check_positive("max_num_batched_tokens", max_num_batched_tokens)
            if max_num_batched_tokens < max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                    "a decode step feeds one token per sequence"
                )
        self.config = _resolve_config(compilation_config, enforce_eager, max_num_seqs)
        self.tokenizer = _load_tokenizer(model, tokenizer)
        self.eos_token_ids = _eos_token_ids(self.hf_config, self.tokenizer)
        self.seed = seed
        self._seeds = random.Random(seed)  # per-request seeds for requests without one
        self._next_request = 0

        stages = tqdm(total=2, desc=f"{model}: load weights", disable=not use_tqdm, unit="stage")

        def report(stage: str) -> None:
            stages.update()
            stages.set_description(f"{model}: {stage}")

        ops = CustomOpSelection(self.config)
        start = time.perf_counter()
        self.model = registry.build_model(
            model,
            ops,
            dtype=self.dtype,
            device=self.device,
            seed=seed,
            share_weights_with=None if share_weights_with is None else share_weights_with.model,
        )
        self.load_s = time.perf_counter() - start
        self.custom_ops = ops.summary()
        self.runner = ModelRunner(
            self.model,
            self.config,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
        )
        stages.total += len(self.runner.capture_sizes)
        self.startup: StartupStats = self.runner.warm_up(progress=report)
        report("ready")
        stages.close()

    @property
    def max_num_seqs(self) -> int:
        return self.runner.max_num_seqs

    def get_tokenizer(self):
        """The transformers tokenizer, or None."""
        return self.tokenizer

    # ------------------------------------------------------------------ generate
    def generate(
        self,
        prompts: str | Mapping | Sequence,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate a completion for every prompt.

        Args:
            prompts: a string, a token-id prompt (``[[1, 2, 3]]`` or ``{'prompt_token_ids': [1, 2, 3]}``),
                or a list of them. Strings need a tokenizer. A flat list of ints is refused as ambiguous.
            sampling_params: one for all prompts, one per prompt, or None for ``SamplingParams()``.
            use_tqdm: show a progress bar over finished prompts.

        Returns:
            One :class:`RequestOutput` per prompt, in prompt order.

        Raises:
            ValueError: a prompt is empty, not tokens or text, has a token outside the vocabulary, or with
                ``max_tokens`` does not fit ``max_model_len``; string prompts without a tokenizer; a stop
                token outside the vocabulary; the number of sampling params differs from the prompts'.
        """
        requests = self._make_requests(prompts, sampling_params)
        bar = tqdm(total=len(requests), desc="Processed prompts", disable=not use_tqdm)
        with torch.inference_mode():
            for start in range(0, len(requests), self.max_num_seqs):
                wave = requests[start : start + self.max_num_seqs]
                for row, request in enumerate(wave):
                    request.row = row
                self._prefill(wave)
                self._decode(wave)
                bar.update(len(wave))
        bar.close()
        return [self._output(r) for r in requests]

    def _prefill(self, wave: list[_Request]) -> None:
        """Put every prompt of the wave into the KV cache, at most ``max_num_batched_tokens`` per step,
        and sample each sequence's first token after its last prompt chunk."""
        budget = self.runner.max_num_tokens
        pending = list(wave)
        while pending:
            chunks: list[tuple[_Request, int, int]] = []  # (request, start, length)
            room = budget
            for request in pending:
                take = min(len(request.prompt_token_ids) - request.num_cached, room)
                if take == 0:
                    break
                chunks.append((request, request.num_cached, take))
                room -= take
            new_tokens = [r.prompt_token_ids[s : s + n] for r, s, n in chunks]
            logits = self.runner.step(new_tokens, [s for _, s, _ in chunks], [r.row for r, _, _ in chunks])  # [C, V]
            for request, s, n in chunks:
                request.num_cached = s + n
            done = [i for i, (r, _, _) in enumerate(chunks) if r.num_cached == len(r.prompt_token_ids)]
            self._sample([chunks[i][0] for i in done], logits[done])
            pending = [r for r in pending if r.num_cached < len(r.prompt_token_ids)]

    def _decode(self, wave: list[_Request]) -> None:
        """One token per unfinished sequence per step until all have finished."""
        while live := [r for r in wave if r.finish_reason is None]:
            # feed each sequence's last token; the ones before it are cached
            context = [r.num_tokens - 1 for r in live]
            logits = self.runner.step([[r.output[-1]] for r in live], context, [r.row for r in live])  # [B, V]
            self._sample(live, logits)

    def _sample(self, requests: list[_Request], logits: torch.Tensor) -> None:
        """Sample one token per request from ``logits`` [len(requests), V] float32 and check for the end."""
        for i, r in enumerate(requests):
            if r.banned_early and len(r.output) < r.params.min_tokens:
                logits[i, r.banned_early] = float("-inf")
        tokens = sample(logits, [r.params for r in requests], [r.generator for r in requests]).tolist()
        for r, token in zip(requests, tokens):
            r.output.append(token)
            if token in r.params.stop_token_ids:
                r.finish_reason, r.stop_reason = "stop", token
            elif not r.params.ignore_eos and token in self.eos_token_ids:
                r.finish_reason = "stop"
            elif len(r.output) >= r.params.max_tokens:
                r.finish_reason = "length"

    # ------------------------------------------------------------------ requests in and out
    def _make_requests(self, prompts, sampling_params) -> list[_Request]:
        items = _prompt_list(prompts)
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
            bad_stop = [t for t in p.stop_token_ids if t >= self.vocab_size]
            if bad_stop:
                raise ValueError(
                    f"sampling_params.stop_token_ids: {echo(bad_stop)} outside the vocabulary [0, {self.vocab_size})"
                )
            checked.append((text, ids, p))
        requests = []  # made once every prompt is valid, so a refused call consumes no ids or seeds
        for text, ids, p in checked:
            eos = set() if p.ignore_eos else {t for t in self.eos_token_ids if t < self.vocab_size}
            seed = p.seed if p.seed is not None else self._seeds.getrandbits(63)
            generator = None if p.greedy else make_generator(seed, self.device)
            banned = sorted(eos | set(p.stop_token_ids))
            requests.append(_Request(str(self._next_request), text, ids, p, generator, banned))
            self._next_request += 1
        return requests

    def _tokens(self, i: int, item) -> tuple[str | None, list[int]]:
        """(text or None, token ids) of prompt ``i``, validated."""
        if isinstance(item, str):
            if self.tokenizer is None:
                raise ValueError(
                    f"prompts[{i}] is a string but {echo(self.model_name)} has no tokenizer; pass tokenizer=PATH "
                    "to LLM(...) or give token ids ([[1, 2, 3]] or {'prompt_token_ids': [...]})"
                )
            text, ids = item, list(self.tokenizer.encode(item))
        elif isinstance(item, Mapping) and "prompt_token_ids" in item:
            text, ids = None, item["prompt_token_ids"]
        else:
            text, ids = None, item
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Sequence) or not ids:
            raise ValueError(f"prompts[{i}]: expected a non-empty list of token ids or a string, got {echo(item)}")
        for position, t in enumerate(ids):
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"prompts[{i}]: token ids must be ints in [0, {self.vocab_size}), got {echo(t)} at position "
                    f"{position} of {len(ids)}"
                )
        return text, list(ids)

    def _output(self, r: _Request) -> RequestOutput:
        text = None
        if self.tokenizer is not None:
            shown = r.output[:-1] if r.finish_reason == "stop" else r.output
            text = self.tokenizer.decode(shown, skip_special_tokens=True)
        completion = CompletionOutput(0, list(r.output), text, r.finish_reason, r.stop_reason)
        return RequestOutput(r.request_id, r.prompt, r.prompt_token_ids, [completion])


# ---------------------------------------------------------------------- argument resolution
def _check_positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {echo(value)}")


def _resolve_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as err:
        # torch's own message repeats the string too, so it is left out
        raise ValueError(f"device: expected e.g. 'cpu', 'cuda' or 'cuda:1', got {echo(device)}") from None
    if resolved.type not in ("cpu", "cuda"):
        raise ValueError(f"device: expected a 'cpu' or 'cuda' device, got {echo(device)}")
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {echo(device)} requested but CUDA is not available")
    return resolved


def _resolve_dtype(dtype, configured, device: torch.device) -> torch.dtype:
    """``dtype`` as a torch dtype; ``'auto'`` picks the checkpoint's ``configured`` dtype (str, dtype or None)."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {['auto', *DTYPES]}, got {echo(dtype)}")
        return DTYPES[dtype]
    configured = DTYPES.get(configured, configured) if isinstance(configured, str) else configured
    if configured in DTYPES.values():
        return configured
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _resolve_max_model_len(max_model_len, max_positions: int) -> int:
    if max_model_len is None:
        return min(max_positions, DEFAULT_MAX_MODEL_LEN)
    _check_positive("max_model_len", max_model_len)
    if max_model_len > max_positions:
        raise ValueError(
            f"max_model_len ({max_model_len}) exceeds the model's max_position_embeddings ({max_positions})"
        )
    return max_model_len


def _resolve_config(value, enforce_eager: bool, max_num_seqs: int) -> CompilationConfig:
    """Parse ``value``; default capture sizes to what decode needs; apply ``enforce_eager``."""
    if not isinstance(value, CompilationConfig):
        fields = compilation_fields(value)
        if isinstance(fields, Mapping) and not any(f in fields for f in _CAPTURE_FIELDS):
            fields = {**fields, "max_cudagraph_capture_size": min(max_num_seqs, MAX_DEFAULT_CAPTURE_SIZE)}
        value = fields
    config = CompilationConfig.parse(value)
    return config.for_eager() if enforce_eager else config


def compilation_fields(value: Mapping[str, Any] | str | int | None) -> Any:
    """The fields a compilation config value sets, as a dict: ``None`` -> ``{}``, a level ``3`` ->
    ``{'level': 3}``, a string as :meth:`CompilationConfig.parse` reads it. Anything else is returned
    unchanged for ``CompilationConfig.parse`` to reject with its message.

    Raises:
        reference.config.ConfigError: a string that is neither JSON, a Python literal nor a digit.
    """
    if value is None:
        return {}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"level": value}
    if isinstance(value, str):
        return parse_config_text(value)
    return dict(value) if isinstance(value, Mapping) else value


def _prompt_list(prompts) -> list:
    if isinstance(prompts, (str, Mapping)):
        return [prompts]
    if isinstance(prompts, torch.Tensor):
        prompts = prompts.tolist()
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


def _load_tokenizer(model: str, path: str | None):
    if path is None:
        if not (os.path.isdir(model) and any(os.path.exists(os.path.join(model, f)) for f in _TOKENIZER_FILES)):
            return None
        path = model
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(f"tokenizer: cannot load a tokenizer from {echo(path)}: {err}") from None


def _eos_token_ids(hf_config, tokenizer) -> frozenset[int]:
    """EOS ids from the model config (an int or a list) and the tokenizer."""
    ids = set()
    for config in (hf_config, getattr(hf_config, "text_config", None)):
        eos = getattr(config, "eos_token_id", None)
        ids.update([eos] if isinstance(eos, int) else eos or [])
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
