"""Sharded layers and the two collectives they need, written so Dynamo traces them into the graph.

The collectives are torch's functional ones (``torch.ops._c10d_functional``): out-of-place ops whose group
is a string constant, so a traced graph holds an ``all_reduce`` node (and its ``wait_tensor``) like any
other op, inside the piecewise pieces (they are not splitting ops), so on CUDA the collective is meant
to be captured with the rest of its piece (NCCL supports stream capture; not yet run on several GPUs
here: only the gloo CPU path is tested). With one process every layer is the plain layer it
subclasses and calls no collective.

Shapes (T tokens, H hidden, size = tensor-parallel size): a column-parallel linear maps [T, H] to
[T, out / size] (this rank's heads or MLP columns); a row-parallel linear maps [T, in / size] to
partial sums [T, H], all-reduced; the vocabulary-parallel embedding looks up the ids in this rank's
quarter (say) of the table and all-reduces; the LM head is column-parallel over the vocabulary and gathers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from reference.parallel.group import TensorParallel, current
from reference.parallel.sharding import TensorSplit


def all_reduce(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """The sum of ``x`` over the group's ranks (same shape and dtype; a new tensor)."""
    return torch.ops._c10d_functional.wait_tensor(torch.ops._c10d_functional.all_reduce(x, "sum", tp.group_name))


def all_gather_last_dim(x: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """[N, V / size] on each rank -> [N, V], rank r's columns at ``[r * V / size, (r + 1) * V / size)``."""
    gathered = torch.ops._c10d_functional.all_gather_into_tensor(x.contiguous(), tp.size, tp.group_name)
    gathered = torch.ops._c10d_functional.wait_tensor(gathered)  # [size * N, V / size], rank-major
    n, local = x.shape
    return gathered.view(tp.size, n, local).movedim(0, 1).reshape(n, tp.size * local)


def _check_divides(what: str, value: int, tp: TensorParallel) -> None:
    if value % tp.size:
        raise ValueError(f"tensor_parallel_size={tp.size} must divide {what} ({value})")


class ColumnParallelLinear(nn.Linear):
    """``y = x W^T + b`` with W's output rows split over the ranks. ``forward(x [T, in]) -> [T, out / size]``.

    Args:
        in_features: input width (whole on every rank).
        output_sizes: full output widths of the fused parts (``[q, kv, kv]``; ``[out]`` when not fused);
            each rank holds ``1 / size`` of every part, in order.
        bias: whether there is a bias (split like the rows).
        gather_output: all-gather the outputs so every rank gets [T, out] (the LM head).

    Raises:
        ValueError: the group's size does not divide an output size.
    """

    def __init__(self, in_features: int, output_sizes: Sequence[int], bias: bool, *, gather_output: bool = False):
        tp = current()
        for size in output_sizes:
            _check_divides("the output width", size, tp)
        super().__init__(in_features, sum(output_sizes) // tp.size, bias=bias)
        self.tp, self.gather_output = tp, gather_output
        split = TensorSplit(0, tuple(output_sizes), tp.rank, tp.size)
        self.weight.tp_split = split
        if self.bias is not None:
            self.bias.tp_split = split

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return all_gather_last_dim(y, self.tp) if self.gather_output and self.tp.size > 1 else y


class RowParallelLinear(nn.Linear):
    """``y = x W^T + b`` with W's input columns split over the ranks and the partial sums all-reduced.

    ``forward(x [T, in / size]) -> [T, out]``, the same on every rank. The bias (replicated) is added once,
    after the all-reduce.

    Raises:
        ValueError: the group's size does not divide ``in_features``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool):
        tp = current()
        _check_divides("the input width", in_features, tp)
        super().__init__(in_features // tp.size, out_features, bias=bias)
        self.tp = tp
        self.weight.tp_split = TensorSplit(1, (in_features,), tp.rank, tp.size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.linear(x, self.weight, self.bias)
        y = all_reduce(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class VocabParallelEmbedding(nn.Embedding):
    """Embedding table split by rows (token ids) over the ranks. ``forward(ids [T] int64) -> [T, H]``.

    Rank r holds ids ``[r * V / size, (r + 1) * V / size)``; it looks up the ids it holds, zeroes the
    rows of the others, and the all-reduce sums the one non-zero row per token.

    Raises:
        ValueError: the group's size does not divide ``num_embeddings``.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int):
        tp = current()
        _check_divides("the vocabulary", num_embeddings, tp)
        super().__init__(num_embeddings // tp.size, embedding_dim)
        self.tp, self.vocab_start = tp, tp.rank * (num_embeddings // tp.size)
        self.weight.tp_split = TensorSplit(0, (num_embeddings,), tp.rank, tp.size)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.vocab_start
        held = (local >= 0) & (local < self.num_embeddings)  # [T] bool
        rows = F.embedding(local.masked_fill(~held, 0), self.weight)  # [T, H]
        return all_reduce(rows.masked_fill(~held[:, None], 0), self.tp)
