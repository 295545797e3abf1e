"""Did a graph mode's steps really replay graphs? A tally of what each graph-able call did.

A CUDA-graph mode is only worth its numbers if, once warmed up, every step replays graphs that were
captured before: a step that re-records, recompiles or quietly runs without its graph still returns the
right logits, so neither an equivalence test nor a latency figure notices. :class:`ReplayTally` counts,
over a block of steps, what happened to every call that could have replayed a graph;
:func:`reference_replays` fills one from this project's compilation counters, and
:func:`reference.peers.torch_native.graph_tree_replays` from torch's CUDA graph trees, so the conformance
suite and the benchmarks judge every implementation by the same rule (:meth:`ReplayTally.problems`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch

from reference.compilation.counters import compilation_counter


@dataclass
class ReplayTally:
    """What the graph-able calls inside a block did (counts; filled when the block exits).

    Attributes:
        replays: graphs replayed (piecewise pieces, breakable segments, whole forwards of full graphs).
        recorded: graphs captured or recorded inside the block.
        eager_runs: calls of a graph-able piece that ran without a graph (warm-up runs, sizes that were
            not captured, an implementation's fallback to its un-graphed code).
        recompiles: graphs traced by Dynamo (or handed to a backend) inside the block.
        skipped: pieces the implementation itself declared unfit for graphs inside the block (torch's
            ``cudagraph_skips``; always 0 for the reference, which refuses such configs instead).
    """

    replays: int = 0
    recorded: int = 0
    eager_runs: int = 0
    recompiles: int = 0
    skipped: int = 0

    def problems(self, steps: int) -> list[str]:
        """Why ``steps`` warmed-up steps at capture sizes did not replay graphs as they should: each step
        replays at least one graph, and nothing is recorded, run without a graph, recompiled or skipped.
        Empty when they did."""
        found = []
        if self.replays < steps:
            found.append(f"{self.replays} graph replays in {steps} steps (expected at least one per step)")
        for what, count in (
            ("graphs recorded", self.recorded),
            ("runs without a graph", self.eager_runs),
            ("recompiles", self.recompiles),
            ("graph skips", self.skipped),
        ):
            if count:
                found.append(f"{count} {what}")
        return found


def dynamo_graphs() -> int:
    """Graphs Dynamo has traced in this process (``torch._dynamo.utils.counters['stats']['unique_graphs']``)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@contextlib.contextmanager
def reference_replays() -> Iterator[ReplayTally]:
    """A :class:`ReplayTally` of the reference's graphs inside the block, from the compilation counters."""
    tally, before, traced = ReplayTally(), compilation_counter.snapshot(), dynamo_graphs()
    try:
        yield tally
    finally:
        after = compilation_counter.snapshot()

        def delta(name: str) -> int:
            return getattr(after, name) - getattr(before, name)

        tally.replays = delta("num_cudagraph_replays") + delta("num_full_cudagraph_replays")
        tally.recorded = delta("num_cudagraph_captured") + delta("num_full_cudagraph_captured")
        tally.eager_runs = delta("num_cudagraph_eager_runs")
        tally.recompiles = max(delta("num_graphs_seen"), dynamo_graphs() - traced)
