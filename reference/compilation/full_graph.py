"""Full CUDA graphs: the whole forward of a uniform decode step, attention included, as one graph.

A piecewise step replays one graph per piece and runs attention eagerly between them, because attention
reads per-step metadata (each sequence's length and cache row) that a graph would freeze at its capture
values. A full graph captures attention too. That is correct only if attention reads that metadata from
*static device buffers* which the runner rewrites in place before every replay (see
``ModelRunner``), and only for steps whose shape the captured kernels assume: here uniform decode, one new
token per sequence, padded to a capture size. Which steps qualify is the runner's dispatch; this wrapper
only keeps one graph per :class:`~reference.forward_context.BatchDescriptor` and replays it when the
forward context says ``cudagraph_runtime_mode='FULL'``.

Inner graphs (piecewise pieces, breakable segments) run their code directly while a full-graph step warms
up or is captured, so the full graph records their kernels rather than nested replays. Full graphs use a
memory pool of their own; like piecewise graphs their outputs are valid until the next replay.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
from torch.utils._pytree import tree_map

from reference.compilation.counters import compilation_counter
from reference.compilation.cuda_graph import (
    CapturedGraph,
    WarmUpCount,
    addresses_of,
    capture_graph,
    check_addresses,
    inside_full_graph,
    non_owning,
)
from reference.forward_context import BatchDescriptor, current_forward_context


class FullCUDAGraphs:
    """Callable with the model's forward signature; replays one full graph per batch descriptor.

    Args:
        forward: the model's forward (the split module, a whole compiled graph, or the eager model).
        num_warmups: plain runs of a descriptor before it is captured (lazy initialisation, Triton JIT).
        debug_addresses: on every replay check that the inputs live where they did at capture.
        stale_outputs: the model's :class:`~reference.compilation.stale_outputs.StaleOutputGuard` with
            ``debug_cudagraph_outputs``, else None.

    Outside a runner step, or when the step's ``cudagraph_runtime_mode`` is not ``'FULL'``, or on a CPU, it
    calls ``forward`` unchanged.
    """

    def __init__(self, forward: Callable, num_warmups: int, debug_addresses: bool, stale_outputs=None):
        self.forward = forward
        self.debug_addresses = debug_addresses
        self.stale_outputs = stale_outputs
        self.captured: dict[BatchDescriptor, CapturedGraph] = {}
        self.warm_ups = WarmUpCount(num_warmups)
        self._pool = None
        self._stream: "torch.cuda.Stream | None" = None

    def __call__(self, *args):
        ctx = current_forward_context()
        if ctx is None or ctx.cudagraph_runtime_mode != "FULL" or not args[0].is_cuda:
            return self.forward(*args)
        key = ctx.batch_descriptor
        captured = self.captured.get(key)
        if captured is not None:
            if self.debug_addresses:
                check_addresses(f"the full graph for {key}", captured.input_addresses, args)
            captured.graph.replay()
            compilation_counter.num_full_cudagraph_replays += 1
            if self.stale_outputs is not None:
                return self.stale_outputs.hand_out(captured.output, f"the full graph at size {key.num_tokens}")
            return captured.output
        with inside_full_graph():
            if not self.warm_ups.capture_due(key):
                compilation_counter.num_cudagraph_eager_runs += 1
                return self.forward(*args)
            return self._capture(key, args)

    def _capture(self, key: BatchDescriptor, args) -> Any:
        if self._pool is None:
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        graph, output = capture_graph(self.forward, args, self._pool, self._stream)
        self.captured[key] = CapturedGraph(graph, tree_map(non_owning, output), addresses_of(args))
        compilation_counter.num_full_cudagraph_captured += 1
        return output
