"""Offline generation with vLLM's interface: ``LLM(model).generate(prompts, SamplingParams(...))``.

``LLM`` builds the model, compiles it and captures its graphs (:class:`~reference.engine.runner.ModelRunner`);
``generate`` hands the prompts to its :class:`~reference.engine.llm_engine.LLMEngine`, which batches them
continuously (a request starts as soon as a KV-cache row is free, prefills and decodes share steps), and
steps it until every request has finished.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import nn
from tqdm.auto import tqdm

from reference import parallel
from reference.compilation import key_prefetch
from reference.config import CompilationConfig, echo
from reference.engine import arguments
from reference.engine.llm_engine import LLMEngine
from reference.engine.memory_check import check_memory_before_build
from reference.engine.requests import RequestBuilder, RequestOutput
from reference.engine.runner import ModelRunner, StartupStats
from reference.engine.sampling import SamplingParams
from reference.engine.scheduler import check_scheduling
from reference.models import registry
from reference.ops import CustomOpSelection, dependent_launch


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
            ``min(max_position_embeddings, 2048)``; at least 2 and at most ``max_position_embeddings``.
        max_num_seqs: sequences running at once (KV-cache rows), >= 1.
        max_num_batched_tokens: most tokens per step (decodes first, prompt chunks in the rest). Default
            ``max_num_seqs * max_model_len``; at least ``max_num_seqs`` and at most
            ``max_num_seqs * max_model_len``.
        enable_chunked_prefill: cut prompts into chunks that fit what a step has left (vLLM's default);
            False admits a prompt only when all of it fits one step, and refuses a longer one.
        scheduling: ``'continuous'`` (default) or ``'static'``: requests in batches of up to
            ``max_num_seqs``, the next batch admitted when the last has finished (a baseline).
        scheduling_policy: which waiting request goes first (vLLM's field): ``'fcfs'`` (default), arrival
            order; ``'priority'``, the lowest ``generate(priority=...)`` value first, ties in arrival order.
            No running request is preempted for a later one (:mod:`reference.engine.scheduler`).
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
        reference.config.ConfigError: the compilation config is invalid or contradicts ``enforce_eager``, or
            ``$REFERENCE_PDL`` is neither ``0`` nor ``1``.
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
        enable_chunked_prefill: bool = True,
        scheduling: str = "continuous",
        scheduling_policy: str = "fcfs",
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
        flags = {"enforce_eager": enforce_eager, "skip_tokenizer_init": skip_tokenizer_init}
        for name, flag in {**flags, "enable_chunked_prefill": enable_chunked_prefill}.items():
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: expected a bool, got {echo(flag)}")
        check_scheduling(scheduling, scheduling_policy)
        if skip_tokenizer_init and tokenizer is not None:
            raise ValueError("tokenizer and skip_tokenizer_init=True contradict: give one")
        if not isinstance(model, str) or not model:
            raise ValueError(f"model: expected a preset name or a checkpoint directory (a string), got {echo(model)}")
        self.model_name = model
        device = arguments.resolve_device(device)
        # the language model's config: a multimodal one's text_config, which takes the outer dtype if it has none
        self.hf_config = registry.model_config(model)
        registry.check_tensor_parallel(self.hf_config, tensor_parallel_size)
        self.vocab_size = self.hf_config.vocab_size
        self.dtype = arguments.resolve_dtype(dtype, self.hf_config.dtype, device)
        self.max_model_len = arguments.resolve_max_model_len(max_model_len, self.hf_config.max_position_embeddings)
        if max_num_batched_tokens is not None:
            arguments.check_positive("max_num_batched_tokens", max_num_batched_tokens)
            if max_num_batched_tokens < max_num_seqs:
                raise ValueError(
                    f"max_num_batched_tokens ({max_num_batched_tokens}) must be >= max_num_seqs ({max_num_seqs}): "
                    "a decode step feeds one token per sequence"
                )
            if max_num_batched_tokens > max_num_seqs * self.max_model_len:
                raise ValueError(
                    f"max_num_batched_tokens ({max_num_batched_tokens}) exceeds max_num_seqs x max_model_len "
                    f"({max_num_seqs} x {self.max_model_len} = {max_num_seqs * self.max_model_len}): no step can hold "
                    "more tokens than the KV cache; lower it or raise the others"
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
            max_prompt_len=None if enable_chunked_prefill else max_num_batched_tokens,
        )

        ops = CustomOpSelection(self.config)  # checks the custom-op names before anything is loaded
        dependent_launch.switched_on()  # and $REFERENCE_PDL
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
        key_prefetch.start(self.device)  # Triton's hash, computed while the weights load
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
        self.llm_engine = LLMEngine(
            self.runner,
            self.requests,
            enable_chunked_prefill=enable_chunked_prefill,
            scheduling=scheduling,
            scheduling_policy=scheduling_policy,
        )

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
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Generate a completion for every prompt.

        Args:
            prompts: a string (or vLLM's ``{'prompt': 'text'}``), a token-id prompt (``[[1, 2, 3]]`` or
                ``{'prompt_token_ids': [1, 2, 3]}``; ids as a list, tensor or numpy array), or a list of them (or
                a 2-d tensor or array). Strings need a tokenizer. A flat list of ints is refused as ambiguous.
            sampling_params: one for all prompts, one per prompt, or None for ``SamplingParams()``.
            use_tqdm: show a progress bar over finished prompts.
            priority: one int per prompt (a list, tuple or array of integers), lower served first (vLLM's
                argument); values other than 0 only with ``scheduling_policy='priority'``. None: 0 for every
                prompt, which is arrival order.

        Returns:
            One :class:`RequestOutput` per prompt, in prompt order.

        Raises:
            ValueError: a prompt is empty, not tokens or text, has a token outside the vocabulary, or with
                ``max_tokens`` does not fit ``max_model_len``; string prompts without a tokenizer; a stop
                token outside the vocabulary; the number of sampling params differs from the prompts'; a
                prompt longer than ``max_num_batched_tokens`` without chunked prefill; ``min_tokens`` with
                EOS and stop tokens that cover the whole vocabulary; ``llm_engine`` holding requests of its own;
                a ``priority`` other than 0 under ``scheduling_policy='fcfs'`` (vLLM's rule), or not one int
                per prompt.
            Anything raised inside a step (an interrupt included): the call's requests are aborted first,
            so the next call starts from an empty engine.
        """
        if self.llm_engine.has_unfinished_requests():
            raise ValueError(
                "generate: llm_engine holds unfinished requests added with llm_engine.add_requests, whose outputs "
                "generate would drop; step them to the end (llm_engine.step() while "
                "llm_engine.has_unfinished_requests()) or abort them (llm_engine.abort_requests(ids)) first"
            )
        ids = self.llm_engine.add_requests(prompts, sampling_params, priority)
        done: dict[str, RequestOutput] = {}
        try:
            with tqdm(total=len(ids), desc="Processed prompts", disable=True if not use_tqdm else None) as bar:
                while self.llm_engine.has_unfinished_requests():
                    for output in self.llm_engine.step():
                        done[output.request_id] = output
                        bar.update()
        except BaseException:  # an interrupt between steps too: the next call starts from an empty engine
            self.llm_engine.abort_requests(ids)
            raise
        return [done[i] for i in ids]
