"""Tensor parallelism (Megatron-LM style) over ``torch.distributed``: the process group, the sharded
layers, and how a full (transformers-shaped) tensor maps onto a rank's shard.

Reference: Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using Model
Parallelism", 2019, section 3 (column- then row-parallel GEMMs, one all-reduce per block).
"""

from reference.parallel.group import (
    SINGLE,
    TensorParallel,
    check_divisible,
    current,
    init_tensor_parallel,
    use,
)
from reference.parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    all_gather_last_dim,
    all_reduce,
)
from reference.parallel.sharding import TensorSplit, copy_full_into, full_shape, shard, split_of

__all__ = [
    "SINGLE",
    "ColumnParallelLinear",
    "RowParallelLinear",
    "TensorParallel",
    "TensorSplit",
    "VocabParallelEmbedding",
    "all_gather_last_dim",
    "all_reduce",
    "check_divisible",
    "copy_full_into",
    "current",
    "full_shape",
    "shard",
    "init_tensor_parallel",
    "split_of",
    "use",
]
