"""The torch.compile backend: split the Dynamo graph, compile each piece, wrap it in CUDA graphs.

``torch.compile(fn, backend=PiecewiseBackend(config))`` hands us Dynamo's FX graph once. At level 3 we
split it at ``config.splitting_ops`` (:mod:`.split`), compile every other piece for the symbolic token
count (:mod:`.compile_piece`; with ``compile_sizes`` also once per listed count, routed by a
:class:`~.compile_piece.SizeDispatch`; with Inductor once per distinct program, identical layers' pieces
sharing it, :mod:`.piece_key`) and, with piecewise graphs (``cudagraph_mode`` ``'piecewise'`` or
``'full_and_piecewise'``) on CUDA, wrap each compiled piece
in a :class:`.cuda_graph.CUDAGraphPiece`. Splitting-op pieces run eagerly, calling the op's registered
Python function directly when it has one. At levels 1 and 2 the whole graph is compiled as one piece,
without CUDA graphs. With ``use_inductor_graph_partition`` there is no FX split either: Inductor compiles the
whole graph and partitions it at the splitting ops itself, and each of its partitions gets the per-size CUDA
graphs (:mod:`.partition_graph`).
"""

from __future__ import annotations

import warnings
from typing import Callable

import torch

from reference.compilation.compile_piece import SizeDispatch, compile_piece, compile_static, example_inputs
from reference.compilation.counters import compilation_counter
from reference.compilation.cuda_graph import CUDAGraphPiece
from reference.compilation.partition_graph import PartitionGraph, partition_wrappers
from reference.compilation.piece_key import piece_key
from reference.compilation.compile_cache import CacheWriter, Entry, StoredModule, static_artifact
from reference.compilation.split import Piece, is_splitting_op, op_name, split_graph
from reference.compilation.stamp import LayerStamp, check_distinct_inputs, with_inputs
from reference.compilation.warning_site import user_stacklevel
from reference.config import CompilationConfig, ConfigError
from reference.ops.library import direct_call


def check_splitting_ops_exist(names: tuple[str, ...]) -> None:
    """Each ``namespace::op`` name is a registered torch.library op above ATen.

    Raises:
        ConfigError: naming the first that is not, that names an overload (``op.default``: a split matches
            every overload of a named op), or that is an ATen / prims op (registered, but Dynamo graphs record
            torch-level calls and custom ops, so they never hold one to cut at, and a breakable capture refuses
            it since it returns tensors).
    """
    for name in names:
        namespace, op = name.split("::")
        if namespace in ("aten", "prims"):
            raise ConfigError(
                f"splitting_ops: {name!r} is an ATen-level op: Dynamo's graph never holds one (ATen ops appear "
                "later, in AOT Autograd), and a breakable capture could not break at it (ATen ops return tensors; "
                "a splitting op writes into buffers it is given); name a torch.library custom op such as "
                "'reference::attention'"
            )
        packet = op.partition(".")[0]
        if packet != op and hasattr(getattr(torch.ops, namespace), packet):  # torch prints ops by overload
            raise ConfigError(
                f"splitting_ops: {name!r} names an overload; name the op, '{namespace}::{packet}', whose every "
                "overload the graph is cut at"
            )
        if not hasattr(getattr(torch.ops, namespace), op):
            raise ConfigError(
                f"splitting_ops: {name!r} is not a registered torch.library op; import the module that "
                "defines it before compiling, or fix the name"
            )


def _size_args(piece: Piece) -> tuple[int, ...]:
    """Indices of the piece's SymInt arguments (token counts); empty for a piece with static shapes."""
    return tuple(i for i, v in enumerate(example_inputs(piece.module)) if isinstance(v, torch.SymInt))


def direct_call_spec(piece: Piece) -> tuple[str, list] | None:
    """How to call a splitting-op piece's registered Python function directly, skipping the dispatcher:
    ``(op name, [(is_argument, argument index or constant), ...])``.

    Returns None (keep the piece as it is) unless the piece is one call of an op with a registered
    direct function, with positional arguments only and no outputs (ops that write into buffers).
    """
    nodes = list(piece.module.graph.nodes)
    calls = [n for n in nodes if n.op == "call_function"]
    if len(calls) != 1 or calls[0].kwargs or nodes[-1].args[0] not in ((), None):
        return None
    name = op_name(calls[0].target)
    if direct_call(name) is None:
        return None
    index = {n: i for i, n in enumerate(n for n in nodes if n.op == "placeholder")}
    return name, [(a in index, index[a] if a in index else a) for a in calls[0].args]


def _direct_splitting_call(piece: Piece) -> Callable | None:
    """The piece's op called directly (:func:`direct_call_spec`), or None to keep the piece as it is."""
    spec = direct_call_spec(piece)
    return None if spec is None else _call_directly(*spec)


def _call_directly(name: str, spec: list) -> Callable:
    """A splitting piece's calling convention (its inputs in, ``()`` out) over op ``name``'s direct function."""
    fn = direct_call(name)

    def call(*args):
        fn(*[args[v] if is_arg else v for is_arg, v in spec])
        return ()

    return call


def _check_writes_into_buffers(piece: Piece) -> None:
    """A splitting op between CUDA graphs must return nothing: a tensor it returned would be allocated
    outside the graph pool, at an address the next piece's graph would not follow."""
    output = list(piece.module.graph.nodes)[-1]
    if output.args[0] not in ((), None):
        call = next(n for n in piece.module.graph.nodes if n.op == "call_function")
        raise ConfigError(
            f"splitting_ops: {op_name(call.target)!r} returns tensors; with cudagraph_mode='piecewise' a splitting "
            "op must write into buffers the previous piece allocated (as reference::attention does), or use "
            "cudagraph_mode='none'"
        )


def _check_partition_cuts_write_into_buffers(gm: torch.fx.GraphModule, splitting_ops) -> None:
    """With Inductor's graph partition and piecewise graphs, every op it cuts at returns nothing (as
    :func:`_check_writes_into_buffers` asks of a splitting piece): a tensor it returned would be allocated
    between two partitions' graphs, at an address the next graph would not follow."""
    for node in gm.graph.nodes:
        cut = node.op == "call_function" and (is_splitting_op(node.target, splitting_ops) or
                                              is_splitting_op(node.target, None))  # fmt: skip
        if cut and _schema(node.target).returns:
            raise ConfigError(
                f"splitting_ops: {op_name(node.target)!r} returns tensors; with use_inductor_graph_partition and "
                "piecewise graphs an op Inductor cuts at must write into buffers it is given (as reference::attention "
                "does), or use cudagraph_mode='none'"
            )


def _schema(target) -> torch.FunctionSchema:
    return (target.default if isinstance(target, torch._ops.OpOverloadPacket) else target)._schema


def _check_no_unsafe_op_captured(piece: Piece) -> None:
    """A piece that will be captured must not call an op tagged cudagraph_unsafe (attention): the graph
    would replay it with the metadata of the step it was captured at."""
    for node in piece.module.graph.nodes:
        if node.op == "call_function" and is_splitting_op(node.target, None):
            raise ConfigError(
                f"splitting_ops: {op_name(node.target)!r} (tagged torch.Tag.cudagraph_unsafe: it reads per-step "
                f"metadata) would be captured inside CUDA-graph piece {piece.name}; add it to splitting_ops, leave "
                "splitting_ops at its default (None), or use cudagraph_mode='none'"
            )


def _first_output(artifact: Callable) -> Callable:
    """A loaded Inductor artifact of a piece that returns one tensor: a loaded artifact returns a list even
    then (torch 2.11-2.13 do not restore the output's structure on load; a fresh artifact does)."""
    return lambda *args: artifact(*args)[0]


def _by_name(pieces: list[Piece]):
    """(name, piece) of the pieces that are not splitting ops."""
    return [(p.name, p) for p in pieces if not p.is_splitting_op]


def _dispatch(generic: Callable, static: dict[int, Callable], size_args: tuple[int, ...]) -> Callable:
    """A compiled piece over its static-shape compiles (``compile_sizes``), or the piece itself without them."""
    return SizeDispatch(generic, static, size_args) if static else generic


def _calls_a_splitting_op(gm: torch.fx.GraphModule, splitting_ops: tuple[str, ...] | None) -> bool:
    return any(n.op == "call_function" and is_splitting_op(n.target, splitting_ops) for n in gm.graph.nodes)


def _on_cuda(gm: torch.fx.GraphModule) -> bool:
    values = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    return any(isinstance(v, torch.Tensor) and v.is_cuda for v in values)


class PiecewiseBackend:
    """A torch.compile backend implementing levels 1-3 of :class:`~reference.config.CompilationConfig`.

    The backend keeps only light state: Dynamo holds every backend it was given in a process-wide
    table until ``torch._dynamo.reset()``, so the compiled pieces, CUDA graphs and their memory pool
    live only in the module returned to Dynamo (freed with the compiled model that owns it).

    Args:
        config: the compilation settings.
        stale_outputs: the compiled model's :class:`~reference.compilation.stale_outputs.StaleOutputGuard`
            with ``debug_cudagraph_outputs``, handed to every piece; else None.

    Attributes:
        pieces: the pieces of the graph in execution order (their FX modules, before compilation); set by the
            first compilation.
        before_first_run: None, or a callable the backend calls once, when the pieces are compiled (or loaded
            from the compile cache) and before any of them runs; the runner waits there for its kernel warm-up
            (:mod:`reference.engine.kernel_warm_up`).

    Raises:
        ConfigError: level 0, or (at level 3) a splitting op that is not a registered op; with
            ``cudagraph_mode='piecewise'``, a splitting op that returns tensors (its output would live
            outside the graph pool and move between replays) or an op tagged cudagraph_unsafe left inside
            a captured piece. The last two are found when the graph is split, at the first call, where
            Dynamo wraps them; ``CompiledModel`` unwraps them.
    """

    def __init__(self, config: CompilationConfig, stale_outputs=None):
        if config.level == 0:
            raise ConfigError("level=0 means no compilation; PiecewiseBackend needs level 1, 2 or 3")
        if config.level == 3 and config.splitting_ops:
            # checked here, not at trace time, where Dynamo would wrap the ConfigError in BackendCompilerFailed
            check_splitting_ops_exist(config.splitting_ops)
        self.config = config
        self.stale_outputs = stale_outputs
        self.pieces: list[Piece] = []
        self.cache_writer: CacheWriter | None = None  # set by CompiledModel before a trace it will cache
        self.layer_stamp: LayerStamp | None = None  # set by CompiledModel for a trace of a prefix of the layers
        self.before_first_run: Callable[[], None] | None = None
        self._traced = False

    def __call__(self, gm: torch.fx.GraphModule, example_inputs) -> Callable:
        if self._traced and self.config.level >= 2:
            raise RuntimeError(
                "this model was traced a second time, but levels 2 and 3 trace once (the token dimension is "
                "marked dynamic only on the first call); this happens after torch._dynamo.reset() - build a "
                "new compiled model (compile_model / ModelRunner) after resetting Dynamo"
            )
        extra = None
        if self.layer_stamp is not None:  # before anything counts the graph: a NotStampable leaves a trace to come
            gm, example_inputs, extra = self.layer_stamp.stamp(gm, example_inputs)
        cuts = self.config.splitting_ops if self.config.level == 3 else ()
        partition = self.config.use_inductor_graph_partition  # Inductor cuts the graph, our split keeps one piece
        split, pieces = split_graph(gm, () if partition else cuts)
        if extra is not None:
            check_distinct_inputs(pieces)
            # counted once the stamped graph is taken: a refused one is traced whole, and none of it is left
            compilation_counter.num_layers_stamped += self.layer_stamp.stamped
        self._traced = True
        compilation_counter.num_graphs_seen += 1
        self._check_pieces(pieces)  # before the one-piece warning: a refusal is the whole story
        # Inductor's partition cuts at the tagged ops whatever splitting_ops names
        cut_anywhere = _calls_a_splitting_op(gm, cuts) or (partition and _calls_a_splitting_op(gm, None))
        if cuts != () and not cut_anywhere:
            named = "ops tagged cudagraph_unsafe" if cuts is None else list(cuts)
            warnings.warn(
                f"none of splitting_ops ({named}) is called in the traced graph, so the model is one "
                "piece (attention included, if it is in the graph); splitting ops must be torch.library custom "
                "ops, which Dynamo keeps as graph nodes",
                RuntimeWarning,
                stacklevel=user_stacklevel(),
            )
        size_args = {p.name: _size_args(p) for p in pieces if not p.is_splitting_op}
        if self.cache_writer is not None:  # before the pieces are installed into `split`
            self.cache_writer.traced(gm, example_inputs, split, pieces, size_args, direct_call_spec)
        if partition and self.config.piecewise_graphs:
            _check_partition_cuts_write_into_buffers(gm, cuts)
        with self.partition_graphs(_on_cuda(gm)):
            compiled, static = self._compile(pieces, size_args)
        if self.cache_writer is not None:
            self.cache_writer.compiled(compiled, static)
        compiled = {name: _dispatch(c, static[name], size_args[name]) for name, c in compiled.items()}
        self._install(split, pieces, size_args, compiled, _on_cuda(gm))
        self._ready_to_run()
        return split if extra is None else with_inputs(split, extra)  # Dynamo passes the prefix's inputs only

    @property
    def traced(self) -> bool:
        """Whether a graph has been compiled (or loaded from the compile cache) for this backend."""
        return self._traced

    def _compile(self, pieces: list[Piece], size_args: dict[str, tuple[int, ...]]) -> tuple[dict, dict]:
        """Each piece that is not a splitting op compiled (piece name -> callable), and its static-shape compiles
        (piece name -> token count -> callable). With Inductor, once per program (:mod:`.piece_key`): a piece
        whose key an earlier piece has takes that piece's callables."""
        compiled, static, first_of = {}, {}, {}
        for name, piece in _by_name(pieces):
            key = piece_key(piece.module) if self.config.use_inductor else None
            twin = name if key is None else first_of.setdefault(key, name)
            if twin != name:
                compiled[name], static[name] = compiled[twin], static[twin]
                compilation_counter.num_compiles_shared += 1
                continue
            compiled[name] = compile_piece(piece.module, self.config)
            static[name] = compile_static(piece.module, self.config, size_args[name])
        return compiled, static

    def load(self, entry: Entry, on_cuda: bool) -> Callable:
        """The split module of a compile-cache entry, its pieces as a trace would have installed them:
        Inductor's from the entry's artifacts, the others as their stored code; splitting ops called directly
        where the trace found they could be. Dynamo never sees the model, and no FX graph is built: the
        checks a trace makes on the pieces passed when the entry was written, for the same config.

        ``pieces`` stays empty (no FX module was built). If the entry cannot be built from (its stored code does
        not run), this raises and changes nothing: the model can still be traced. The caller calls
        :meth:`loaded` once whatever else it builds from the entry has succeeded too.
        """
        use_graphs, pool, stream = self._graph_settings(on_cuda)
        runnables = {}
        for stored in entry.pieces:
            name = stored["name"]
            if stored["splitting_op"]:
                direct = stored["direct"]
                runnables[name] = _call_directly(*direct) if direct else StoredModule(stored["source"])
                continue
            runnable = entry.artifacts.get(name) or StoredModule(stored["source"])
            if name in entry.artifacts and stored["returns_one"]:
                runnable = _first_output(runnable)
            static = {size: entry.artifacts[static_artifact(name, size)] for size in stored["compile_sizes"]}
            if stored["returns_one"]:
                static = {size: _first_output(artifact) for size, artifact in static.items()}
            runnable = _dispatch(runnable, static, tuple(stored["size_args"]))
            runnables[name] = self._wrapped(name, runnable, tuple(stored["size_args"]), use_graphs, pool, stream)
        return StoredModule(entry.split, runnables)

    def loaded(self, entry: Entry) -> None:
        """The model now runs what :meth:`load` built from ``entry``: no trace may follow. Counts the pieces as a
        trace would and calls ``before_first_run``."""
        self._traced = True
        compilation_counter.num_piecewise_graphs_seen += len(entry.pieces)
        compilation_counter.num_piecewise_capturable_graphs_seen += sum(not p["splitting_op"] for p in entry.pieces)
        self._ready_to_run()

    def _ready_to_run(self) -> None:
        """Call ``before_first_run`` once."""
        hook, self.before_first_run = self.before_first_run, None
        if hook is not None:
            hook()

    def _check_pieces(self, pieces: list[Piece]) -> None:
        """With piecewise graphs asked for (on any device), every splitting op writes into buffers and no
        piece to be captured calls an op tagged cudagraph_unsafe; counts the pieces."""
        compilation_counter.num_piecewise_graphs_seen += len(pieces)
        for piece in pieces:
            if not piece.is_splitting_op:
                compilation_counter.num_piecewise_capturable_graphs_seen += 1
            if self.config.piecewise_graphs and not self.config.use_inductor_graph_partition:
                (_check_writes_into_buffers if piece.is_splitting_op else _check_no_unsafe_op_captured)(piece)

    def _install(
        self,
        split: torch.fx.GraphModule,
        pieces: list[Piece],
        size_args: dict[str, tuple[int, ...]],
        compiled: dict[str, Callable],
        on_cuda: bool,
    ) -> None:
        """Put each piece's runnable into ``split``: splitting ops called directly where they can be, compiled
        pieces (``compiled``: piece name -> callable) wrapped in CUDA graphs when the config asks and the
        model is on CUDA."""
        use_graphs, pool, stream = self._graph_settings(on_cuda)
        for piece in pieces:
            if piece.is_splitting_op:
                runnable = _direct_splitting_call(piece)
                if runnable is None:
                    continue
            else:
                compiled_piece = compiled[piece.name]
                runnable = self._wrapped(piece.name, compiled_piece, size_args[piece.name], use_graphs, pool, stream)
            # GraphModule code calls `self.<name>(...)`; an instance attribute shadows the submodule.
            split.__dict__[piece.name] = runnable
        self.pieces = pieces

    def _graph_settings(self, on_cuda: bool, partitions: bool = False) -> tuple[bool, object, object]:
        """Whether compiled pieces (or, ``partitions``, Inductor's partitions) get CUDA graphs, and the memory
        pool and capture stream they share. Pieces get none under ``use_inductor_graph_partition``: their
        partitions have the graphs."""
        use_graphs = self.config.piecewise_graphs and on_cuda and self.config.use_inductor_graph_partition == partitions
        if not use_graphs:
            return False, None, None
        return True, torch.cuda.graph_pool_handle(), torch.cuda.Stream()

    def partition_graphs(self, on_cuda: bool):
        """The block in which Inductor compiles, or the compile cache loads Inductor's artifacts: with
        ``use_inductor_graph_partition`` and piecewise graphs on CUDA, each partition it makes or loads is
        installed in a :class:`PartitionGraph` (one pool and capture stream for them all)."""
        use_graphs, pool, stream = self._graph_settings(on_cuda, partitions=True)
        if not use_graphs:
            return partition_wrappers(None)
        c = self.config
        return partition_wrappers(
            lambda fn, index: PartitionGraph(fn, index, c.cudagraph_capture_sizes, c.cudagraph_num_of_warmups, pool,
                                             stream, c.debug_cudagraph_addresses, self.stale_outputs)  # fmt: skip
        )

    def _wrapped(self, name, runnable, size_args, use_graphs, pool, stream) -> Callable:
        """A compiled piece, in a :class:`CUDAGraphPiece` when ``use_graphs``."""
        if not use_graphs:
            return runnable
        return CUDAGraphPiece(
            name=name,
            runnable=runnable,
            size_args=size_args,
            capture_sizes=self.config.cudagraph_capture_sizes,
            num_warmups=self.config.cudagraph_num_of_warmups,
            pool=pool,
            stream=stream,
            debug_addresses=self.config.debug_cudagraph_addresses,
            stale_outputs=self.stale_outputs,
        )
