"""The implementation under test: the one seam between the conformance suite and what it checks.

An implementation takes a model the project built (a transformers config, the project's layers and
attention op) and a :class:`~reference.config.CompilationConfig`, and returns the compiled forward: a
callable with the model's signature (``input_ids [T] int64, positions [T] int64 -> hidden [T, H]``), to be
called inside a forward context (``reference.forward_context``) as the project's ``ModelRunner`` does.
The suite drives it through that runner (static inputs, padding to capture sizes, KV cache) with
:func:`make_runner`, or calls it directly for the closed-form models.

Select one with ``pytest conformance/ --impl NAME`` (:mod:`conformance.selection`): ``reference`` (the
default), ``torch-native`` (:mod:`conformance.torch_native`), a fault of the catalogue (``fault:ID``,
:mod:`conformance.faults`), or ``MODULE:FACTORY`` for your own, where ``FACTORY()`` returns an object with
these attributes:

* ``name`` (str) and ``capabilities`` (a set of the names in ``CAPABILITIES``): a test that needs a
  capability the implementation lacks is skipped with that reason, never passed;
* ``compile(model, config)``: the compiled forward, or raise :class:`Unsupported` (the test is skipped
  with the reason) for a config it cannot honour;
* ``activate()``: a context manager entered around every test (``contextlib.nullcontext()`` will do;
  the fault catalogue plants its faults there);
* ``replay_probe()`` if it declares the ``replays`` capability: a context manager that yields a
  :class:`~reference.compilation.replays.ReplayTally` and fills it, when the block exits, with what the
  block's graph-able calls did (replays, recordings, runs without a graph, recompiles, skips);
* optionally ``findings``: ``{rule: reason}``, rules (``module.py::test_name``) the implementation is known
  to break; they run as strict xfails with that reason, so a fix shows up as an unexpected pass.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Protocol

from torch import nn

from reference.compilation import compile_model
from reference.compilation.replays import ReplayTally, reference_replays
from reference.config import CompilationConfig
from reference.engine import ModelRunner
from reference.peers import Unsupported as Unsupported  # compile raises it for a config it does not implement

CAPABILITIES = {
    "counters": "reports reference.compilation.compilation_counter (graphs seen, pieces, compiles, captures)",
    "pieces": "exposes the split pieces (compiled.backend.pieces) for graph-structure tests",
    "levels": "implements levels 1 and 2 (whole-graph Dynamo, with and without Inductor)",
    "address_checks": "debug_cudagraph_addresses raises, naming the piece and size, when an input moved",
    "trace_once": "traces once for every token count (levels 2-3) and refuses what that cannot serve",
    "tensor_parallel": "builds reference.parallel shards and runs them in torchrun processes (the suite launches "
    "conformance/tensor_parallel_worker.py, which loads the implementation by its --impl name)",
    "stale_output_checks": "with debug_cudagraph_outputs=True, reading a graph output after the model's next call "
    "replayed over it raises RuntimeError naming the graph and size that produced it",
    "splits_dynamo_graphs": "splits Dynamo's torch-level graph, which never holds an ATen or prims op, so it refuses "
    "such names as splitting ops (an implementation that partitions the ATen graph after AOT Autograd, as "
    "Inductor's graph partition does, may cut there)",
    "replays": "replay_probe() accounts for every graph-able call: replayed, recorded, run without a graph, "
    "recompiled or skipped (reference.compilation.replays.ReplayTally)",
    "compile_cache": "with CompilationConfig.cache_dir set (and REFERENCE_DISABLE_COMPILE_CACHE=0), a new compile of "
    "an equal model and config is served from the folder, counted as num_cache_hits / num_cache_misses, with "
    "the first compile's outputs (bitwise but for autotuned Triton kernels); a changed factor misses; an unusable "
    "entry warns once and recompiles",
    "compile_sizes": "honours CompilationConfig.compile_sizes: each piece is compiled once more by Inductor with "
    "static shapes per listed token count, and a call at such a count runs that compile",
    "inductor_graph_partition": "honours CompilationConfig.use_inductor_graph_partition: no FX split, Inductor "
    "compiles the whole graph and partitions it at the splitting ops, and with piecewise graphs each partition is "
    "captured per capture size",
    "components": "is the reference: its own config, engine, loader, sampler and kernels are tested too, and the "
    "suite's own tools (its report, markers, scheduling, faults), which need checking once, not per implementation",
}


class Implementation(Protocol):
    """What ``--impl`` loads. ``activate()`` is entered around every test. An implementation may also set
    ``reached_only_through_impl = True``: its code runs only in tests that take the ``impl`` fixture, and its
    ``activate()`` changes nothing that other tests run, so ``--impl-tests-only`` may leave those tests out
    (a fault's ``activate()`` patches the reference, which every test runs: it must not set it)."""

    name: str
    capabilities: frozenset[str]

    def compile(self, model: nn.Module, config: CompilationConfig) -> Callable: ...

    def activate(self) -> ContextManager: ...


class ReferenceImplementation:
    """The project's own pipeline (``reference.compilation.compile_model``), every capability."""

    name = "reference"
    capabilities = frozenset(CAPABILITIES)
    reached_only_through_impl = True

    def compile(self, model: nn.Module, config: CompilationConfig) -> Callable:
        return compile_model(model, config)

    def activate(self) -> ContextManager:
        return contextlib.nullcontext()

    def replay_probe(self) -> ContextManager[ReplayTally]:
        return reference_replays()


def make_runner(impl: Implementation, model: nn.Module, config: CompilationConfig, **sizes) -> ModelRunner:
    """The project's :class:`ModelRunner` over ``impl``'s compiled forward; ``sizes``: its size arguments."""
    return ModelRunner(model, config, compile_fn=impl.compile, **sizes)
