"""Per-piece CUDA graphs: warm up, capture once per capture size, then replay.

A piece receives its token count as int arguments (Dynamo passes each symbolic size a piece uses; the
token dimensions of ``input_ids`` and ``positions`` may be two symbols that are equal at run time). For a
size in the capture list the first ``num_warmups`` calls (at least one: :func:`plain_runs_before_capture`) run
the piece normally, the next call captures it and replays it once (capturing records kernels without running
them), and later calls replay. Other sizes, and calls whose size arguments disagree, run the piece without a
graph.

Memory. All pieces and sizes of a model capture into one memory pool. A graph's outputs live in that
pool; we keep only *non-owning* views of them, so once the caller drops the tensors returned at capture
time, their blocks return to the pool and graphs captured later (other pieces, other sizes) reuse them.
The graphs of one size never overwrite each other's live data: while piece k+1 is captured, piece k's
outputs are still held by the caller, so the allocator cannot hand them out. Capturing the largest size
first lets every smaller size fit into blocks the larger one already reserved. The price: the tensors a
replay returns are valid only until the next replay of any size, which the runner respects.

Inputs. A graph reads its inputs from the addresses they had at capture. Model inputs must therefore come
from the runner's static buffers, parameters must not be reassigned, and intermediate inputs (outputs of
earlier pieces, attention's preallocated output) are pool memory. ``debug_cudagraph_addresses`` checks
this on every replay.

Garbage collection. No automatic collection runs while a graph is being captured (:func:`collection_paused`):
a collection finalises dead reference cycles, an earlier model's graph among them, and destroying a graph is
a CUDA call that invalidates a capture under way in torch's default ``'global'`` error mode.
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_map

from reference.compilation.counters import compilation_counter


class _InsideFullGraph:
    """Whether a full-graph step (its warm-up or capture) is running: inner graphs (pieces, breakable
    segments) then run their code directly, so the full graph records kernels, never a nested replay."""

    active = False


@contextlib.contextmanager
def inside_full_graph() -> Iterator[None]:
    """Run the block as part of a full CUDA graph step (see :class:`_InsideFullGraph`)."""
    _InsideFullGraph.active = True
    try:
        yield
    finally:
        _InsideFullGraph.active = False


def in_full_graph() -> bool:
    """True inside :func:`inside_full_graph`."""
    return _InsideFullGraph.active


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Run the block (a capture) with Python's automatic garbage collection off, then restore it as it was.

    Why: a collection calls the finalizers of the dead reference cycles it finds. If one holds a
    ``torch.cuda.CUDAGraph`` (an earlier model's, dropped in a cycle), the graph is destroyed there, and that
    CUDA call is forbidden to the whole process while a capture in the default ``'global'`` error mode is under
    way: the capture fails ("operation not permitted when stream is capturing", then "operation failed due to a
    previous error during capture" at its next launch). ``torch.cuda.graph`` collected before each capture
    until torch 2.9 and no longer does (pytorch PRs #158193 and #158649; the failure they caused: pytorch
    #161037, NVIDIA/TransformerEngine #2092); this module calls ``capture_begin`` itself. An explicit
    ``gc.collect()`` inside the block still collects. Garbage made in the block waits for the next collection
    after it. The collector's switch is the process's: this expects one capturing thread (two threads capturing
    at once could switch it back on while the other still captures; nothing here captures on two threads).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def capture_graph(fn: Callable, args: tuple, pool, stream: "torch.cuda.Stream") -> tuple["torch.cuda.CUDAGraph", Any]:
    """Capture ``fn(*args)`` into a new graph in memory pool ``pool`` on side stream ``stream``, then
    replay it once (capture only records kernels) so the returned output holds this call's values. No
    garbage collection runs during the capture (:func:`collection_paused`).

    Returns:
        The graph and ``fn``'s output (owning tensors, in pool memory).
    """
    graph = torch.cuda.CUDAGraph()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), collection_paused():
        graph.capture_begin(pool=pool)
        try:
            output = fn(*args)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    return graph, output


def check_addresses(what: str, input_addresses: list[int | None], args) -> None:
    """Raise if a tensor argument lives elsewhere than at capture (``input_addresses``, None for non-tensors).

    Raises:
        RuntimeError: naming ``what`` (graph and size), the argument and both addresses.
    """
    for i, (arg, old) in enumerate(zip(args, input_addresses)):
        if old is not None and arg.data_ptr() != old:
            raise RuntimeError(
                f"CUDA graph of {what}: input {i} moved from {old:#x} to {arg.data_ptr():#x} since capture; the "
                "graph would read stale memory. Feed model inputs from static buffers (the runner does) and do "
                "not reassign parameters after capture."
            )


def addresses_of(args) -> list[int | None]:
    """Each tensor argument's data pointer (None for other arguments), for :func:`check_addresses`."""
    return [a.data_ptr() if isinstance(a, torch.Tensor) else None for a in args]


def non_owning(tensor: Any) -> Any:
    """A tensor aliasing ``tensor``'s memory without keeping it allocated (non-tensors pass through).

    The same device-pointer trick PyTorch's own cudagraph trees use to hand out graph outputs.
    """
    if not isinstance(tensor, torch.Tensor):
        return tensor
    storage = torch._C._construct_storage_from_data_pointer(
        tensor.untyped_storage().data_ptr(), tensor.device, tensor.untyped_storage().nbytes()
    )
    return torch.empty((), dtype=tensor.dtype, device=tensor.device).set_(
        storage, tensor.storage_offset(), tensor.shape, tensor.stride()
    )


def plain_runs_before_capture(num_warmups: int) -> int:
    """The plain runs each key of a graph wrapper (a size, a batch descriptor) gets before its capture:
    ``cudagraph_num_of_warmups``, and at least one, so 0 (vLLM's default) runs as 1.

    A capture must not hold a kernel's first launch in the process: Triton loads a kernel's binary onto the device
    there, which a capture in torch's default ``'global'`` error mode does not allow (a warm 8B start with 0
    warm-ups, whose compile-cache hit runs no kernel warm-up, exited with a CUDA error on an H100: perf/NOTES.md
    v45), and Inductor times a kernel's launch configurations at its first launch. No one plain run covers every
    size: the project's kernels are compiled per launch configuration (the full graphs' variable-length attention
    per graph size, the small-M GEMM for steps of at most 16 tokens), and each of Inductor's static compiles
    (``compile_sizes``) holds kernels of its own. vLLM captures at the first run with 0 and relies on its runner's
    plain profiling run and on kernels compiled ahead of time; here every size runs once plainly, in a call of
    its own, before its capture.
    """
    return max(1, num_warmups)


class WarmUpCount:
    """The plain runs each key (a size, a batch descriptor) has had before its capture.

    Args:
        num_warmups: ``cudagraph_num_of_warmups``; a key is captured after
            :func:`plain_runs_before_capture` of them.
    """

    def __init__(self, num_warmups: int):
        self.num_warmups = plain_runs_before_capture(num_warmups)
        self.done: dict[Any, int] = {}

    def capture_due(self, key) -> bool:
        """True once ``key`` has had ``num_warmups`` plain runs (capture now); otherwise counts this call
        as one more plain run and returns False."""
        done = self.done.get(key, 0)
        if done < self.num_warmups:
            self.done[key] = done + 1
            return False
        return True


@dataclass
class CapturedGraph:
    """One captured graph, what it returns (non-owning views of pool memory) and where its inputs lived."""

    graph: "torch.cuda.CUDAGraph"
    output: Any  # non-owning views of the capture's outputs
    input_addresses: list[int | None]


class CUDAGraphPiece:
    """Callable that runs ``runnable`` (a compiled piece) through per-size CUDA graphs.

    Args:
        name: the piece's name in the split module, for messages.
        runnable: the compiled piece.
        size_args: indices of the int arguments that hold the token count (empty for a piece with static
            shapes, which is captured once).
        capture_sizes: token counts to capture.
        num_warmups: plain runs at a size before capturing it.
        pool: memory pool shared by every piece and size of the model (``torch.cuda.graph_pool_handle()``).
        stream: side stream to capture on (capture is not allowed on the legacy default stream).
        debug_addresses: check input addresses on every replay.
        stale_outputs: with ``debug_cudagraph_outputs``, the model's
            :class:`~reference.compilation.stale_outputs.StaleOutputGuard`, which hands out each replay's
            outputs; else None.
    """

    def __init__(
        self,
        name: str,
        runnable: Callable,
        size_args: tuple[int, ...],
        capture_sizes: tuple[int, ...],
        num_warmups: int,
        pool,
        stream: "torch.cuda.Stream",
        debug_addresses: bool,
        stale_outputs=None,
    ):
        self.name = name
        self.runnable = runnable
        self.size_args = size_args
        self.capture_sizes = frozenset(capture_sizes)
        self.pool = pool
        self.stream = stream
        self.debug_addresses = debug_addresses
        self.stale_outputs = stale_outputs
        self.debug = debug_addresses or stale_outputs is not None
        self.captured: dict[int | None, CapturedGraph] = {}
        self.warm_ups = WarmUpCount(num_warmups)

    def __call__(self, *args):
        if _InsideFullGraph.active:  # a full graph records this piece's kernels itself
            return self.runnable(*args)
        # the replay path: one dict lookup, then (outside debug mode) the replay itself
        size = args[self.size_args[0]] if self.size_args else None
        captured = self.captured.get(size)
        if captured is not None and (len(self.size_args) < 2 or self._sizes_agree(args, size)):
            if self.debug:
                return self._debug_replay(captured, size, args)
            captured.graph.replay()
            compilation_counter.num_cudagraph_replays += 1
            return captured.output
        if (self.size_args and size not in self.capture_sizes) or not self._sizes_agree(args, size):
            compilation_counter.num_cudagraph_eager_runs += 1
            return self.runnable(*args)
        if not self.warm_ups.capture_due(size):
            compilation_counter.num_cudagraph_eager_runs += 1
            return self.runnable(*args)
        return self._capture(size, args)

    def _sizes_agree(self, args, size) -> bool:
        """All token-count arguments equal (Dynamo may give equal dimensions separate symbols)."""
        return all(args[i] == size for i in self.size_args[1:])

    def _capture(self, size, args) -> Any:
        graph, output = capture_graph(self.runnable, args, self.pool, self.stream)
        self.captured[size] = CapturedGraph(graph, tree_map(non_owning, output), addresses_of(args))
        compilation_counter.num_cudagraph_captured += 1
        return output

    def _debug_replay(self, captured: CapturedGraph, size, args) -> Any:
        """The replay with ``debug_cudagraph_addresses`` and / or ``debug_cudagraph_outputs`` on."""
        if self.debug_addresses:
            self._check_addresses(captured, size, args)
        captured.graph.replay()
        compilation_counter.num_cudagraph_replays += 1
        if self.stale_outputs is None:
            return captured.output
        return self.stale_outputs.hand_out(captured.output, f"piece {self.name} at size {size}")

    def _check_addresses(self, captured: CapturedGraph, size, args) -> None:
        check_addresses(f"piece {self.name} at size {size}", captured.input_addresses, args)
