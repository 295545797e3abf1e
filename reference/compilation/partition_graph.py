"""Per-size CUDA graphs around Inductor's own partitions (``use_inductor_graph_partition``).

With ``torch._inductor.config.graph_partition`` Inductor compiles the whole traced graph and cuts its generated
code at the ops that must not be captured (the ops tagged ``cudagraph_unsafe``, and those named in
``custom_should_partition_ops``): each stretch between them becomes a *partition*, a function that takes one
list of inputs, empties it (so that the inputs can be freed as soon as possible) and returns its outputs; the
cut ops run between them, in Inductor's own code. torch lets a caller wrap every partition as it is
installed (``torch._inductor.utils.set_customized_partition_wrappers``, marked unstable in torch 2.9-2.13),
which is where vLLM's ``use_inductor_graph_partition`` puts its CUDA-graph wrapper, and where this module's
:class:`PartitionGraph` goes.

A partition does not take the token count as an argument of known position (a piece of the FX split does),
so the size comes from the step: the runner's forward context says which graphs the step replays
(``cudagraph_runtime_mode``) and its padded token count (``batch_descriptor``), as vLLM's wrapper reads them.
Outside a runner step (a compiled model called directly), and in steps the runner sends to a full graph or to
no graph, a partition runs as compiled. Capture and memory follow :mod:`reference.compilation.cuda_graph`:
one pool for every partition and size, non-owning views of the outputs, inputs at the addresses they had at
capture (pool memory or the runner's static buffers).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_map

from reference.compilation.counters import compilation_counter
from reference.compilation.cuda_graph import (
    CapturedGraph,
    WarmUpCount,
    addresses_of,
    capture_graph,
    check_addresses,
    in_full_graph,
    non_owning,
)
from reference.forward_context import current_forward_context


class PartitionGraph:
    """Callable Inductor installs in place of one of its partitions: replays a CUDA graph of it per capture size.

    Args:
        runnable: the partition (called with one list of inputs, which it empties).
        index: the partition's place among the graph's capturable partitions (for messages).
        capture_sizes: token counts to capture.
        num_warmups: plain runs at a size before it is captured.
        pool, stream: the memory pool every partition and size shares, and the side stream captures run on.
        debug_addresses: check input addresses on every replay.
        stale_outputs: with ``debug_cudagraph_outputs``, the model's
            :class:`~reference.compilation.stale_outputs.StaleOutputGuard`; else None.
    """

    def __init__(
        self,
        runnable: Callable[[list], Any],
        index: int,
        capture_sizes: tuple[int, ...],
        num_warmups: int,
        pool,
        stream: "torch.cuda.Stream",
        debug_addresses: bool,
        stale_outputs=None,
    ):
        self.runnable, self.index = runnable, index
        self.capture_sizes = frozenset(capture_sizes)
        self.pool, self.stream = pool, stream
        self.debug_addresses, self.stale_outputs = debug_addresses, stale_outputs
        self.captured: dict[int, CapturedGraph] = {}
        self.warm_ups = WarmUpCount(num_warmups)

    def __call__(self, args: list) -> Any:
        context = current_forward_context()
        if in_full_graph() or context is None or context.cudagraph_runtime_mode != "PIECEWISE":
            return self.runnable(args)
        size = context.batch_descriptor.num_tokens  # the step's padded token count
        captured = self.captured.get(size)
        if captured is not None:
            return self._replay(captured, size, args)
        if size not in self.capture_sizes or not self.warm_ups.capture_due(size):
            compilation_counter.num_cudagraph_eager_runs += 1
            return self.runnable(args)
        inputs = list(args)  # the partition empties the list it is given; the addresses are kept from this copy
        graph, output = capture_graph(self.runnable, (args,), self.pool, self.stream)
        self.captured[size] = CapturedGraph(graph, tree_map(non_owning, output), addresses_of(inputs))
        compilation_counter.num_cudagraph_captured += 1
        return output

    def _replay(self, captured: CapturedGraph, size: int, args: list) -> Any:
        if self.debug_addresses:
            check_addresses(f"partition {self.index} at size {size}", captured.input_addresses, args)
        args.clear()  # as the partition itself does: the caller's list holds no input past the call
        captured.graph.replay()
        compilation_counter.num_cudagraph_replays += 1
        if self.stale_outputs is None:
            return captured.output
        return self.stale_outputs.hand_out(captured.output, f"partition {self.index} at size {size}")


@contextlib.contextmanager
def partition_wrappers(wrap: Callable[[Callable, int], Callable] | None) -> Iterator[None]:
    """While the block runs, Inductor installs ``wrap(partition, index)`` in place of each partition of a graph
    it compiles or loads with ``graph_partition`` (``None``: installs the partitions as they are). torch keeps
    the wrapper in one process-wide slot; what it held before is put back after the block, so no other compile
    of ours is wrapped and a wrapper someone else set is kept. With a wrapper, Inductor's ``graph_partition``
    is on for the block: a loaded artifact's partitions are wrapped only if it is on at load time (torch reads
    the setting then, not the one the artifact was compiled with)."""
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import _unstable_customized_partition_wrapper, set_customized_partition_wrappers

    before = _unstable_customized_partition_wrapper.wrapper
    set_customized_partition_wrappers(None if wrap is None else lambda fn, meta: wrap(fn, meta.partition_index))
    try:
        with contextlib.nullcontext() if wrap is None else inductor_config.patch(graph_partition=True):
            yield
    finally:
        set_customized_partition_wrappers(before)
