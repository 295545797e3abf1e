"""Compilation counters: how many graphs were traced, split, compiled and captured.

Structure tests assert *deltas* of these around a call (vLLM's tests do the same), so they say what the
pipeline did without depending on Inductor's output or timing.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Iterator


@dataclass
class CompilationCounter:
    """Process-wide counts, incremented by the backend and the CUDA-graph runner.

    Attributes:
        num_graphs_seen: Dynamo graphs handed to our backend.
        num_piecewise_graphs_seen: pieces after splitting, splitting-op pieces included.
        num_piecewise_capturable_graphs_seen: pieces that are not splitting ops (compiled, capturable).
        num_backend_compilations: compilations of a piece (or whole graph), by either compiler: one per piece
            (with Inductor, per distinct piece: ``num_compiles_shared``), and one more per ``compile_sizes``
            entry for a piece with a token-count argument.
        num_inductor_compiles: compilations done by Inductor (static-shape ones for ``compile_sizes`` too).
        num_eager_compiles: compilations that kept the piece as eager FX code.
        num_compiles_shared: pieces that took the compiles of an earlier piece of the same program instead of
            compiling (Inductor only; :mod:`.piece_key`): the backend's compilations are one per distinct piece.
        num_cudagraph_captured: piecewise CUDA graphs captured (one per capturable piece and capture size;
            for breakable graphs one per segment and capture size).
        num_full_cudagraph_captured: full CUDA graphs captured (one per decode batch descriptor).
        num_cudagraph_replays: piecewise CUDA graphs replayed (a piece's graph, a breakable segment).
        num_full_cudagraph_replays: steps that replayed a full CUDA graph.
        num_cudagraph_eager_runs: calls of a CUDA-graph wrapper on CUDA that ran its code without a graph
            (warm-up runs, sizes or batch descriptors not captured); together with the two replay counts
            and the captures this accounts for every such call (reference.compilation.replays).
        num_cache_hits: compiled models whose first call was served by the compile cache (no trace, no compile).
        num_cache_misses: first calls that found no usable entry (none, or one refused with a warning).
        num_cache_entries_written: entries written to the compile cache (vLLM: num_cache_entries_updated).
        num_layers_stamped: decoder layers copied into a traced graph instead of traced by Dynamo
            (:mod:`reference.compilation.stamp`).
    """

    num_graphs_seen: int = 0
    num_piecewise_graphs_seen: int = 0
    num_piecewise_capturable_graphs_seen: int = 0
    num_backend_compilations: int = 0
    num_inductor_compiles: int = 0
    num_eager_compiles: int = 0
    num_compiles_shared: int = 0
    num_cudagraph_captured: int = 0
    num_full_cudagraph_captured: int = 0
    num_cudagraph_replays: int = 0
    num_full_cudagraph_replays: int = 0
    num_cudagraph_eager_runs: int = 0
    num_cache_hits: int = 0
    num_cache_misses: int = 0
    num_cache_entries_written: int = 0
    num_layers_stamped: int = 0

    def snapshot(self) -> "CompilationCounter":
        return dataclasses.replace(self)


compilation_counter = CompilationCounter()


@contextlib.contextmanager
def expect_counters(**expected_deltas: int) -> Iterator[None]:
    """Assert that the named counters grow by exactly the given amounts inside the block.

    Example: ``with expect_counters(num_graphs_seen=1, num_cudagraph_captured=6): ...``

    Raises:
        AssertionError: a delta differs; the message lists before, after and expected for each field.
        TypeError: an unknown counter name.
    """
    names = {f.name for f in dataclasses.fields(CompilationCounter)}
    unknown = sorted(set(expected_deltas) - names)
    if unknown:
        raise TypeError(f"expect_counters: unknown counter(s) {unknown}; known: {sorted(names)}")
    before = compilation_counter.snapshot()
    yield
    after = compilation_counter.snapshot()
    wrong = []
    for name, delta in expected_deltas.items():
        old, new = getattr(before, name), getattr(after, name)
        if new - old != delta:
            wrong.append(f"  {name}: before={old} after={new} delta={new - old} expected delta={delta}")
    if wrong:
        raise AssertionError("compilation counters differ:\n" + "\n".join(wrong))
