"""Faults of tensor parallelism (reference/parallel/), visible on the CPU: the tensor-parallel tests run two
gloo processes, and the worker enters the fault's plant in each of them (conformance/tensor_parallel_worker.py).
"""

from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F

from conformance.faults.fault import Fault, patches
from reference.parallel import layers, sharding
from reference.parallel.layers import RowParallelLinear, VocabParallelEmbedding

_real_shard = sharding.shard
_TESTS = "test_tensor_parallel_logits_match_one_process_on_every_rank and llama-tiny and eager"


def _partial_sums(self, x):
    """The row-parallel projection returns this rank's partial sum: the all-reduce is left out."""
    return F.linear(x, self.weight, self.bias)


def _other_ranks_rows_kept(self, ids):
    """Ids this rank does not hold are clamped into its table instead of zeroed, so the all-reduce adds
    another token's embedding from every other rank."""
    local = (ids - self.vocab_start).clamp(0, self.num_embeddings - 1)
    return layers.all_reduce(F.embedding(local, self.weight), self.tp)


def _fused_sharded_as_one(target, full, rows=None):
    """A fused projection is cut into contiguous blocks (rank 0 gets q's rows and part of k's) instead of
    part by part, so a rank's heads are not the heads its attention computes."""
    split = sharding.split_of(target)
    if split is None or rows is not None or len(split.parts) == 1:
        return _real_shard(target, full, rows)
    return target, full.chunk(split.size, split.dim)[split.rank]


def _gathered_rank_minor(x, tp):
    """The gathered logits are reshaped without moving the rank axis: columns of the ranks interleave."""
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), tp.size, tp.group_name)
    return torch.ops._c10d_functional.wait_tensor(gathered).reshape(x.shape[0], -1)


FAULTS = [
    Fault(
        id="tp-all-reduce-dropped",
        kind="parallel",
        description="a row-parallel projection (o_proj, down_proj) returns this rank's partial sum without the "
        "all-reduce, so each rank continues with half of every attention and MLP output",
        plant=patches(mock.patch.object(RowParallelLinear, "forward", _partial_sums)),
        tests=_TESTS,
    ),
    Fault(
        id="tp-vocab-rows-not-masked",
        kind="parallel",
        description="the vocabulary-parallel embedding does not zero the rows of ids another rank holds, so the "
        "all-reduce sums a wrong embedding into every token",
        plant=patches(mock.patch.object(VocabParallelEmbedding, "forward", _other_ranks_rows_kept)),
        tests=_TESTS,
    ),
    Fault(
        id="tp-fused-qkv-sharded-as-one-block",
        kind="parallel",
        description="a preset's random fused qkv and gate/up weights are sharded as one contiguous block instead of "
        "part by part, so rank 0 holds the first half of the query rows and rank 1 the rest with the keys and values",
        plant=patches(mock.patch.object(sharding, "shard", _fused_sharded_as_one)),
        tests="test_tensor_parallel_llm_generates_the_tokens_of_one_process and llama-tiny",
    ),
    Fault(
        id="tp-logits-gathered-rank-minor",
        kind="parallel",
        description="the LM head's all-gather is reshaped to [N, V] without moving the rank axis, so vocabulary "
        "columns of the two ranks are interleaved by row",
        plant=patches(mock.patch.object(layers, "all_gather_last_dim", _gathered_rank_minor)),
        tests=_TESTS,
    ),
]
