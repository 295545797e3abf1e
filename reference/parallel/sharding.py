"""How a transformers-shaped (full) tensor maps onto one rank's shard, and back to full shapes.

A sharded parameter carries a :class:`TensorSplit` (``param.tp_split``). Fused projections are split
part by part: rank r of ``qkv_proj`` holds its share of q's rows, then of k's, then of v's, so each rank
computes whole heads. Unsplit parameters (norms, row-parallel biases) are replicated on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TensorSplit:
    """A parameter split along ``dim`` into ``size`` shards, this rank holding shard ``rank`` of each part.

    Attributes:
        dim: the split dimension (0: output rows of a column-parallel weight or the vocabulary; 1: input
            columns of a row-parallel weight).
        parts: full lengths along ``dim`` of the fused parts, in order (e.g. ``(q, kv, kv)`` rows); each
            divisible by ``size``.
        rank, size: this shard's index and the number of shards.
    """

    dim: int
    parts: tuple[int, ...]
    rank: int
    size: int

    def __post_init__(self):
        uneven = [p for p in self.parts if p % self.size]
        if uneven:
            raise ValueError(f"tensor_parallel_size={self.size} must divide every fused part, not {uneven}")


def split_of(tensor: torch.Tensor) -> TensorSplit | None:
    """The tensor's split, or None (replicated, or a single process)."""
    split = getattr(tensor, "tp_split", None)
    return split if split is not None and split.size > 1 else None


def full_shape(tensor: torch.Tensor) -> torch.Size:
    """The transformers-side shape of a (possibly sharded) parameter."""
    split = split_of(tensor)
    if split is None:
        return tensor.shape
    shape = list(tensor.shape)
    shape[split.dim] *= split.size
    return torch.Size(shape)


def shard(target: torch.Tensor, full: torch.Tensor, rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(region of target, piece of full)``: where the full tensor ``full`` goes in ``target`` and what of it.

    ``full`` is one transformers tensor: the whole parameter (``rows`` None), split part by part when
    the parameter is fused (``tp_split.parts``), or one part of a fused parameter, its full rows
    ``rows`` along dim 0. On a rank, that part's shard sits at local rows ``rows / size`` (every part
    before it holds ``1 / size`` of its rows there too).
    """
    split = split_of(target)
    if split is None:
        return (target if rows is None else target[rows]), full
    if rows is None and len(split.parts) > 1:
        parts = full.split(split.parts, split.dim)
        return target, torch.cat([part.chunk(split.size, split.dim)[split.rank] for part in parts], split.dim)
    if rows is not None and split.dim == 0:
        rows = slice(rows.start // split.size, rows.stop // split.size)
    return (target if rows is None else target[rows]), full.chunk(split.size, split.dim)[split.rank]


@torch.no_grad()
def copy_full_into(target: torch.Tensor, full: torch.Tensor, rows: slice | None = None) -> None:
    """Copy the full tensor ``full`` into its shard of ``target`` (see :func:`shard`); cast and moved by
    ``Tensor.copy_``."""
    region, piece = shard(target, full, rows)
    region.copy_(piece)
