"""Faults of the compilation pipeline seen on any device: compile, Dynamo capture, split, config."""

from __future__ import annotations

import contextlib
from unittest import mock

import torch

from conformance.faults.fault import Fault, patches
from reference.compilation import backend, breakable, cuda_graph, piece_key, split, stamp
from reference.compilation import compile_piece as compile_piece_module
from reference.compilation.compile_piece import SizeDispatch
from reference.compilation.counters import compilation_counter
from reference.compilation.partition_graph import PartitionGraph
from reference.config import compilation as config_module
from reference.forward_context import current_forward_context
from reference.config.compilation import CompilationConfig

_real_compile_piece = compile_piece_module.compile_piece
_real_default_capture_sizes = config_module.default_capture_sizes
_real_resolve_capture_sizes = CompilationConfig._resolve_capture_sizes


def _traced_layer_tensor(self, own, i):
    """``LayerStamp._tensor_name`` naming the last traced layer's tensor instead of the stamped layer's."""
    return f"{self.path}.{self.prefix - 1}.{own}"


def _inductor_despite_use_inductor_false(module, config):
    """Counts an eager compile, as the branch that decides would, but compiles with Inductor."""
    if config.use_inductor:
        return _real_compile_piece(module, config)
    compilation_counter.num_backend_compilations += 1
    compilation_counter.num_eager_compiles += 1
    return torch._inductor.standalone_compile(
        module, compile_piece_module.example_inputs(module), dynamic_shapes="from_graph", options={"config_patches": {}}
    )


def _tagged_overloads_only(target, splitting_ops):
    """``is_splitting_op`` reading the tag on overloads only: Dynamo records packets, so none split."""
    if splitting_ops is not None:
        return split.op_name(target) in splitting_ops
    return isinstance(target, torch._ops.OpOverload) and torch.Tag.cudagraph_unsafe in target.tags


_real_partition_call = PartitionGraph.__call__


def _partition_graphs_in_every_step(self, args):
    """A partition's wrapper reads the step's size but not which graphs the runner sent the step to."""
    context = current_forward_context()
    if context is None:
        return _real_partition_call(self, args)
    mode, context.cudagraph_runtime_mode = context.cudagraph_runtime_mode, "PIECEWISE"
    try:
        return _real_partition_call(self, args)
    finally:
        context.cudagraph_runtime_mode = mode


def _multiples_of_8_only(max_size):
    """vLLM's older list: 1, 2, 4 and multiples of 8, so a maximum that is not a multiple of 8 is lost."""
    return tuple(s for s in _real_default_capture_sizes(max_size) if s in (1, 2, 4) or s % 8 == 0)


def _sorted_not_deduplicated(self):
    given = self.cudagraph_capture_sizes
    _real_resolve_capture_sizes(self)
    if given is not None:
        object.__setattr__(self, "cudagraph_capture_sizes", tuple(sorted(given)))


def _round_up_to_a_compile_size(self, *args):
    """The capture-size habit applied to compile sizes: a count runs the smallest static compile at least as
    large, as if its inputs were padded to it (they are not)."""
    size = args[self.size_args[0]]
    larger = [s for s in sorted(self.static) if s >= size]
    return (self.static[larger[0]] if larger else self.generic)(*args)


_real_argument = piece_key._argument


def _literals_unseen(value, positions):
    """The piece key's arguments with every literal alike: only the nodes they refer to are told apart."""
    if isinstance(value, (tuple, list, dict, slice, torch.fx.Node)):
        return _real_argument(value, positions)
    return ("literal",)


_real_input_metadata = piece_key._input_metadata


def _aliasing_unseen(node, storages):
    """The piece key's graph inputs described without which earlier input each shares a storage with."""
    described = _real_input_metadata(node, storages)
    return described[:-1] if described[0] == "tensor" else described


def _inputs_undescribed(node, storages):
    """The piece key's graph inputs without their metadata: any two tensors look alike."""
    return ("input",)


FAULTS = [
    Fault(
        id="use-inductor-ignored",
        kind="compile",
        description="use_inductor=False still compiles every piece with Inductor, while the counters say eager",
        plant=patches(mock.patch.object(backend, "compile_piece", _inductor_despite_use_inductor_false)),
        tests="compiles_nothing_with_inductor",
    ),
    Fault(
        id="token-dimension-not-dynamic",
        kind="capture",
        description="the token dimension is never marked dynamic, so Dynamo specialises the one trace to the first "
        "call's token count (with guards dropped, every other batch size runs a graph traced for another)",
        plant=patches(mock.patch("torch._dynamo.mark_dynamic", lambda *args, **kwargs: None)),
        tests="test_level2_traces_once_for_every_size",
    ),
    Fault(
        id="split-misses-tagged-op",
        kind="split",
        description="the split pass looks for torch.Tag.cudagraph_unsafe on op overloads only; Dynamo records op "
        "packets, so with the default splitting_ops attention stays inside a piece that would be captured",
        plant=patches(mock.patch.object(split, "is_splitting_op", _tagged_overloads_only)),
        tests="test_the_default_splits_at_every_op_tagged_cudagraph_unsafe",
    ),
    Fault(
        id="largest-capture-size-dropped",
        kind="config",
        description="a max_cudagraph_capture_size that is not a multiple of 8 is left out of the default capture "
        "sizes, so a step of that many tokens runs without a graph",
        plant=patches(mock.patch.object(config_module, "default_capture_sizes", _multiples_of_8_only)),
        tests="test_a_maximum_that_is_not_a_multiple_of_8_is_kept",
        bug="https://github.com/vllm-project/vllm/pull/37865",
    ),
    Fault(
        id="capture-sizes-not-deduplicated",
        kind="config",
        description="explicit cudagraph_capture_sizes are sorted but not deduplicated, so a repeated size is "
        "captured twice",
        plant=patches(mock.patch.object(CompilationConfig, "_resolve_capture_sizes", _sorted_not_deduplicated)),
        tests="test_explicit_sizes_are_deduplicated_and_sorted_and_set_the_maximum",
    ),
    Fault(
        id="compile-size-rounded-up",
        kind="compile",
        description="a token count between compile sizes runs the next larger size's static compile, as if it were "
        "padded to it like a capture size, on inputs that are not",
        plant=patches(mock.patch.object(SizeDispatch, "__call__", _round_up_to_a_compile_size)),
        tests="matches_its_closed_form_at_and_beside_the_compile_sizes",
    ),
    Fault(
        id="compile-sizes-never-dispatched",
        kind="compile",
        description="compile_sizes' static compiles are made (and counted) but every call runs the symbolic compile",
        plant=patches(mock.patch.object(backend, "_dispatch", lambda generic, static, size_args: generic)),
        tests="runs_that_sizes_compile_and_no_other_call_does",
    ),
    Fault(
        id="partition-graph-ignores-the-steps-mode",
        kind="capture",
        description="with use_inductor_graph_partition a partition's wrapper warms up and captures in any step of a "
        "capture size, also in steps sent to a full graph or to none",
        plant=patches(mock.patch.object(PartitionGraph, "__call__", _partition_graphs_in_every_step)),
        tests="a_partition_runs_as_compiled_where_no_graph_of_it_is_due",
    ),
    Fault(
        id="zero-warm-ups-capture-at-the-first-run",
        kind="capture",
        description="cudagraph_num_of_warmups=0 captures a size at its first run, so a start that launched no kernel "
        "yet (a compile-cache hit) has each Triton kernel's first launch, which loads its binary, inside a capture",
        plant=patches(mock.patch.object(cuda_graph, "plain_runs_before_capture", lambda num_warmups: num_warmups)),
        tests="test_each_key_captures_after_its_own_warm_ups",
    ),
    Fault(
        id="collector-runs-during-capture",
        kind="capture",
        description="Python's garbage collector stays on while a CUDA graph is captured, so a collection there "
        "destroys an earlier model's graph left in a dead reference cycle, a CUDA call that invalidates the capture "
        "under way (the default 'global' capture error mode forbids it to the whole process); a CPU test captures "
        "with stand-in graphs",
        plant=patches(
            mock.patch.object(cuda_graph, "collection_paused", contextlib.nullcontext),
            mock.patch.object(breakable, "collection_paused", contextlib.nullcontext),
        ),
        tests="dead_graph",
        bug="https://github.com/pytorch/pytorch/pull/161037",
    ),
    Fault(
        id="piece-key-blind-to-literals",
        kind="compile",
        description="the key that lets identical pieces share one Inductor compile ignores the graph's literals, so "
        "a layer with another scale (or epsilon, or softcap) runs the first layer's compiled constant",
        plant=patches(mock.patch.object(piece_key, "_argument", _literals_unseen)),
        tests="test_piece_key",
    ),
    Fault(
        id="piece-key-blind-to-input-metadata",
        kind="compile",
        description="the key that lets identical pieces share one Inductor compile ignores its inputs' shapes, "
        "strides and dtypes, so a piece runs code generated for another layout",
        plant=patches(mock.patch.object(piece_key, "_input_metadata", _inputs_undescribed)),
        tests="test_piece_key",
    ),
    Fault(
        id="piece-key-blind-to-input-aliasing",
        kind="compile",
        description="the key that lets identical pieces share one Inductor compile ignores which inputs share a "
        "storage, so a piece given a buffer and its view runs code compiled for separate tensors, which updates "
        "the buffer wrongly",
        plant=patches(mock.patch.object(piece_key, "_input_metadata", _aliasing_unseen)),
        tests="test_piece_key",
    ),
    Fault(
        id="stamped-layer-keeps-the-traced-layer-name",
        kind="capture",
        description="a stamped layer's attention call keeps the name of the traced layer it was copied from, so all "
        "the stamped layers read and write that layer's KV cache",
        plant=patches(mock.patch.object(stamp.LayerStamp, "_renamed", lambda self, text, t, i: text)),
        tests="test_the_stamped_graph_is_the_whole_trace and cpu",
    ),
    Fault(
        id="stamped-layer-reads-the-traced-layer-weights",
        kind="capture",
        description="a stamped layer takes the weights of the traced layer it was copied from instead of its own",
        plant=patches(mock.patch.object(stamp.LayerStamp, "_tensor_name", _traced_layer_tensor)),
        tests="test_the_stamped_graph_is_the_whole_trace and cpu",
    ),
    Fault(
        id="final-norm-reads-the-last-traced-layer",
        kind="capture",
        description="the nodes after the layers (the final norm, the output) still read the last traced layer, so "
        "the stamped layers run but the model's output skips them",
        plant=patches(mock.patch.object(stamp.LayerStamp, "_point_tail_at", staticmethod(lambda *args: None))),
        tests="test_the_stamped_graph_is_the_whole_trace and cpu",
    ),
]
