"""Split a Dynamo graph at the splitting ops.

Every splitting-op node becomes a piece of its own; the nodes between two splitting ops form one piece.
With N splitting-op calls the graph has at most 2N + 1 pieces (fewer if a piece would be empty), of which
the N splitting-op pieces run eagerly and the others are compiled and captured.

Which ops split: the names in ``splitting_ops``, or, when it is None (the config's default), every op
tagged ``torch.Tag.cudagraph_unsafe`` (see :mod:`reference.ops.library`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.fx.passes.split_module import split_module

from reference.ops.library import SPLITTING_TAG


@dataclass(frozen=True)
class Piece:
    """One submodule of the split graph.

    Attributes:
        name: attribute name in the split module (``submod_<i>``).
        index: position in execution order.
        is_splitting_op: True for a piece that only calls a splitting op (runs eagerly, never captured).
        module: the piece as an FX GraphModule; its placeholders carry Dynamo's fake example values.
    """

    name: str
    index: int
    is_splitting_op: bool
    module: torch.fx.GraphModule


def op_name(target) -> str | None:
    """``'namespace::op'`` for a torch op node target (overload or packet), else None."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name
    return None


def is_splitting_op(target, splitting_ops: tuple[str, ...] | None) -> bool:
    """Whether a call of ``target`` splits the graph: it is named in ``splitting_ops``, or, for None, an op
    tagged ``torch.Tag.cudagraph_unsafe``."""
    if splitting_ops is not None:
        return op_name(target) in splitting_ops
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = target.default
    return isinstance(target, torch._ops.OpOverload) and SPLITTING_TAG in target.tags


def split_graph(
    gm: torch.fx.GraphModule, splitting_ops: tuple[str, ...] | None
) -> tuple[torch.fx.GraphModule, list[Piece]]:
    """Split ``gm`` at the calls of splitting ops (see :func:`is_splitting_op`); ``()`` keeps one piece.

    Returns:
        The split module (its ``forward`` calls the pieces in order) and the pieces in execution order.
    """
    assignment: dict[torch.fx.Node, int] = {}
    piece = 0
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and is_splitting_op(node.target, splitting_ops):
            piece += 1
            assignment[node] = piece
            piece += 1
        else:
            assignment[node] = piece
    split = split_module(gm, None, lambda node: assignment[node], keep_original_order=True)

    pieces = []
    for node in split.graph.nodes:
        if node.op != "call_module":
            continue
        module = getattr(split, node.target)
        calls = [n for n in module.graph.nodes if n.op == "call_function"]
        is_split = len(calls) == 1 and is_splitting_op(calls[0].target, splitting_ops)
        pieces.append(Piece(node.target, len(pieces), is_split, module))
    return split, pieces
