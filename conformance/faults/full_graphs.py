"""Faults of full CUDA graphs and breakable graphs: the graph kinds that capture more than the pieces between
splitting ops (issue: full decode graphs, piecewise graphs without Dynamo).

A dispatch fault shows on a CPU (the runner records what it dispatched there too); the others only where
something is captured, so they run with the gpu-marked tests.
"""

from __future__ import annotations

from unittest import mock

from conformance.faults.fault import Fault, patches
from reference.compilation import capture
from reference.compilation.breakable import BreakableCUDAGraphs, _BreakAtSplittingOps
from reference.compilation.full_graph import FullCUDAGraphs
from reference.engine import runner
from reference.engine.runner import ModelRunner
from reference.forward_context import BatchDescriptor
from reference.ops import attention_metadata
from reference.ops.attention_metadata import AttentionMetadata, GraphTables

_real_dispatch = ModelRunner.dispatch
_real_from_device = AttentionMetadata.from_device.__func__
_real_full_capture = FullCUDAGraphs._capture
_real_breakable_call = BreakableCUDAGraphs.__call__


def _fresh_metadata(self, staged, size):
    """A full step's lengths and rows stay in the step's own staging tensor, so the graph keeps reading the
    tensor of the step it was captured at (freed since, or reused)."""
    return list(staged.view(2, size))


def _fresh_graph_tables(self, staged, size):
    """A step's tables for a full graph of any step stay in the step's own staging tensor, so the graph keeps
    reading the query offsets, lengths and slots of the step it was captured at."""
    return GraphTables.from_flat(staged, size, self.graph_capacity(size))


_staged_tensors: list = []


def _kept_alive(int_lists_to_device):
    """``int_lists_to_device`` whose tensors are never freed. With it, a graph that reads a step's staged
    tensors instead of the static ones replays the values of its capture step, as such a bug does until the
    allocator hands that memory to another tensor, after which it reads garbage and may fault the device (a
    crash catches nothing: the faults below are held to a wrong result)."""

    def staged(lists, device):
        tensors = int_lists_to_device(lists, device)
        _staged_tensors.append(tensors)
        return tensors

    return staged


_KEEP_STAGED_TENSORS = (
    mock.patch.object(runner, "int_lists_to_device", _kept_alive(runner.int_lists_to_device)),
    mock.patch.object(attention_metadata, "int_lists_to_device", _kept_alive(attention_metadata.int_lists_to_device)),
)


def _tables_dropped(cls, *args, graph_tables=None):
    """The attention declares ALWAYS but never reads the graph tables: a full graph of a mixed step records the
    host-sized decode and prefill launches of its capture step (torchtitan #3668's kind of bug: a level
    inherited, not honoured)."""
    return _real_from_device(cls, *args)


def _every_small_step_is_decode(self, num_tokens, uniform_decode):
    """Dispatch looks at the token count alone: a prefill of a decode size replays a decode graph."""
    return _real_dispatch(self, num_tokens, True)


def _captured_under_the_real_size(self, key, args):
    """Capture files a graph under the step's unpadded kind (``uniform_decode=False``) while lookup asks for
    the dispatched key, so no full graph is ever replayed: every decode step captures anew."""
    return _real_full_capture(self, BatchDescriptor(key.num_tokens, False), args)


def _no_break(self, func, types, args=(), kwargs=None):
    """The breakable capture's watcher lets every op through, attention included: one segment per size, with
    attention recorded for the lengths and slots of the capture step."""
    return func(*args, **(kwargs or {}))


def _pool_per_size(self, key, args):
    """Each full-graph size is captured into a pool of its own, so no size reuses a larger one's memory."""
    self._pool = None
    return _real_full_capture(self, key, args)


def _checked_only_at_capture(self, *args):
    """The first call skips the config check, so only a capture (on CUDA) refuses what cannot be captured."""
    self._checked = True
    return _real_breakable_call(self, *args)


FAULTS = [
    Fault(
        id="full-graph-metadata-captured-as-constants",
        kind="runner",
        description="a full decode step's sequence lengths and cache rows are fresh device tensors instead of the "
        "runner's static buffer, so every replay attends with the lengths and rows of the capture step",
        plant=patches(mock.patch.object(ModelRunner, "_into_static_metadata", _fresh_metadata)),
        tests="test_full_decode_at_a_capture_size_is_bitwise and cuda",
        device="cuda",
    ),
    Fault(
        id="full-graph-replays-stale-query-offsets",
        kind="runner",
        description="under cudagraph_mode='full' a step's query offsets, lengths, rows and slots are fresh device "
        "tensors instead of the runner's static tables, so every replay attends with those of its capture step",
        plant=patches(mock.patch.object(ModelRunner, "_into_graph_tables", _fresh_graph_tables), *_KEEP_STAGED_TENSORS),
        tests="test_every_kind_of_step_replays_its_full_graph_bitwise",
        device="cuda",
    ),
    Fault(
        id="declared-level-not-honoured",
        kind="attention",
        description="the attention declares it serves every step inside a full graph (ALWAYS), but its metadata "
        "never carries the static tables, so a mixed step's graph records launches sized and addressed for its "
        "capture step",
        plant=patches(
            mock.patch.object(AttentionMetadata, "from_device", classmethod(_tables_dropped)), *_KEEP_STAGED_TENSORS
        ),
        tests="test_every_kind_of_step_replays_its_full_graph_bitwise",
        device="cuda",
    ),
    Fault(
        id="prefill-dispatched-to-a-decode-graph",
        kind="runner",
        description="the dispatcher treats every step of at most the largest decode size as a uniform decode, so "
        "a short prefill replays a decode graph (one query per sequence) and skips most of its tokens",
        plant=patches(mock.patch.object(ModelRunner, "dispatch", _every_small_step_is_decode)),
        tests="test_uniform_decode_steps_go_to_full_graphs",
    ),
    Fault(
        id="full-graph-keys-differ",
        kind="capture",
        description="full graphs are captured under one key and looked up under another, so they are never "
        "replayed: each decode step captures again and runs at warm-up speed",
        plant=patches(mock.patch.object(FullCUDAGraphs, "_capture", _captured_under_the_real_size)),
        tests="test_decode_steps_replay_the_full_graphs",
        device="cuda",
    ),
    Fault(
        id="breakable-capture-without-a-break-at-attention",
        kind="capture",
        description="breakable graphs do not break at the attention op, so each size is one segment and every "
        "replay attends with the lengths and cache slots of the capture step",
        plant=patches(mock.patch.object(_BreakAtSplittingOps, "__torch_dispatch__", _no_break)),
        tests="bitwise_equal_to_eager and breakable and cuda",
        device="cuda",
    ),
    Fault(
        id="breakable-config-checked-only-on-cuda",
        kind="config",
        description="breakable graphs check their splitting ops only while capturing, so a CPU run (and the CPU "
        "tests) accepts a config that every GPU refuses",
        plant=patches(mock.patch.object(BreakableCUDAGraphs, "__call__", _checked_only_at_capture)),
        tests="test_a_splitting_op_that_returns_a_tensor_cannot_break_a_capture and cpu",
    ),
    Fault(
        id="breakable-splitting-op-names-unchecked",
        kind="config",
        description="breakable graphs take the splitting-op names as given, so a misspelt or unregistered op, or "
        "an ATen op that no capture can break at, is accepted when the model is compiled",
        plant=patches(mock.patch.object(capture, "check_splitting_ops_exist", lambda names: None)),
        tests="test_breakable_graphs_refuse_a_splitting_op_name_that_is_no_custom_op",
    ),
    Fault(
        id="full-graphs-in-a-pool-each",
        kind="capture",
        description="every full-graph size is captured into a fresh memory pool instead of the one the sizes "
        "share, so full-graph memory grows with the sum of the decode sizes instead of the largest",
        plant=patches(mock.patch.object(FullCUDAGraphs, "_capture", _pool_per_size)),
        tests="test_all_full_graph_sizes_share_the_memory_of_the_largest",
        device="cuda",
        alone=True,
    ),
]
