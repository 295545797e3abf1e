"""Run a model one step at a time: static inputs, padding to capture sizes, KV cache, forward context.

The runner is the only caller of the compiled model, and it keeps the promises CUDA-graph replay needs:

* Model inputs (``input_ids``, ``positions``) are slices of buffers allocated once, so their addresses
  never change between capture and replay.
* Dispatch (vLLM's ``CudagraphDispatcher``): a uniform decode step (one new token per sequence) of at
  most the largest full size replays a full graph (``cudagraph_mode`` ``'full_decode_only'`` or
  ``'full_and_piecewise'``); with ``'full'`` every step of at most the largest capture size does, one
  graph per size whatever the step's kind; other steps of at most the largest capture size replay
  piecewise graphs (``'piecewise'``, ``'full_and_piecewise'``); the rest run without graphs. A full mode
  the attention cannot serve on this device and dtype is lowered first, with one warning line. The
  forward context carries the choice (``cudagraph_runtime_mode``) and the full graph's key
  (``batch_descriptor``); ``last_dispatch`` and ``dispatch_counts`` record it per step.
* A step of ``n`` tokens runs at the smallest size ``T >= n`` of its kind (padding rows ``n..T`` hold stale
  but valid token ids and positions); attention ignores padding rows, and only the real rows are read
  back. Steps are padded on a CPU too (where nothing is captured), so every device runs the same shapes
  and a padding fault of the token rows shows on any of them (a fault in a full graph's padded metadata
  shows only on CUDA: the CPU's torch attention reads the real sequences' entries alone).
* A full graph replays attention too, so its metadata cannot be fresh tensors: each sequence's length and
  cache row are copied into one static buffer, padded with length 0 (attention skips such rows), before
  every full-graph step; under ``'full'``, each token's cache slot and each sequence's query offsets too
  (:class:`~reference.ops.attention_metadata.GraphTables`).
* The model's output aliases graph memory; ``step`` computes the logits from it (a fresh tensor) before
  the next step can overwrite it, after gathering each sequence's last row when a sequence has several
  new tokens (a decode step's rows are all last rows and are read in place).
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses
import itertools
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn

from reference.compilation import compilation_counter, compile_model, cuda_graph, key_prefetch
from reference.compilation.backend import PiecewiseBackend
from reference.config import CompilationConfig
from reference.engine import kernel_warm_up
from reference.engine.arguments import check_within_positions
from reference.engine.graph_plan import plan_graphs
from reference.engine.kernel_warm_up import KernelWarmUp
from reference.engine.kv_cache import allocate_kv_caches, check_fits, kv_cache_bytes
from reference.engine.step_inputs import check_device_tokens, check_host_tokens
from reference.forward_context import BatchDescriptor, ForwardContext, set_forward_context
from reference.ops import Attention, AttentionMetadata, dependent_launch
from reference.ops.attention_metadata import GraphTables, int_lists_to_device


@dataclass
class StartupStats:
    """What it cost to get the model ready.

    Attributes:
        compile_s: first forward call (Dynamo trace, splitting, piece compilation), seconds.
        capture_s: warm-up runs and CUDA-graph capture of every capture size, seconds.
        graph_gib: device memory taken by graph capture, piecewise and full (free memory before minus
            after), GiB.
        capture_sizes: the piecewise sizes captured, largest first.
        full_capture_sizes: the full-graph (decode) sizes captured, largest first.
        compile_cache_hits: entries the project's compile cache served during the compile (0: compiled cold,
            or the cache is off), so a ``compile_s`` read from the cache is not taken for a compile.
        kernel_warm_up_s: seconds the kernel warm-up's eager step took on its thread, inside ``compile_s``
            (:mod:`.kernel_warm_up`; 0.0 where none ran: a CPU, level 0 or 1, Inductor, a compile-cache hit,
            another implementation's model).
        kernel_warm_up_wait_s: seconds the compile waited for that step after the trace (the part not hidden).
        kernel_compile_s: seconds of that step's first pass, which compiles and readies its kernels on a pool of threads
            without launching them, inside ``kernel_warm_up_s`` (0.0 where it did not run).
    """

    compile_s: float = 0.0
    capture_s: float = 0.0
    graph_gib: float = 0.0
    capture_sizes: tuple[int, ...] = ()
    full_capture_sizes: tuple[int, ...] = ()
    compile_cache_hits: int = 0
    kernel_warm_up_s: float = 0.0
    kernel_warm_up_wait_s: float = 0.0
    kernel_compile_s: float = 0.0


@dataclass(frozen=True)
class StepDispatch:
    """Which graphs one step was sent to.

    Attributes:
        num_tokens: the step's real tokens.
        runtime_mode: ``'FULL'``, ``'PIECEWISE'`` or ``'NONE'`` (dispatched, on a CPU too, where nothing
            is captured; ``compilation_counter.num_full_cudagraph_replays`` says what replayed).
        descriptor: the padded token count and whether the step is a uniform decode.
    """

    num_tokens: int
    runtime_mode: str
    descriptor: BatchDescriptor


def _input_buffer_len(max_num_tokens: int) -> int:
    """Slots of each int64 input buffer (token ids, positions). The tracing call runs with >= 2 tokens. One
    slot more than any step takes, so no step's inputs are a view as long as its whole buffer: Dynamo gives
    equal sizes one symbol (duck sizing), and an implementation that keeps Dynamo's guards (torch-native)
    would otherwise guard the view's size against its base's and recompile at the first shorter step."""
    return max(max_num_tokens, 2) + 1


def memory_needed(model: nn.Module, max_num_seqs: int, max_model_len: int, max_num_tokens: int) -> int:
    """Bytes a :class:`ModelRunner` of ``model`` allocates up front: every attention layer's KV cache in the
    model's dtype plus the two int64 input buffers. ``model`` may be on the meta device (shapes only), so
    this can be checked before any weight exists."""
    layers = [m for m in model.modules() if isinstance(m, Attention)]
    dtype = next(model.parameters()).dtype
    return kv_cache_bytes(layers, max_num_seqs, max_model_len, dtype) + 2 * _input_buffer_len(max_num_tokens) * 8


class ModelRunner:
    """Owns a model's compiled forward, its KV cache and its static input buffers.

    Args:
        model: has a transformers ``config`` (for ``vocab_size``),
            ``forward(input_ids [T] int64, positions [T] int64) -> [T, H]`` and
            ``compute_logits(hidden [N, H]) -> [N, V]``; its :class:`~reference.ops.Attention` layers get
            a KV cache each.
        config: compilation settings (already resolved; apply ``enforce_eager`` before).
        max_num_seqs: KV-cache rows (sequences in flight at once).
        max_model_len: tokens per sequence (prompt + generated) the cache holds.
        max_num_batched_tokens: most tokens in one step (buffers are this long); default
            ``max_num_seqs * max_model_len``. Capture sizes above it are not captured.
        compile_fn: ``(model, config) -> callable`` with ``model.forward``'s signature, the compiled
            model the runner calls; default the reference's :func:`~reference.compilation.compile_model`
            (the conformance suite passes other implementations' here). A callable with an
            ``awaits_trace`` attribute (True until its first call) gets a first call of at least 2 tokens.

    Attributes:
        capture_sizes: the piecewise sizes (capture sizes up to ``max_num_batched_tokens``).
        full_sizes: the full-graph sizes: capture sizes up to ``max_num_seqs`` (a decode step's tokens), or
            under ``'full'`` up to ``max_num_batched_tokens``.
        piecewise_warm_up_sizes: the piecewise sizes ``warm_up`` captures (size 1 is left out when full
            graphs serve it: a 1-token step is always a uniform decode).
        last_dispatch: the last step's :class:`StepDispatch` (None before the first); ``dispatch_counts``: steps
            per runtime mode, the warm-up's dummy steps included.

    Raises:
        ValueError: a size is not positive, ``max_model_len`` exceeds the model's
            ``max_position_embeddings``, ``max_num_batched_tokens`` exceeds ``max_num_seqs x
            max_model_len``, or the KV cache and input buffers exceed the device's free memory (the
            machine's physical memory on a CPU).
        ConfigError: ``$REFERENCE_PDL`` neither ``0`` nor ``1`` (:mod:`reference.ops.dependent_launch`),
            no capture size fits the steps (piecewise and ``'full'``: at most
            ``max_num_batched_tokens``; full decode graphs: at most ``max_num_seqs``), or a compile size no
            step runs at.

    Warns:
        RuntimeWarning: a full ``cudagraph_mode`` lowered to what the attention serves on this device and
            dtype (CUDA in float64: the torch path, which reads host lengths a graph would freeze), or
            capture or compile sizes above ``max_num_batched_tokens``.
    """

    def __init__(
        self,
        model: nn.Module,
        config: CompilationConfig,
        *,
        max_num_seqs: int,
        max_model_len: int,
        max_num_batched_tokens: int | None = None,
        compile_fn: Callable[[nn.Module, CompilationConfig], Callable] | None = None,
    ):
        for name, value in (("max_num_seqs", max_num_seqs), ("max_model_len", max_model_len)):
            if value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value}")
        positions = getattr(model.config, "max_position_embeddings", None)
        if positions is not None:  # the warm-up alone would index past the rotary table
            check_within_positions(max_model_len, positions)
        cache_tokens = max_num_seqs * max_model_len
        if max_num_batched_tokens is not None and max_num_batched_tokens > cache_tokens:
            raise ValueError(
                f"max_num_batched_tokens ({max_num_batched_tokens}) exceeds max_num_seqs x max_model_len "
                f"({max_num_seqs} x {max_model_len} = {cache_tokens}): no step can hold more tokens than the KV cache; "
                "lower it or raise the others"
            )
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        dependent_launch.switched_on()  # a bad $REFERENCE_PDL is one line here, not at a launch
        self.model = model
        self.vocab_size = model.config.vocab_size
        self.max_num_seqs, self.max_model_len = max_num_seqs, max_model_len
        self.max_num_tokens = max_num_batched_tokens or max_num_seqs * max_model_len
        plan = plan_graphs(config, self.device, self.dtype, max_num_seqs, self.max_num_tokens)
        config = self.config = plan.config
        self.capture_sizes, self.full_sizes = plan.capture_sizes, plan.full_sizes
        self.piecewise_warm_up_sizes = plan.piecewise_warm_up_sizes
        if compile_fn is None:  # the reference; inputs are our own static buffers, so no per-call check
            self.compiled = compile_model(model, config, check_inputs=False)
        else:
            self.compiled = compile_fn(model, config)
        self.attention_layers = {m.layer_name: m for m in model.modules() if isinstance(m, Attention)}
        buffer_len = _input_buffer_len(self.max_num_tokens)
        check_fits(memory_needed(model, max_num_seqs, max_model_len, self.max_num_tokens), self.device,
                   max_num_seqs, max_model_len)  # fmt: skip
        layers = list(self.attention_layers.values())
        allocate_kv_caches(layers, max_num_seqs, max_model_len, self.dtype, self.device)
        self.input_ids = torch.zeros(buffer_len, dtype=torch.int64, device=self.device)
        self.positions = torch.zeros(buffer_len, dtype=torch.int64, device=self.device)
        self.use_cuda_graphs = config.cudagraph_mode != "none" and self.device.type == "cuda"
        # what full graphs read: of a decode step, lengths (row 0) and cache rows (row 1), padding has length
        # 0; of any step ('full'), the GraphTables of the largest graph, whose views serve every size
        self.full_metadata = self.graph_tables_buffer = None
        if self.full_sizes and config.full_graphs_of_every_step:
            largest = self.full_sizes[-1]
            size = GraphTables.flat_len(largest, self.graph_capacity(largest))
            self.graph_tables_buffer = torch.zeros(size, dtype=torch.int64, device=self.device)
        elif self.full_sizes:
            self.full_metadata = torch.zeros(2, max_num_seqs, dtype=torch.int64, device=self.device)
        self.startup = StartupStats()
        self.last_dispatch: StepDispatch | None = None
        self.dispatch_counts: collections.Counter[str] = collections.Counter()

    def graph_capacity(self, num_tokens: int) -> int:
        """The sequences a full graph of any step at ``num_tokens`` tokens holds: as many as can fit."""
        return min(num_tokens, self.max_num_seqs)

    # ------------------------------------------------------------------ one step
    def padded_size(self, num_tokens: int) -> int:
        """The token count a piecewise step runs at: the smallest capture size >= ``num_tokens``, else itself."""
        i = bisect.bisect_left(self.capture_sizes, num_tokens)
        return self.capture_sizes[i] if i < len(self.capture_sizes) else num_tokens

    def dispatch(self, num_tokens: int, uniform_decode: bool) -> StepDispatch:
        """Which graphs a step of ``num_tokens`` tokens replays, and the size it is padded to (module doc)."""
        every_step = self.config.full_graphs_of_every_step
        if (uniform_decode or every_step) and self.full_sizes and num_tokens <= self.full_sizes[-1]:
            size = self.full_sizes[bisect.bisect_left(self.full_sizes, num_tokens)]
            # 'full': one graph per size serves every kind of step, decodes included (vLLM's FULL)
            return StepDispatch(num_tokens, "FULL", BatchDescriptor(size, uniform_decode and not every_step))
        mode = "PIECEWISE" if self.capture_sizes and num_tokens <= self.capture_sizes[-1] else "NONE"
        return StepDispatch(num_tokens, mode, BatchDescriptor(self.padded_size(num_tokens), uniform_decode))

    @torch.inference_mode()
    def step(
        self,
        new_tokens: list[list[int]] | torch.Tensor,
        context_lens: list[int],
        rows: list[int],
        fed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append the new tokens of sequence ``i`` (cache row ``rows[i]``, ``context_lens[i]`` tokens
        already cached) and return the logits after each sequence's last new token.

        Args:
            new_tokens: host lists, one per sequence, or one per sequence after the first ``len(fed)``;
                or, for a decode step, a [num_seqs] int64 tensor on the model's device (the same as
                ``fed=new_tokens`` with no host lists).
            fed: None, or a [k] int64 tensor on the model's device: one new token for each of the first k
                sequences (decodes fed the previous step's samples; the engine's continuous batching puts
                them before the step's prompt chunks). It is copied on the device and never read by the
                host, so the step does not wait for the work that produces it. On CUDA its ids are not
                range-checked (that would wait for the device; a sampler's are in range, and an id past the
                vocabulary is a device-side assert in the embedding); on a CPU they are.

        Returns:
            [num_seqs, vocab] float32.

        Raises:
            ValueError: more tokens than ``max_num_batched_tokens``, an empty sequence, a sequence past
                ``max_model_len``, a token id outside the vocabulary (host lists, and tensors on a CPU),
                ``context_lens`` or ``new_tokens`` not one per row, rows that repeat or lie outside
                ``0..max_num_seqs - 1``, a token tensor (or ``fed``) that is not [k] int64 on the model's device
                for the k sequences the host lists leave out, or both a token tensor and ``fed``.
        """
        hidden, last_rows = self._run(new_tokens, context_lens, rows, fed)
        return self.model.compute_logits(hidden if last_rows is None else hidden[last_rows])

    @torch.inference_mode()
    def forward(
        self,
        new_tokens: list[list[int]] | torch.Tensor,
        context_lens: list[int],
        rows: list[int],
        fed: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Like :meth:`step` but returns the hidden states of all real tokens, [n, H] (graph memory for
        CUDA-graph sizes: valid until the next call)."""
        return self._run(new_tokens, context_lens, rows, fed)[0]

    def _run(self, new_tokens, context_lens, rows, fed) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Checks, one host-to-device copy of every int the step needs, the compiled forward.

        Returns:
            hidden [n, H] of the real tokens, and [num_seqs] int64 device indices of each sequence's
            last token in it (None for a decode step, where every token is its sequence's last).
        """
        name = "new_tokens"
        if isinstance(new_tokens, torch.Tensor):
            if fed is not None:
                raise ValueError("new_tokens is a token tensor and fed is given: give the device tokens once")
            new_tokens, fed = [], new_tokens
        elif fed is not None:
            name = "fed"
        check_host_tokens(new_tokens, self.vocab_size)
        num_fed = max(len(rows) - len(new_tokens), 0) if fed is not None else 0
        if fed is not None:
            check_device_tokens(fed, num_fed, self.vocab_size, self.device, name)
        ids = [t for seq in new_tokens for t in seq]  # the host's; the fed ids stay on the device
        query_lens = [1] * num_fed + [len(seq) for seq in new_tokens]
        n = sum(query_lens)
        if not 0 < n <= self.max_num_tokens:
            raise ValueError(f"a step takes 1..{self.max_num_tokens} tokens (max_num_batched_tokens), got {n}")
        if len(context_lens) != len(rows) or len(query_lens) != len(rows):
            raise ValueError(
                f"new_tokens ({len(query_lens)}), context_lens ({len(context_lens)}) and rows ({len(rows)}): "
                "expected one entry per sequence in each"
            )
        if len(set(rows)) != len(rows) or not all(0 <= r < self.max_num_seqs for r in rows):
            # checked here: a bad row would index past the KV cache (a device-side assert on CUDA)
            raise ValueError(
                f"rows: expected distinct KV-cache rows in 0..{self.max_num_seqs - 1} (max_num_seqs), got {rows}"
            )
        seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
        positions = [p for c, q in zip(context_lens, query_lens) for p in range(c, c + q)]
        slots = AttentionMetadata.slot_mapping_list(query_lens, seq_lens, rows, self.max_model_len)
        uniform_decode = all(q == 1 for q in query_lens)
        last_rows = [] if uniform_decode else [end - 1 for end in itertools.accumulate(query_lens)]
        dispatch = self.dispatch(n, uniform_decode)
        size = dispatch.descriptor.num_tokens
        full = dispatch.runtime_mode == "FULL"
        tables = []
        if full and not dispatch.descriptor.uniform_decode:  # 'full': the tables of any step, padded
            tables = [GraphTables.host_list(query_lens, seq_lens, rows, slots, size, self.graph_capacity(size))]
        if full and dispatch.descriptor.uniform_decode:  # lengths and rows padded to the graph's size
            padding = [0] * (size - len(rows))
            per_seq = [seq_lens + padding + rows + padding]
        else:
            per_seq = [seq_lens, rows]
        # one pinned staging buffer, one non-blocking copy per step
        staged = int_lists_to_device([slots, *per_seq, ids, positions, last_rows, *tables], self.device)
        slot_mapping, per_seq_tensors = staged[0], staged[1 : 1 + len(per_seq)]
        staged_ids, staged_positions, last_rows_tensor = staged[1 + len(per_seq) : 4 + len(per_seq)]
        graph_tables = None
        if tables:
            graph_tables = self._into_graph_tables(staged[-1], size)
        elif full:
            per_seq_tensors = self._into_static_metadata(per_seq_tensors[0], size)
        metadata = AttentionMetadata.from_device(
            query_lens, seq_lens, rows, slot_mapping, *per_seq_tensors, graph_tables=graph_tables
        )
        if num_fed:
            self.input_ids[:num_fed].copy_(fed)  # device to device
        if num_fed < n:
            self.input_ids[num_fed:n].copy_(staged_ids)
        self.positions[:n].copy_(staged_positions)
        descriptor = dispatch.descriptor
        if getattr(self.compiled, "awaits_trace", False):
            size = max(size, 2)  # the trace fixes a dynamic token dimension only for >= 2 tokens
            descriptor = descriptor._replace(num_tokens=size)  # graphs sized by the step take the call's size
            if full:  # the tracing call compiles; no full graph is kept of it
                dispatch = dataclasses.replace(dispatch, runtime_mode="NONE")
        context = ForwardContext(metadata, self.attention_layers, dispatch.runtime_mode, descriptor)
        with set_forward_context(context):
            hidden = self.compiled(self.input_ids[:size], self.positions[:size])
        self.last_dispatch = dispatch
        self.dispatch_counts[dispatch.runtime_mode] += 1
        return hidden[:n], None if uniform_decode else last_rows_tensor

    def _into_graph_tables(self, staged: torch.Tensor, size: int) -> GraphTables:
        """Copy a step's padded tables (``staged``: the flat list of :meth:`GraphTables.host_list`) into the
        static buffer that the full graph of ``size`` tokens reads; returns the views it reads."""
        self.graph_tables_buffer[: staged.shape[0]].copy_(staged)
        return GraphTables.from_flat(self.graph_tables_buffer, size, self.graph_capacity(size))

    def _into_static_metadata(self, staged: torch.Tensor, size: int) -> list[torch.Tensor]:
        """Copy a full step's padded lengths and rows (``staged``: [2 * size] int64, lengths first) into the
        static buffer a full graph reads; returns the two views ([size] each) the metadata holds."""
        self.full_metadata[:, :size].copy_(staged.view(2, size))
        return [self.full_metadata[0, :size], self.full_metadata[1, :size]]

    # ------------------------------------------------------------------ start-up
    @torch.inference_mode()
    def warm_up(self, progress: Callable[[str], None] | None = None) -> StartupStats:
        """Compile (first call, and a 1-token call where steps may have one token and no capture below
        makes one) and, on CUDA, capture every piecewise size (but 1 when full graphs serve it), then every
        full-graph size, largest first; returns the costs.

        Capturing the largest size first lets smaller sizes reuse its pool memory. On CUDA without Inductor, while
        the reference's backend traces the model, one eager step on a thread compiles the custom ops' Triton
        kernels (:mod:`.kernel_warm_up`); the backend waits for it before any piece runs.

        Warns:
            RuntimeWarning: that step failed where the model's own first step did not.

        Args:
            progress: called with the name of each stage as it starts: ``'compile'``, then
                ``'capture <size>'`` per piecewise size and ``'capture full <size>'`` per full size (for
                progress bars).
        """
        report = progress or (lambda stage: None)
        first = max(self.capture_sizes, default=min(self.max_num_tokens, max(2, self.max_num_seqs)))
        piecewise = self.piecewise_warm_up_sizes
        captures_one_token = self.use_cuda_graphs and (1 in piecewise or 1 in self.full_sizes)
        sees_one_token = 1 in self.capture_sizes or 1 in self.full_sizes or not (self.capture_sizes or self.full_sizes)
        report("compile")
        hits, start = compilation_counter.num_cache_hits, time.perf_counter()
        with self._kernel_warm_up():
            key_prefetch.wait()  # the compilers' installation hashes, begun before the weights loaded
            self._dummy_step(first)  # forward() pads the tracing call to 2 tokens if needed
        if self.config.level > 0 and sees_one_token and not captures_one_token:
            # Dynamo specializes a 1-token call: an implementation that keeps Dynamo's guards (torch-native)
            # compiles a second graph for it, here rather than at the first 1-token step it serves
            self._dummy_step(1)
        self._sync()
        self.startup.compile_s = time.perf_counter() - start
        self.startup.compile_cache_hits = compilation_counter.num_cache_hits - hits
        if self.use_cuda_graphs and (piecewise or self.full_sizes):
            runs = cuda_graph.plain_runs_before_capture(self.config.cudagraph_num_of_warmups) + 1  # then the capture
            free_before = torch.cuda.mem_get_info(self.device)[0]
            start = time.perf_counter()
            for size in sorted(piecewise, reverse=True):
                report(f"capture {size}")
                for _ in range(runs):
                    self._dummy_step(size)
            for size in sorted(self.full_sizes, reverse=True):
                report(f"capture full {size}")
                for _ in range(runs):
                    if self.config.full_graphs_of_every_step:
                        self._dummy_step(size)  # one graph per size serves every kind of step
                    else:
                        self.forward([[0]] * size, [0] * size, list(range(size)))  # a uniform decode step
            self._sync()
            self.startup.capture_s = time.perf_counter() - start
            self.startup.graph_gib = (free_before - torch.cuda.mem_get_info(self.device)[0]) / 2**30
            self.startup.capture_sizes = tuple(sorted(piecewise, reverse=True))
            self.startup.full_capture_sizes = tuple(sorted(self.full_sizes, reverse=True))
        return self.startup

    @contextlib.contextmanager
    def _kernel_warm_up(self) -> Iterator[None]:
        """Around the first call, where the reference's backend traces the model on a device whose custom ops
        compile kernels at their first launch, without Inductor (:func:`.kernel_warm_up.wanted`): those kernels
        compile on a thread meanwhile (:mod:`.kernel_warm_up`), started just before the trace, so not when the
        compile cache serves the start. The backend waits for it before any piece runs; so does the block's end,
        if the trace raised.

        Warns:
            RuntimeWarning: the warm-up's step failed where the model's own first step did not (its kernels then
                compile at their first launch, as without a warm-up).
        """
        backend = getattr(self.compiled, "backend", None)
        if (
            not kernel_warm_up.wanted(self.device, self.config)
            or not isinstance(backend, PiecewiseBackend)
            or not getattr(self.compiled, "awaits_trace", False)
        ):
            yield
            return
        kernels = KernelWarmUp(self.model, self.max_num_seqs, self.max_model_len)
        # a start the compile cache serves never starts it, and kernels.wait() then returns at once
        self.compiled.before_trace, backend.before_first_run = kernels.start, kernels.wait
        try:
            yield
        finally:
            # uncalled after a cache hit (before_trace) or a trace that raised; Dynamo keeps its backends alive
            self.compiled.before_trace = backend.before_first_run = None
            kernels.wait()
        self.startup.kernel_warm_up_s, self.startup.kernel_warm_up_wait_s = kernels.step_s, kernels.waited_s
        self.startup.kernel_compile_s = kernels.compile_s
        if kernels.error is not None:
            error = kernels.error
            warnings.warn(
                f"kernel warm-up: its eager step failed ({type(error).__name__}: {error}) where the model's first step "
                "did not; the kernels it would have compiled compile at their first launch instead",
                RuntimeWarning,
                stacklevel=4,  # warm_up's caller
            )

    def _dummy_step(self, num_tokens: int) -> None:
        """Run ``num_tokens`` dummy tokens, one cache row per ``max_model_len`` of them. Every size the warm-up
        runs is at most ``max_num_tokens``, which the constructor keeps within ``max_num_seqs`` rows."""
        starts = range(0, num_tokens, self.max_model_len)
        chunks = [[0] * min(self.max_model_len, num_tokens - start) for start in starts]
        self.forward(chunks, [0] * len(chunks), list(range(len(chunks))))

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
