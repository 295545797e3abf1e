"""Offline generation with vLLM's interface: ``LLM(model).generate(prompts, SamplingParams(...))``.

The engine batches statically. Prompts run in waves of at most ``max_num_seqs`` sequences; a wave is
prefilled (all prompts together, prompts of different lengths in one step, split into several steps
when the wave has more than ``max_num_batched_tokens`` prompt tokens), then every unfinished sequence
of the wave decodes one token per step until each one has finished (``max_tokens`` reached, EOS unless
``ignore_eos``, or a stop token). The host never waits for a decode step before issuing the next: each
step feeds the previous step's sampled ids on the device, and the host reads a step's tokens after
issuing the next, so an EOS or stop token ends its sequence one step late (that step's token is
dropped). The runner pads each step to a CUDA-graph capture size. There is no continuous batching: a new
wave starts only when the last one is done, which keeps the engine small and makes a wave's decode batch
exactly its unfinished sequences (and, for one step, those that have just stopped).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from reference import parallel
from reference.config import CompilationConfig, echo
from reference.engine import arguments
from reference.engine.requests import Request, RequestBuilder, RequestOutput
from reference.engine.memory_check import check_memory_before_build
from reference.engine.runner import ModelRunner, StartupStats
from reference.engine.sampling import SamplingParams, sample
from reference.models import registry
from reference.ops import CustomOpSelection
from reference.ops.attention_metadata import int_lists_to_device


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
            the capture sizes are :func:`~reference.engine.arguments.engine_capture_sizes`: every size of
            vLLM's list up to ``max_num_seqs`` (decode), then 8, 16, 24, 32, 48, 64, 96, ... up to
            ``min(max_num_batched_tokens, 512)`` (prefill; above 16 tokens a step pads to less than 1.5x);
            larger steps run compiled without graphs. A ``CompilationConfig`` object is used exactly as
            built.
        enforce_eager: apply :meth:`CompilationConfig.for_eager` (level 0, no CUDA graphs).
        dtype: ``'auto'`` (the checkpoint config's dtype if it is one of the others, else bfloat16 on CUDA
            and float32 on CPU), ``'float32'``, ``'bfloat16'`` or ``'float16'``.
        max_model_len: tokens per sequence (prompt + generated); default
            ``min(max_position_embeddings, 2048)``; at most ``max_position_embeddings``.
        max_num_seqs: sequences per wave (KV-cache rows), >= 1.
        max_num_batched_tokens: most tokens per step; prefills with more prompt tokens are chunked.
            Default ``max_num_seqs * max_model_len`` (a wave always prefills in one step); at least
            ``max_num_seqs`` and at most ``max_num_seqs * max_model_len``.
        device: ``'cuda'`` if available, else ``'cpu'``.
        seed: seed of the weights (presets are randomly initialised) and of the per-request generators of
            requests without their own ``seed``.
        tokenizer: path of a transformers tokenizer; default: the model directory's, if it has one.
        skip_tokenizer_init: load no tokenizer (vLLM's flag): prompts must be token ids, outputs carry no
            text, and EOS comes from the model config alone. The benchmark sets it: it never needs one.
        share_weights_with: another ``LLM`` of the same model whose weight tensors this one uses (one set
            of weights for several compilation modes in one process).
        tensor_parallel_size: processes the model is sharded over (Megatron-style: column-parallel qkv and
            gate/up, row-parallel o and down projections each followed by an all-reduce, vocabulary-
            parallel embedding and LM head, the KV cache split by KV heads). Above 1 the script runs once
            per device under ``torchrun --nproc-per-node N`` (NCCL on CUDA, each rank on
            ``cuda:LOCAL_RANK``; gloo on the CPU), and every rank returns the same outputs.
        use_tqdm: show start-up progress.
        compile_fn: ``(model, config) -> forward`` compiling the model instead of the project's pipeline
            (``ModelRunner``'s argument), e.g. :func:`reference.peers.compile_torch_native`; the engine,
            runner and KV cache stay the project's.

    Attributes:
        config: the resolved compilation config. runner: the :class:`ModelRunner`.
        startup: its :class:`StartupStats`. load_s: weight loading time, s.
        custom_ops: ``{'enabled': [...], 'disabled': [...]}`` custom op names.

    Raises:
        ValueError: an argument is out of range (the message names it); ``tensor_parallel_size`` does not
            divide the heads, KV heads, MLP width or vocabulary, differs from torchrun's ``WORLD_SIZE``, or
            exceeds the CUDA devices.
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
        skip_tokenizer_init: bool = False,
        share_weights_with: "LLM | None" = None,
        use_tqdm: bool = True,
        tensor_parallel_size: int = 1,
        compile_fn: Callable[[nn.Module, CompilationConfig], Callable] | None = None,
    ):
        arguments.check_positive("max_num_seqs", max_num_seqs)
        arguments.check_seed(seed)
        for name, flag in (("enforce_eager", enforce_eager), ("skip_tokenizer_init", skip_tokenizer_init)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected a bool, got {echo(flag)}")
        if skip_tokenizer_init and tokenizer is not None:
            raise ValueError("tokenizer and skip_tokenizer_init=True contradict: give one")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a preset name or a checkpoint directory (a string), got {echo(model)}")
        self.model_name = model
        device = arguments.resolve_device(device)
        self.hf_config = registry.model_config(model)
        text_config = self.hf_config.get_text_config()  # the language model's (multimodal configs nest it)
        registry.check_tensor_parallel(text_config, tensor_parallel_size)
        self.vocab_size = text_config.vocab_size
        configured_dtype = getattr(text_config, "dtype", None) or self.hf_config.dtype
        self.dtype = arguments.resolve_dtype(dtype, configured_dtype, device)
        self.max_model_len = arguments.resolve_max_model_len(max_model_len, text_config.max_position_embeddings)
        if max_num_batched_tokens is not None:
            arguments.check_positive("max_num_batched_tokens", max_num_batched_tokens)
            if max_num_batched_tokens < max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                    "a decode step feeds one token per sequence"
                )
        self.config = arguments.engine_config(
            compilation_config,
            enforce_eager=enforce_eager,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens or max_num_seqs * self.max_model_len,
        )
        # the last check: joining the group waits for the other ranks
        self.tensor_parallel, self.device = parallel.init_tensor_parallel(tensor_parallel_size, device)
        self.tokenizer = None if skip_tokenizer_init else arguments.load_tokenizer(model, tokenizer)
        self.seed = seed
        self.requests = RequestBuilder(
            model,
            self.vocab_size,
            self.max_model_len,
            self.tokenizer,
            arguments.eos_token_ids(self.hf_config, self.tokenizer),
            seed,
            self.device,
        )

        ops = CustomOpSelection(self.config)  # checks the custom-op names before anything is loaded
        check_memory_before_build(
            model,
            ops,
            dtype=self.dtype,
            device=self.device,
            max_num_seqs=max_num_seqs,
            max_model_len=self.max_model_len,
            max_num_tokens=max_num_batched_tokens or max_num_seqs * self.max_model_len,
            tensor_parallel=self.tensor_parallel,
            weights_in_memory=share_weights_with is not None,
        )
        # closed on an error too, so that an error message does not run on after the bar
        bar_format = "{desc} [{elapsed}]"  # stages take seconds to minutes each: elapsed time, no rate
        quiet = True if not use_tqdm else None  # None: shown on a terminal only, not in logs
        with tqdm(total=2, desc=f"{model}: load weights", disable=quiet, bar_format=bar_format) as stages:

            def report(stage: str) -> None:
                stages.update()
                stages.set_description_str(f"{model}: {stage}")

            start = time.perf_counter()
            self.model = registry.build_model(
                model,
                ops,
                dtype=self.dtype,
                device=self.device,
                seed=seed,
                share_weights_with=None if share_weights_with is None else share_weights_with.model,
                tensor_parallel=self.tensor_parallel,
            )
            self.load_s = time.perf_counter() - start
            self.custom_ops = ops.summary()
            self.runner = ModelRunner(
                self.model,
                self.config,
                max_num_seqs=max_num_seqs,
                max_model_len=self.max_model_len,
                max_num_batched_tokens=max_num_batched_tokens,
                compile_fn=compile_fn,
            )
            if self.runner.use_cuda_graphs:
                stages.total += len(self.runner.piecewise_warm_up_sizes) + len(self.runner.full_sizes)
            self.startup: StartupStats = self.runner.warm_up(progress=report)
            report("ready")

    @property
    def max_num_seqs(self) -> int:
        return self.runner.max_num_seqs

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a sequence unless ``ignore_eos`` (the model config's and the tokenizer's)."""
        return self.requests.eos_token_ids

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
        requests = self.requests.make(prompts, sampling_params)
        bar = tqdm(total=len(requests), desc="Processed prompts", disable=True if not use_tqdm else None)
        with torch.inference_mode():
            for start in range(0, len(requests), self.max_num_seqs):
                wave = requests[start : start + self.max_num_seqs]
                for row, request in enumerate(wave):
                    request.row = row
                self._prefill(wave)
                self._decode(wave)
                bar.update(len(wave))
        bar.close()
        return [self.requests.output(r) for r in requests]

    def _prefill(self, wave: list[Request]) -> None:
        """Put every prompt of the wave into the KV cache, at most ``max_num_batched_tokens`` per step,
        and sample each sequence's first token after its last prompt chunk."""
        budget = self.runner.max_num_tokens
        pending = list(wave)
        while pending:
            chunks: list[tuple[Request, int, int]] = []  # (request, start, length)
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
            last_chunks = [i for i, (r, _, _) in enumerate(chunks) if r.num_cached == len(r.prompt_token_ids)]
            if last_chunks:  # the wave's first tokens: the host waits for them once
                done = [chunks[i][0] for i in last_chunks]
                self._append(done, self._sample(done, logits[last_chunks], [0] * len(done)).tolist())
            pending = [r for r in pending if r.num_cached < len(r.prompt_token_ids)]

    def _decode(self, wave: list[Request]) -> None:
        """One token per unfinished sequence per step until all have finished, never waiting for a step's
        tokens before issuing the next.

        Step n feeds the tokens step n-1 sampled straight from the device (the runner copies them into
        its input buffer there), and the host reads step n-1's tokens (one non-blocking copy to pinned
        memory) only once step n is queued. Stop tokens and EOS are therefore seen one step late: a
        sequence that ended at step n-1 has run in step n too, and that token is dropped. ``max_tokens``
        is known ahead and costs no extra step.

        The price: a wave whose last sequences end on a stop token or EOS runs one step with nothing left
        to generate (on a GPU one step's device time, against the host time saved on every step; vLLM's
        asynchronous scheduling makes the same trade). On a CPU nothing overlaps and the extra steps are
        pure cost; the loop is the same there anyway, so that the CPU suite checks the loop GPUs run.
        """
        live = [r for r in wave if r.finish_reason is None]
        tokens: list[list[int]] | torch.Tensor = [[r.output[-1]] for r in live]  # the prefill's, on the host
        counts = [len(r.output) for r in live]  # tokens generated per sequence, read or still in flight
        in_flight = None  # (requests, host copy of their sampled tokens [B], event after the copy)
        while live:
            context = [len(r.prompt_token_ids) + c - 1 for r, c in zip(live, counts)]  # the fed token is cached
            logits = self.runner.step(tokens, context, [r.row for r in live])  # [B, V]
            sampled = self._sample(live, logits, counts)  # [B] int64 on the device
            step = (live, *_copy_to_host(sampled))
            if in_flight is not None:
                self._read(*in_flight)  # the previous step's tokens, while this step runs
            in_flight = step
            counts = [c + 1 for c in counts]
            keep = [i for i, r in enumerate(live) if r.finish_reason is None and counts[i] < r.params.max_tokens]
            live, counts = [live[i] for i in keep], [counts[i] for i in keep]
            tokens = _survivors(sampled, keep)
        if in_flight is not None:
            self._read(*in_flight)

    def _read(self, requests: list[Request], host_tokens: torch.Tensor, copied: "torch.cuda.Event | None") -> None:
        """Wait for a step's sampled tokens to reach the host and append them (:meth:`_append`)."""
        if copied is not None:
            copied.synchronize()
        self._append(requests, host_tokens.tolist())

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

    def _append(self, requests: list[Request], tokens: list[int]) -> None:
        """Append each request's new token and check for the end, in vLLM's order: EOS (unless
        ``ignore_eos``; no stop reason), then ``stop_token_ids`` (the token is the reason), then
        ``max_tokens``. Requests already finished (their token came from the step after their last) are
        left as they are."""
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


def _survivors(sampled: torch.Tensor, keep: list[int]) -> torch.Tensor:
    """``sampled[keep]`` ([len(keep)] int64, the tokens the next step feeds), gathered on the device by a
    staged index; ``sampled`` itself when every sequence goes on."""
    if len(keep) == len(sampled):
        return sampled
    return sampled[int_lists_to_device([keep], sampled.device)[0]]


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
