"""Which pieces are one program: a key of a piece's graph blind to names, so that identical pieces compile once.

A model of N identical layers split at its attention calls has N - 1 identical middle pieces (a layer's output
projection, MLP and the next layer's norm, QKV projection and rotary). Their FX graphs differ only in names:
Dynamo names each graph input after where it comes from (``l_self_modules_model_modules_layers_modules_7_...``)
and the split keeps each node's name from the whole graph. Every weight is a graph input (Dynamo lifts
parameters and buffers), so a compiled piece computes from its inputs alone, and one compile serves every piece
of the same key. With Inductor this takes a 32-layer Llama from 33 compiles to 3, and a compile-cache hit from
33 artifact loads to 3 (perf/NOTES.md v40); eager pieces cost nothing to compile and are not shared.

:func:`piece_key` lists, node by node in graph order: the kind of node; its target, the object itself (an
op, a function, a method name), so a key is compared only within one process; its arguments with each node
replaced by its position; and for a graph input its metadata: shape and stride with their symbols, storage
offset, dtype, device and ``requires_grad`` for a tensor, and the earlier input it shares a storage with, if
any (a compile assumes its example inputs' aliasing: one made for separate tensors, run on a buffer and a view
of it, updates the buffer wrongly); the expression for a symbolic integer. A piece with
state of its own (``get_attr``: a constant or submodule of the piece; ``call_module``), or with an argument of a
type the key cannot compare by value, has no key and is compiled on its own.
"""

from __future__ import annotations

from typing import Hashable

import torch
from torch.multiprocessing.reductions import StorageWeakRef

# Argument types compared by value. bool and int are told apart; floats by their hex form (-0.0 and 0.0 differ).
_SCALARS = (bool, int, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


class _Unkeyable(Exception):
    """An argument the key cannot compare by value."""


def _argument(value, positions: dict[torch.fx.Node, int]) -> Hashable:
    """``value`` (a node argument) as a hashable value equal for equal arguments, nodes by their position."""
    if isinstance(value, torch.fx.Node):
        return ("node", positions[value])
    if isinstance(value, float):
        return ("float", value.hex())  # -0.0 and 0.0 differ; every NaN is 'nan'
    if isinstance(value, _SCALARS) or value is Ellipsis:
        return (type(value).__name__, value)
    if isinstance(value, slice):
        return ("slice",) + tuple(_argument(v, positions) for v in (value.start, value.stop, value.step))
    if isinstance(value, (tuple, list)):
        return (type(value).__name__,) + tuple(_argument(v, positions) for v in value)
    if isinstance(value, dict):
        return ("dict",) + tuple((k, _argument(v, positions)) for k, v in value.items())
    raise _Unkeyable(type(value).__name__)


def _input_metadata(node: torch.fx.Node, storages: list) -> Hashable:
    """A graph input's example value as a hashable description: symbols by their names (``s0``), and for a
    tensor the position in ``storages`` (the storages of the tensor inputs before it, to which its own is
    appended) of the first that it shares, else None."""
    value = node.meta.get("example_value", node.meta.get("val"))
    if isinstance(value, torch.Tensor):
        storage = StorageWeakRef(value.untyped_storage())
        shared = next((i for i, other in enumerate(storages) if other == storage), None)
        storages.append(storage)
        return (
            "tensor",
            tuple(map(str, value.shape)),
            tuple(map(str, value.stride())),
            str(value.storage_offset()),
            value.dtype,
            value.device,
            value.requires_grad,
            shared,
        )
    if isinstance(value, (torch.SymInt, int)):
        return ("int", str(value))
    raise _Unkeyable(f"graph input {type(value).__name__}")


def piece_key(module: torch.fx.GraphModule) -> Hashable | None:
    """A key equal for two pieces when one compile of either computes the other (module doc), or None
    when the piece has state of its own or an argument the key cannot compare; compare keys within one process.

    Args:
        module: a piece from :func:`~reference.compilation.split.split_graph`, its inputs carrying Dynamo's
            example values (``meta['example_value']``).
    """
    positions: dict[torch.fx.Node, int] = {}
    nodes, storages = [], []
    try:
        for position, node in enumerate(module.graph.nodes):
            positions[node] = position
            if node.op in ("get_attr", "call_module"):
                return None
            if node.op == "placeholder":
                nodes.append(("input", _input_metadata(node, storages)))
                continue
            nodes.append((node.op, node.target, _argument(node.args, positions), _argument(node.kwargs, positions)))
        key = tuple(nodes)
        hash(key)  # a target that cannot be hashed cannot be compared either
    except (_Unkeyable, TypeError):
        return None
    return key
