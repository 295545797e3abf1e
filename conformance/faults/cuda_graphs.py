"""Faults that only CUDA graphs show (device ``cuda``): what a graph keeps, reads and is ordered after.

They cannot show on a CPU, where nothing is captured; ``python -m conformance.faults --device cuda`` runs
them with the gpu-marked tests. Each names in ``tests`` the gpu test expected to catch it.
"""

from __future__ import annotations

from unittest import mock

import torch
from torch.utils._pytree import tree_map

from conformance.faults.fault import Fault, patches
from reference.compilation import backend, cuda_graph
from reference.compilation.cuda_graph import CUDAGraphPiece, non_owning
from reference.compilation.partition_graph import partition_wrappers
from reference.compilation.stale_outputs import StaleOutputGuard
from reference.engine import llm_engine
from reference.engine.runner import ModelRunner
from reference.forward_context import BatchDescriptor

_real_capture = CUDAGraphPiece._capture
_real_call = CUDAGraphPiece.__call__
_real_run = ModelRunner._run
_real_dispatch = ModelRunner.dispatch


def _outputs_dropped_at_capture(self, size, args):
    """The capture call hands out non-owning views too, so the capture's outputs are freed at once and the next
    piece's capture allocates over them while the step still reads them."""
    return tree_map(non_owning, _real_capture(self, size, args))


def _inputs_reallocated(self, new_tokens, context_lens, rows):
    """Fresh input buffers every step: a graph keeps reading the addresses it was captured with."""
    self.input_ids, self.positions = self.input_ids.clone(), self.positions.clone()
    return _real_run(self, new_tokens, context_lens, rows)


def _one_warmup(**kwargs):
    return CUDAGraphPiece(**{**kwargs, "num_warmups": 1})


def _on_the_capture_stream(self, *args):
    """Warm-ups, capture and replays all run on the piece's side stream, which neither waits for the current
    stream nor is waited for."""
    with torch.cuda.stream(self.stream):
        return _real_call(self, *args)


def _copied_to_pageable_memory(tokens):
    """The decode loop's device-to-host copy of the sampled tokens lands in pageable memory: still
    ``non_blocking=True``, but such a copy waits for all work queued before it."""
    host = torch.empty(tokens.shape, dtype=tokens.dtype)
    host.copy_(tokens, non_blocking=True)
    copied = torch.cuda.Event()
    copied.record()
    return host, copied


def _dispatched_unpadded(self, num_tokens, uniform_decode):
    """The step goes to graphs at its own token count, not at the capture size it is padded to."""
    dispatch = _real_dispatch(self, num_tokens, uniform_decode)
    return dispatch.__class__(num_tokens, dispatch.runtime_mode, BatchDescriptor(num_tokens, uniform_decode))


def _partitions_as_compiled(self, on_cuda):
    """The block Inductor compiles in installs every partition as it is, whatever the config asks."""
    return partition_wrappers(None)


FAULTS = [
    Fault(
        id="graph-outputs-freed-at-capture",
        kind="capture",
        description="a piece's capture call returns non-owning views of its outputs, so their memory goes back to "
        "the pool while the step still needs them; the next piece's graph overwrites them before they are read "
        "(the bitwise comparisons with eager replay every step through such graphs)",
        plant=patches(mock.patch.object(CUDAGraphPiece, "_capture", _outputs_dropped_at_capture)),
        tests="bitwise_equal_to_eager and cuda",
        device="cuda",
        bug="https://github.com/pytorch/pytorch/issues/148439",
    ),
    Fault(
        id="runner-inputs-reallocated",
        kind="runner",
        description="the runner allocates new input_ids and positions buffers every step, so the first piece's "
        "graph reads the addresses of the capture's buffers, holding old or freed data (every graph replay of "
        "the bitwise comparisons with eager then computes on stale tokens)",
        plant=patches(mock.patch.object(ModelRunner, "_run", _inputs_reallocated)),
        tests="bitwise_equal_to_eager and cuda",
        device="cuda",
        bug="https://github.com/vllm-project/vllm/pull/53915",
    ),
    Fault(
        id="address-check-skipped",
        kind="capture",
        description="debug_cudagraph_addresses checks nothing, so an input that moved after capture is replayed "
        "from its old address without a word",
        plant=patches(mock.patch.object(CUDAGraphPiece, "_check_addresses", lambda self, captured, size, args: None)),
        tests="test_debug_addresses",
        device="cuda",
        bug="https://github.com/vllm-project/vllm/pull/53915",
    ),
    Fault(
        id="graph-outputs-kept-alive",
        kind="capture",
        description="captured graphs keep owning references to their outputs, so no size reuses another's memory "
        "and graph memory grows with the sum of the capture sizes instead of the largest",
        plant=patches(mock.patch.object(cuda_graph, "non_owning", lambda tensor: tensor)),
        tests="test_all_capture_sizes_share_the_memory_of_the_largest",
        device="cuda",
        bug="https://github.com/vllm-project/vllm/pull/9724",
        alone=True,
    ),
    Fault(
        id="num-of-warmups-not-passed-on",
        kind="capture",
        description="cudagraph_num_of_warmups never reaches the pieces: every size is warmed up once, whatever "
        "the config says",
        plant=patches(mock.patch.object(backend, "CUDAGraphPiece", _one_warmup)),
        tests="test_a_size_is_captured_after_exactly_num_of_warmups_plain_runs",
        device="cuda",
    ),
    Fault(
        id="pieces-run-on-the-capture-stream",
        kind="capture",
        description="warm-up, capture and replay run on the pieces' side stream without ordering against the "
        "current stream, so a piece may read inputs the current stream has not written yet",
        plant=patches(mock.patch.object(CUDAGraphPiece, "__call__", _on_the_capture_stream)),
        tests="test_each_call_sees_the_inputs_queued_before_it_on_the_current_stream",
        device="cuda",
    ),
    Fault(
        id="attention-captured-with-one-steps-metadata",
        kind="capture",
        description="with splitting_ops=[] the KV-cache attention op is captured inside a piece instead of the "
        "config being refused, so every replay reads the lengths and cache slots of the step it was captured with",
        plant=patches(mock.patch.object(backend, "_check_no_unsafe_op_captured", lambda piece: None)),
        tests="test_attention_left_inside_a_captured_piece_is_refused_or_runs_like_eager and cuda",
        device="cuda",
    ),
    Fault(
        id="steps-dispatched-unpadded",
        kind="runner",
        description="the dispatcher keeps a step's own token count instead of the capture size it pads to, so a "
        "step of 3 tokens runs its pieces without a graph, or captures a new full graph while serving; the "
        "logits stay right, only the replay accounting shows it",
        plant=patches(mock.patch.object(ModelRunner, "dispatch", _dispatched_unpadded)),
        tests="test_warmed_up_steps_replay_graphs and cuda",
        device="cuda",
    ),
    Fault(
        id="stale-outputs-not-poisoned",
        kind="capture",
        description="debug_cudagraph_outputs hands out fresh views but never poisons those of earlier calls, so a "
        "read of an output that a later replay overwrote returns the later step's values without a word",
        plant=patches(mock.patch.object(StaleOutputGuard, "_poison_earlier_calls", lambda self: None)),
        tests="test_reading_an_output_a_later_call_replayed_over_raises",
        device="cuda",
    ),
    Fault(
        id="decode-tokens-copied-to-pageable-memory",
        kind="engine",
        description="the decode loop copies each step's sampled tokens into pageable host memory, so the copy "
        "waits for the device and the host stalls at every step; the tokens are the same, and torch's sync "
        "debug mode does not flag the wait",
        plant=patches(mock.patch.object(llm_engine, "_copy_to_host", _copied_to_pageable_memory)),
        tests="test_the_decode_loops_token_copy_to_the_host_returns_before_the_device_is_done",
        device="cuda",
    ),
    Fault(
        id="partitions-installed-without-graphs",
        kind="capture",
        description="with use_inductor_graph_partition Inductor's partitions are installed as compiled, without the "
        "wrapper that captures them: no step replays a graph, and nothing but the counters says so",
        plant=patches(mock.patch.object(backend.PiecewiseBackend, "partition_graphs", _partitions_as_compiled)),
        tests="test_partitioned_inductor_is_one_compile_and_at_most_twice_as_far_as_eager_from_float64 and cuda",
        device="cuda",
    ),
]
