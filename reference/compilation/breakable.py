"""Breakable CUDA graphs: piecewise graphs of the eager model, with no trace and no compile.

The seed PR stopped at "unless users actually want to turn off TorchDynamo too"; vLLM and SGLang have since
shipped this. The model runs eagerly under stream capture while a ``TorchDispatchMode`` watches every op.
At a splitting op the current segment's capture ends and the segment is replayed once (a capture only
records kernels, and the op needs its inputs' values), the op runs eagerly, and the next segment's capture
begins. So one step of a capture size becomes ``[graph, op, graph, op, ..., graph]``; a replay runs that
list, calling each op on the tensors it received at capture. Those tensors live in the graphs' memory pool
at fixed addresses, and the op reads the step's metadata from the forward context as it does between
compiled pieces, so it may be dynamic.

The kernels are eager's own, recorded as they launch: a breakable step is bitwise equal to eager with the
same custom ops. The runner's promises are the piecewise ones (static inputs, padding to a capture size,
one pool, largest size first; see :mod:`.cuda_graph`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from reference.compilation.counters import compilation_counter
from reference.compilation.cuda_graph import (
    WarmUpCount,
    addresses_of,
    check_addresses,
    collection_paused,
    in_full_graph,
    non_owning,
)
from reference.compilation.split import is_splitting_op, op_name
from reference.compilation.warning_site import user_stacklevel
from reference.config import ConfigError
from reference.ops.library import SPLITTING_TAG, direct_call


@dataclass
class _EagerCall:
    """A splitting op between two segments, with the arguments it got at capture (non-owning views)."""

    fn: Callable
    args: tuple
    kwargs: dict

    def __call__(self) -> None:
        self.fn(*self.args, **self.kwargs)


@dataclass
class _Segments:
    steps: list  # torch.cuda.CUDAGraph or _EagerCall, in execution order
    output: Any  # non-owning views of the model's output
    input_addresses: list[int | None]
    num_graphs: int  # the CUDA graphs among steps


def _call_writing_into_buffers(func, args, kwargs):
    """Run splitting op ``func``; refuse it if it returned tensors instead of writing into its buffers."""
    result = func(*args, **kwargs)
    if result is not None and not (isinstance(result, (tuple, list)) and not result):
        raise ConfigError(
            f"splitting_ops: {op_name(func)!r} returns tensors; a breakable graph's splitting op must write into "
            "buffers the previous segment allocated (as reference::attention does)"
        )
    return result


class _BreakAtSplittingOps(TorchDispatchMode):
    """Calls ``on_split(func, args, kwargs)`` instead of every splitting op; refuses a captured unsafe op."""

    def __init__(self, splitting_ops: tuple[str, ...] | None, on_split: Callable):
        super().__init__()
        self.splitting_ops, self.on_split = splitting_ops, on_split

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_splitting_op(func, self.splitting_ops):
            return self.on_split(func, args, kwargs)
        if SPLITTING_TAG in func.tags:
            raise ConfigError(
                f"splitting_ops: {op_name(func)!r} (tagged torch.Tag.cudagraph_unsafe: it reads per-step metadata) "
                "would be captured inside a breakable CUDA-graph segment; add it to splitting_ops, leave "
                "splitting_ops at its default (None), or use cudagraph_mode='none'"
            )
        return func(*args, **kwargs)


class BreakableCUDAGraphs:
    """Callable with the model's forward signature that replays per-size breakable segments.

    Args:
        model: the eager model; ``model(input_ids [T], positions [T])``, token count T first.
        splitting_ops: where captures break (the config's ``splitting_ops``; None: ops tagged
            ``torch.Tag.cudagraph_unsafe``).
        capture_sizes: token counts to capture; other sizes run the model directly.
        num_warmups: plain runs at a size before capturing it.
        debug_addresses: on every replay check that the inputs live where they did at capture.
        stale_outputs: the model's :class:`~reference.compilation.stale_outputs.StaleOutputGuard` with
            ``debug_cudagraph_outputs``, else None.

    Raises (at the first call, on any device, as the piecewise backend refuses such configs when it
    compiles; and at capture):
        ConfigError: a splitting op that returns tensors (they would be allocated outside the pool, where
            the next segment could not follow them), or an op tagged cudagraph_unsafe that is not a
            splitting op (it would replay one step's metadata).
    """

    def __init__(
        self,
        model: Callable,
        splitting_ops: tuple[str, ...] | None,
        capture_sizes: tuple[int, ...],
        num_warmups: int,
        debug_addresses: bool,
        stale_outputs=None,
    ):
        self.model = model
        self.splitting_ops = splitting_ops
        self.capture_sizes = frozenset(capture_sizes)
        self.debug_addresses = debug_addresses
        self.stale_outputs = stale_outputs
        self.captured: dict[int, _Segments] = {}
        self.warm_ups = WarmUpCount(num_warmups)
        self._checked = False
        self._pool = None
        self._stream: "torch.cuda.Stream | None" = None

    def __call__(self, *args):
        if not self._checked:  # the config asks for graphs: refuse what could not be captured, on any device
            self._checked = True
            with _BreakAtSplittingOps(self.splitting_ops, _call_writing_into_buffers):
                return self.model(*args)
        size = args[0].shape[0]
        segments = self.captured.get(size)
        if segments is not None and not in_full_graph():
            if self.debug_addresses:
                check_addresses(f"the breakable segments at size {size}", segments.input_addresses, args)
            for step in segments.steps:
                step.replay() if isinstance(step, torch.cuda.CUDAGraph) else step()
            compilation_counter.num_cudagraph_replays += segments.num_graphs
            if self.stale_outputs is not None:
                return self.stale_outputs.hand_out(segments.output, f"the breakable segments at size {size}")
            return segments.output
        if not args[0].is_cuda or in_full_graph():  # no graphs here, or a full graph records the kernels
            return self.model(*args)
        if size not in self.capture_sizes or not self.warm_ups.capture_due(size):
            compilation_counter.num_cudagraph_eager_runs += 1
            return self.model(*args)
        return self._capture(size, args)

    def _capture(self, size: int, args) -> Any:
        if self._pool is None:
            self._pool, self._stream = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
        steps: list = []
        current: list[torch.cuda.CUDAGraph] = []

        def begin() -> None:
            current.append(torch.cuda.CUDAGraph())
            current[-1].capture_begin(pool=self._pool)

        def end() -> None:
            graph = current.pop()
            graph.capture_end()
            graph.replay()  # run what was recorded: the op after it needs the values
            steps.append(graph)

        def on_split(func, op_args, op_kwargs):
            end()
            result = _call_writing_into_buffers(func, op_args, op_kwargs)
            fn = direct_call(op_name(func)) or func
            steps.append(_EagerCall(fn, tree_map(non_owning, op_args), tree_map(non_owning, op_kwargs)))
            begin()
            return result

        self._stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self._stream), collection_paused():  # no finalizer destroys a graph mid-capture
            begin()
            try:
                with _BreakAtSplittingOps(self.splitting_ops, on_split):
                    output = self.model(*args)
            except BaseException:
                if current:
                    current.pop().capture_end()  # leave the stream usable; the partial graph is dropped
                raise
            end()
        torch.cuda.current_stream().wait_stream(self._stream)
        if not any(isinstance(step, _EagerCall) for step in steps):
            named = "ops tagged cudagraph_unsafe" if self.splitting_ops is None else list(self.splitting_ops)
            warnings.warn(
                f"none of splitting_ops ({named}) was called while capturing size {size}: the whole forward is one "
                "segment; splitting ops must be torch.library custom ops",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
        num_graphs = sum(isinstance(step, torch.cuda.CUDAGraph) for step in steps)
        self.captured[size] = _Segments(steps, tree_map(non_owning, output), addresses_of(args), num_graphs)
        compilation_counter.num_cudagraph_captured += num_graphs
        return output
