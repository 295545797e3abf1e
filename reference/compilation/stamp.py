"""Stamped layers: Dynamo traces a prefix of a model's decoder layers, and copies of its last layers complete the graph.

Dynamo's symbolic execution of the forward is most of a ``no_inductor`` cold start (perf/NOTES.md, v35): its
cost grows with the layers it traces, and 32 layers of one class trace to 32 copies of one graph that differ
only in their weights and in the attention layer each copy names. torch's own answer, regional compilation and
``nested_compile_region``, compiles the repeated block as a region of its own; the project needs one flat FX
graph to split at the attention ops, so instead the first call traces a *prefix* of the layers and the rest
are stamped from it here, node for node, before the backend splits the graph.

A model declares its repeated layers with ``repeated_layers() -> (path, kinds)``: the module path of its
``nn.ModuleList`` (``'model.layers'``) and one hashable kind per layer. The declaration promises that two layers
of one kind run the same code on weights of the same shapes, and that the forward only iterates over the stack,
calling each layer alike: no ``len`` of it, no index, no argument that depends on the layer's place (Gemma 3's
kinds are its ``'sliding_attention'`` and ``'full_attention'``). The first layer (its residual is None) and
every layer whose kind follows another kind differ in what they read from the layer before, so what is
stamped is a *transition*, (kind before, kind): the prefix is the shortest one in which every transition of
the layers after it occurs at least twice at index 2 or later (the copy is made of the last occurrence, and
the others must trace to the same graph), and whose last layer has the stack's last kind (the final norm reads
it). Llama's 32 layers trace 4; Gemma 3 4B's 34 layers of period 6 trace 13.

Dynamo traces a shallow copy of the model whose stack holds the prefix (the model stays whole for the runner's
kernel warm-up, which runs it on a thread meanwhile). Before anything is copied, the trace is checked, and a
model that fails a check, or whose trace of the prefix raises, is traced whole after one warning line:

* every occurrence of a transition traced to one canonical graph (each argument named by what it is: a node of
  its own layer or of the layer before by position, a weight of its own layer by its name in the layer, a node
  outside the layers, a string naming its own layer), and the layers of a kind to one sequence of ops;
* no node outside the layers reads one inside them, except the last layer's after the stack, nor a tensor that
  only the layers own (``self.layers[-1].weight`` read after the stack);
* each stamped layer has its template's module classes, tensor names, shapes and dtypes, and plain settings
  (numbers, strings, dtypes and containers of them; strings naming the layer made relative to it).

What the checks cannot see is a breach of the promise outside the prefix that leaves no trace in the modules
(a ``len(self.layers)`` in the forward, a constant passed to one layer only); the conformance rule
(``conformance/test_stamp.py``) holds every architecture's stamped graph to its whole trace, node for node.
Stamped layers' tensors are bound when the graph is stamped, as a compile-cache hit binds every tensor: levels
2-3 assume the parameters do not change after the first call.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from typing import Any, Callable, Hashable

import torch
from torch import nn
from torch.fx.node import map_aggregate


Node = torch.fx.Node


class NotStampable(Exception):
    """The traced prefix cannot be stamped into the whole stack; the message says why, in one line."""


def prefix_length(kinds: tuple[Hashable, ...]) -> int | None:
    """The layers Dynamo traces for a stack of ``kinds`` (module doc), or None when no prefix shorter than the
    stack has what stamping needs (then the stack is traced whole).

    >>> prefix_length(("full_attention",) * 32)
    4
    """
    n = len(kinds)
    for prefix in range(4, n):
        seen = Counter((kinds[i - 1], kinds[i]) for i in range(2, prefix))
        needed = {(kinds[i - 1], kinds[i]) for i in range(prefix, n)}
        if all(seen[t] >= 2 for t in needed) and kinds[prefix - 1] == kinds[n - 1]:
            return prefix
    return None


def _module_path(dynamo_path: str) -> str:
    """A module's path as ``named_modules`` spells it, from an ``nn_module_stack`` entry of Dynamo's graph:
    ``L['self'].model.layers.0`` (torch 2.13), ``L['self']._modules['model']`` or ``...layers[0]`` spellings."""
    path = re.sub(r"^L\['self'\]", "", dynamo_path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    return path.lstrip(".")


_PLAIN = (bool, int, float, complex, str, bytes, type(None), torch.dtype, torch.device)
_OPAQUE = object()  # what a setting that is not plain data reads as: modules, tensors, configs, functions


def _plain(value, layer_name: Callable[[str], str]):
    """``value`` as comparable plain data (strings' layer indices made relative by ``layer_name``, containers
    walked), or ``_OPAQUE``."""
    if isinstance(value, str):
        return layer_name(value)
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, (tuple, list, set, frozenset)):
        items = [_plain(v, layer_name) for v in value]
        ordered = sorted(items, key=repr) if isinstance(value, (set, frozenset)) else items
        return (type(value).__name__, tuple(ordered))
    if isinstance(value, dict):
        return ("dict", tuple((_plain(k, layer_name), _plain(v, layer_name)) for k, v in value.items()))
    return _OPAQUE


def _settings(module: nn.Module, layer_name: Callable[[str], str]) -> tuple:
    """A module's own attributes that are plain data (numbers, strings, dtypes, devices, None, and containers of
    them; not torch's ``training``), each string's layer index made relative by ``layer_name``."""
    items = []
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or name == "training":
            continue
        plain = _plain(value, layer_name)
        if plain is not _OPAQUE:
            items.append((name, plain))
    return tuple(items)


class LayerStamp:
    """The stamping of one compiled model's repeated layers (module doc).

    Args:
        model: the model being compiled; ``model.repeated_layers()`` gives ``(path, kinds)``.
        path: the module path of its ``nn.ModuleList`` of decoder layers.
        kinds: one hashable kind per layer.
        prefix: the layers traced (:func:`prefix_length`).
    """

    def __init__(self, model: nn.Module, path: str, kinds: tuple[Hashable, ...], prefix: int):
        self.path, self.kinds, self.prefix = path, kinds, prefix
        self._layers: nn.ModuleList = model.get_submodule(path)
        self._model = model
        self._tensors: dict[str, torch.Tensor] = {}  # the model's tensors by name, and their names, when it stamps
        self._names: dict[int, list[str]] = {}
        self._layer_name = re.compile(rf"(?<![\w.]){re.escape(path)}\.(\d+)(?=\.|$)")

    @classmethod
    def for_model(cls, model: nn.Module) -> "LayerStamp | None":
        """The model's stamping, or None where it declares no repeated layers, or too few to stamp any.

        Raises:
            ValueError: a declaration whose kinds do not give one per layer of the module list it names.
        """
        declare = getattr(model, "repeated_layers", None)
        if declare is None:
            return None
        path, kinds = declare()
        layers = model.get_submodule(path)
        if not isinstance(layers, nn.ModuleList) or len(kinds) != len(layers):
            raise ValueError(
                f"repeated_layers: {type(model).__name__} names {path!r} with {len(kinds)} kinds, but that is "
                f"{type(layers).__name__} of {len(layers) if isinstance(layers, nn.ModuleList) else 'no'} layers"
            )
        prefix = prefix_length(tuple(kinds))
        return None if prefix is None else cls(model, path, tuple(kinds), prefix)

    def prefix_model(self) -> nn.Module:
        """A shallow copy of the model whose stack holds only its first ``prefix`` layers, for Dynamo's trace.
        The modules on the stack's path are copied (their own tensors and the layers are the model's); the model
        itself is left whole, for any thread that runs it meanwhile."""
        *parents, last = self.path.split(".")
        top = node = copy.copy(self._model)
        for name in parents:
            node._modules = dict(node._modules)
            node._modules[name] = node = copy.copy(node._modules[name])
        node._modules = dict(node._modules)
        node._modules[last] = nn.ModuleList(list(self._layers)[: self.prefix])
        return top

    # ------------------------------------------------------------------ the graph
    def stamp(self, gm: torch.fx.GraphModule, example_inputs: list) -> tuple[torch.fx.GraphModule, list, list]:
        """Complete ``gm``, Dynamo's graph of the prefix, into the whole stack's graph.

        Args:
            gm: the traced graph; its placeholders are the prefix's inputs, in ``example_inputs`` order.
            example_inputs: Dynamo's real inputs (parameters, buffers, arguments, SymInt token counts).

        Returns:
            ``(graph, inputs, extra)``: a new graph module (``gm`` is Dynamo's, left as it was), its inputs
            (``example_inputs`` then ``extra``) and the tensors of the stamped layers the graph now takes after
            Dynamo's inputs, in order.

        Raises:
            NotStampable: the trace fails a check of the module doc.
        """
        model = self._model
        tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
        self._tensors, self._names = dict(tensors), {}
        for name, t in tensors:
            self._names.setdefault(id(t), []).append(name)
        gm = _copy_of(gm)  # Dynamo reads its own graph's placeholders after the backend returns
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        values = dict(zip(placeholders, example_inputs))
        blocks, block_of = self._blocks(gm)
        canonical = {j: self._canonical(j, blocks, block_of, values) for j in range(2, self.prefix)}
        templates = self._templates(blocks, canonical)
        tail = self._check_outside(gm, blocks, block_of, values)
        extra = self._copy(gm, blocks, block_of, values, templates, tail, placeholders)
        gm.graph.lint()
        gm.recompile()
        return gm, [*example_inputs, *extra], extra

    @property
    def stamped(self) -> int:
        """How many layers :meth:`stamp` copies (those after the prefix)."""
        return len(self.kinds) - self.prefix

    def _layer_of(self, node: Node) -> int | None:
        for dynamo_path, _ in (node.meta.get("nn_module_stack") or {}).values():
            match = self._layer_name.match(_module_path(dynamo_path))
            if match:
                return int(match.group(1))
        return None

    def _blocks(self, gm) -> tuple[list[list[Node]], dict[Node, int]]:
        """Each traced layer's nodes in graph order, and each node's layer (placeholders belong to none)."""
        blocks: list[list[Node]] = [[] for _ in range(self.prefix)]
        block_of = {}
        for node in gm.graph.nodes:
            j = self._layer_of(node) if node.op not in ("placeholder", "output") else None
            if j is not None:
                if j >= self.prefix:
                    raise NotStampable(f"a node of layer {j} in a trace of {self.prefix} layers")
                blocks[j].append(node)
                block_of[node] = j
        if not all(blocks):
            empty = next(j for j, b in enumerate(blocks) if not b)
            raise NotStampable(f"no node of the trace is in layer {empty} (Dynamo's module paths not understood)")
        return blocks, block_of

    def _own_tensor(self, value, j: int) -> str | None:
        """The name of ``value`` inside layer ``j`` (``self_attn.qkv_proj.weight``), if it is one of its tensors."""
        prefix = f"{self.path}.{j}."
        names = sorted(n for n in self._names.get(id(value), ()) if n.startswith(prefix))
        return names[0][len(prefix):] if names else None

    def _canonical(self, j: int, blocks, block_of, values) -> list:
        """Layer ``j``'s nodes, each argument named by what it is (module doc)."""
        position = {n: p for p, n in enumerate(blocks[j])} | {n: ("prev", p) for p, n in enumerate(blocks[j - 1])}

        def name(a):
            if isinstance(a, Node):
                if a in position:
                    p = position[a]
                    return p if isinstance(p, tuple) else ("own", p)
                if a in block_of:
                    raise NotStampable(f"layer {j} reads {a.name} of layer {block_of[a]}, not of the layer before")
                if a.op == "placeholder":
                    own = self._own_tensor(values[a], j)
                    return ("tensor", own) if own is not None else ("outside", a)
                return ("outside", a)
            if isinstance(a, str):
                return ("string", self._layer_name.sub(lambda m: f"{self.path}.<{int(m.group(1)) - j:+d}>", a))
            return a

        return [(n.op, n.target, map_aggregate(n.args, name), map_aggregate(n.kwargs, name)) for n in blocks[j]]

    def _templates(self, blocks, canonical) -> dict[tuple, int]:
        """Per transition of the layers to stamp, the traced layer its copies are made of."""
        skeleton = {}
        for j in range(1, self.prefix):
            ops = [(n.op, n.target) for n in blocks[j]]
            if skeleton.setdefault(self.kinds[j], ops) != ops:
                raise NotStampable(f"layer {j} runs other ops than an earlier layer of kind {self.kinds[j]!r}")
        templates = {}
        for j in range(2, self.prefix):
            transition = (self.kinds[j - 1], self.kinds[j])
            first = templates.setdefault(transition, j)
            if canonical[j] != canonical[first]:
                raise NotStampable(f"layers {first} and {j} (both {transition[1]!r} after {transition[0]!r}) "
                                   "traced to different graphs")  # fmt: skip
            templates[transition] = j
        for i in range(self.prefix, len(self.kinds)):
            t = templates[(self.kinds[i - 1], self.kinds[i])]
            if self._fingerprint(i) != self._fingerprint(t):
                raise NotStampable(f"layer {i} differs from layer {t}, of its kind, in its modules, tensor shapes or "
                                   "settings")  # fmt: skip
        return templates

    def _fingerprint(self, j: int) -> tuple:
        """What two layers of one kind must share: their module tree's classes and plain settings (strings that
        name the layer made relative to it), and their tensors' names, shapes and dtypes."""
        layer = self._layers[j]
        relative = lambda text: self._layer_name.sub(lambda m: f"<{int(m.group(1)) - j:+d}>", text)  # noqa: E731
        modules = tuple((name, type(m), _settings(m, relative)) for name, m in layer.named_modules())
        tensors = [*layer.named_parameters(remove_duplicate=False), *layer.named_buffers(remove_duplicate=False)]
        return modules, tuple((name, tuple(t.shape), t.dtype) for name, t in tensors)

    def _check_outside(self, gm, blocks, block_of, values) -> list[Node]:
        """The nodes after the last traced layer; checks that a node outside the layers reads a layer's node
        only there, and only the last layer's, and reads no tensor that only the layers own."""
        last = blocks[-1][-1]
        nodes = list(gm.graph.nodes)
        tail = nodes[nodes.index(last) + 1:]
        tail_set = set(tail)
        for node in nodes:
            if node in block_of or node.op == "placeholder":
                continue
            for a in node.all_input_nodes:
                if a in block_of and not (node in tail_set and block_of[a] == self.prefix - 1):
                    raise NotStampable(f"{node.name}, outside the layers, reads {a.name} of layer {block_of[a]}")
                names = self._names.get(id(values.get(a)), ()) if a.op == "placeholder" else ()
                if names and all(name.startswith(f"{self.path}.") for name in names):
                    # which layer it meant (``self.layers[-1]`` or ``[3]``) the trace of a prefix cannot say
                    raise NotStampable(f"{node.name}, outside the layers, reads {names[0]}, a layer's own tensor")
        return [n for n in tail if n not in block_of]

    def _copy(self, gm, blocks, block_of, values, templates, tail, placeholders) -> list[torch.Tensor]:
        """Insert the stamped layers after the last traced one and point the tail at the last of them; returns the
        tensors of the placeholders added."""
        inputs = _Inputs(gm.graph, placeholders, values, self._tensors)
        positions = [{n: p for p, n in enumerate(b)} for b in blocks]
        previous = blocks[-1]
        with gm.graph.inserting_before(tail[0]):  # the tail holds the output node at least
            for i in range(self.prefix, len(self.kinds)):
                t = templates[(self.kinds[i - 1], self.kinds[i])]
                previous = self._stamp_layer(gm.graph, i, t, blocks, block_of, positions, previous, values, inputs)
        self._point_tail_at(tail, positions[-1], previous)
        return inputs.extra

    def _stamp_layer(self, graph, i, t, blocks, block_of, positions, previous, values, inputs) -> list[Node]:
        """Layer ``i`` as a copy of traced layer ``t``, reading ``previous`` (layer ``i - 1``'s nodes) where ``t``
        reads layer ``t - 1``; its nodes in order."""
        copies: list[Node] = []

        def mapped(a):
            if isinstance(a, Node):
                if block_of.get(a) == t:
                    return copies[positions[t][a]]
                if block_of.get(a) == t - 1:
                    return previous[positions[t - 1][a]]
                own = self._own_tensor(values[a], t) if a.op == "placeholder" else None
                return a if own is None else inputs.node_for(a, self._tensor_name(own, i))
            return self._renamed(a, t, i) if isinstance(a, str) else a

        for node in blocks[t]:
            new = graph.create_node(node.op, node.target, map_aggregate(node.args, mapped),
                                    map_aggregate(node.kwargs, mapped))  # fmt: skip
            new.meta = dict(node.meta)  # its fake value is the template's (check_distinct_inputs)
            copies.append(new)
        return copies

    def _tensor_name(self, own: str, i: int) -> str:
        """The model's name of layer ``i``'s tensor that is ``own`` in each layer."""
        return f"{self.path}.{i}.{own}"

    def _renamed(self, text: str, t: int, i: int) -> str:
        """``text`` with each layer it names moved by ``i - t`` (the attention op's ``model.layers.3.self_attn.attn``
        becomes layer ``i``'s)."""
        return self._layer_name.sub(lambda m: f"{self.path}.{int(m.group(1)) - t + i}", text)

    @staticmethod
    def _point_tail_at(tail: list[Node], last_traced: dict[Node, int], last_stamped: list[Node]) -> None:
        """Make the nodes after the layers (the final norm, the output) read the last stamped layer's node where
        they read the last traced layer's (``last_traced``: node -> position)."""
        moved = lambda a: last_stamped[last_traced[a]] if a in last_traced else a  # noqa: E731
        for node in tail:
            node.args, node.kwargs = map_aggregate(node.args, moved), map_aggregate(node.kwargs, moved)


class _Inputs:
    """The graph's placeholders, one per distinct tensor: a stamped layer's tensor gets a new placeholder after
    the last (its fake value made by Dynamo's fake mode), unless a placeholder already takes that tensor (a
    buffer the layers share, such as the rotary table)."""

    def __init__(self, graph: torch.fx.Graph, placeholders: list[Node], values: dict, tensors: dict[str, torch.Tensor]):
        self._graph, self._last, self._tensors = graph, placeholders[-1], tensors
        self._by_tensor = {id(v): p for p, v in values.items() if isinstance(v, torch.Tensor)}
        self._fake_mode = torch._guards.TracingContext.get().fake_mode  # Dynamo's, around its backend's call
        self.extra: list[torch.Tensor] = []

    def node_for(self, template: Node, name: str) -> Node:
        """The placeholder of the model's tensor ``name``; ``template``: the traced layer's placeholder it
        stands in for (its meta is copied)."""
        tensor = self._tensors[name]  # there: the layer has its template's tensor names (LayerStamp._fingerprint)
        if id(tensor) in self._by_tensor:
            return self._by_tensor[id(tensor)]
        with self._graph.inserting_after(self._last):
            node = self._graph.placeholder(re.sub(r"\W", "_", name))
        node.meta = {k: v for k, v in template.meta.items() if k != "grapharg"}  # Dynamo's source is the template's
        node.meta["example_value"] = self._fake_mode.from_tensor(tensor, static_shapes=True)
        self._last = self._by_tensor[id(tensor)] = node
        self.extra.append(tensor)
        return node


def check_distinct_inputs(pieces) -> None:
    """Each piece of a stamped graph takes inputs with fake values of their own.

    A stamped node shares its template's fake value (making new ones costs more than the rest of the stamping),
    and Inductor's AOT Autograd takes two inputs with one fake value for one tensor passed twice. A piece that
    takes one template node's copies in two layers would be compiled so; the project's models give none (a piece
    spans the end of one layer and the start of the next, which read only their own values and the previous
    layer's), and this refuses any that would.

    Args:
        pieces: the split pieces (:class:`~reference.compilation.split.Piece`).

    Raises:
        NotStampable: naming the piece.
    """
    for piece in pieces:
        values = [n.meta.get("example_value") for n in piece.module.graph.nodes if n.op == "placeholder"]
        tensors = [id(v) for v in values if isinstance(v, torch.Tensor)]
        if len(tensors) != len(set(tensors)):
            raise NotStampable(f"{piece.name} would take two stamped values that share one fake tensor")


def _copy_of(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A graph module over a copy of ``gm``'s graph (each node's meta copied, its values shared)."""
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    copy = torch.fx.GraphModule(gm, graph)
    copy.meta.update(gm.meta)
    return copy


def with_inputs(split: Callable, extra: list[torch.Tensor]) -> Callable:
    """``split`` called with Dynamo's inputs of the prefix followed by the stamped layers' tensors."""

    def call(*args: Any):
        return split(*args, *extra)

    return call
