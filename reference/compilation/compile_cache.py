"""The compile cache's entries: what a warm start needs to skip Dynamo's trace, the split and Inductor (levels 2-3).

A compiled model's first call looks its entry up by its key (:mod:`.cache_key`). A hit rebuilds the split
module from the entry and calls it directly, with no Dynamo at all: levels 2-3 drop Dynamo's guards anyway,
and an entry records where each graph input comes from (a parameter or buffer by name, an argument, an
argument's token count). A miss traces and compiles as usual and writes the entry once the first call has
returned (its return value says how the graph's outputs make the model's output).

An entry is a folder ``<cache folder>/<key>/``:

* ``factors.json``: the key's factors, readable (``git diff --no-index`` two of them to see why one missed);
* ``entry.json``: the split module's and each piece's generated code (the FX code, no graph: rebuilding
  graphs means tracing the code again), where each graph input comes from, how the graph's outputs make the
  model's, each piece's size arguments and how a splitting op is called;
* ``<piece>.bin``: a piece's Inductor artifact (``torch._inductor.CompiledArtifact``, binary format), and
  ``<piece>@<size>.bin`` its static-shape compile at each of ``compile_sizes``; pieces that share one compile
  (:mod:`.piece_key`) share its file, named after the first of them, and a hit loads it once;
* ``manifest.json``: written last, the size and SHA-256 of every other file.

Writes go to a temporary folder beside the entry, renamed into place, so a reader sees a whole entry or
none, and two processes starting at once both compile and one rename wins. A reader checks the manifest's
sizes and hashes and that the stored factors equal its own; an entry that fails (truncated, corrupt,
foreign, unreadable, stored code that does not run) is one warning line and a recompile, whose entry
replaces it. Triton's kernels (the custom ops' and Inductor's) are cached by Triton itself
(``TRITON_CACHE_DIR``, default ``~/.triton/cache``).

A hit runs the stored code and loads pickled artifacts, as torch's and vLLM's caches do: the cache folder
must be as trusted as the code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch
from torch import nn

from reference.compilation.cache_key import is_json
from reference.compilation.counters import compilation_counter

T = TypeVar("T")
_MANIFEST, _FACTORS, _META = "manifest.json", "factors.json", "entry.json"

# Where a graph input comes from at a call: ("tensor", attribute path), ("arg", index) or ("size", arg index,
# dim): the token count of an argument, which Dynamo passes as a SymInt input.
Binding = tuple


def bind_inputs(gm: torch.fx.GraphModule, example_inputs, model: nn.Module, args: tuple) -> list[Binding] | str:
    """Where each of Dynamo's graph inputs comes from, found by identity: ``example_inputs`` are the very
    parameters, buffers and argument tensors of the traced call, and a SymInt input is the size of an
    argument whose recorded shape holds the same symbol.

    Returns:
        One binding per graph input, or a one-line reason why some input cannot be bound (then nothing is
        cached: a warm start could not feed the graph).
    """
    tensors = {id(t): name for name, t in model.named_parameters(remove_duplicate=False)}
    tensors.update({id(t): name for name, t in model.named_buffers(remove_duplicate=False)})
    arg_index = {id(a): i for i, a in enumerate(args) if isinstance(a, torch.Tensor)}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    sizes = {}  # symbol -> (arg index, dim), from the argument placeholders' recorded shapes
    for node, value in zip(placeholders, example_inputs):
        fake = node.meta.get("example_value")
        if id(value) in arg_index and isinstance(fake, torch.Tensor):
            for dim, size in enumerate(fake.shape):
                if isinstance(size, torch.SymInt):
                    sizes.setdefault(str(size.node.expr), (arg_index[id(value)], dim))
    bindings: list[Binding] = []
    for node, value in zip(placeholders, example_inputs):
        fake = node.meta.get("example_value")
        if id(value) in arg_index:
            bindings.append(("arg", arg_index[id(value)]))
        elif id(value) in tensors:
            bindings.append(("tensor", tensors[id(value)]))
        elif isinstance(fake, torch.SymInt) and str(fake.node.expr) in sizes:
            bindings.append(("size", *sizes[str(fake.node.expr)]))
        else:
            return f"graph input {node.name!r} is neither a parameter, a buffer, an argument nor an argument's size"
    return bindings


def output_spec(graph_outputs, output) -> Binding | str:
    """How the model's return value is made of the graph's outputs: ``("one", i)`` or ``("tuple", [i, ...])``;
    else a one-line reason."""
    index = {id(t): i for i, t in enumerate(graph_outputs)}
    if id(output) in index:
        return ("one", index[id(output)])
    if isinstance(output, tuple) and output and all(id(t) in index for t in output):
        return ("tuple", [index[id(t)] for t in output])
    return f"the model returned {type(output).__name__}, not graph outputs (a tensor or a tuple of them)"


def bound_call(split: Callable, bindings: list[Binding], outputs: Binding, model: nn.Module) -> Callable:
    """``split`` called with its inputs gathered per ``bindings`` from ``model`` and a call's arguments,
    returning the model's output per ``outputs``: the warm start's forward, with no Dynamo.

    Raises:
        KeyError: a bound parameter or buffer name the model does not have (a mismatched model).
    """
    named = dict(model.named_parameters(remove_duplicate=False))
    named.update(model.named_buffers(remove_duplicate=False))
    template = [named[b[1]] if b[0] == "tensor" else None for b in bindings]
    per_call = [(i, b) for i, b in enumerate(bindings) if b[0] != "tensor"]
    kind, which = outputs

    def call(*args):
        inputs = list(template)
        for i, b in per_call:
            inputs[i] = args[b[1]] if b[0] == "arg" else args[b[1]].shape[b[2]]
        result = split(*inputs)
        return result[which] if kind == "one" else tuple(result[i] for i in which)

    return call


def module_source(gm: torch.fx.GraphModule) -> dict[str, str] | str:
    """A GraphModule's generated ``forward`` as source: the imports its code needs and the code; or a
    one-line reason it cannot be stored (it reads attributes of its own: constants, submodules that are not
    the split's pieces). The import block is FX's own, the one GraphModule pickling writes."""
    from torch.fx.graph_module import _format_import_block
    from torch.package import sys_importer

    own = [n for n in gm.graph.nodes if n.op == "get_attr" or (n.op == "call_module" and "." in str(n.target))]
    if own:
        return f"graph module reads {own[0].op} {own[0].target!r}, which the stored code cannot hold"
    python_code = gm.graph.python_code(root_module="self")
    return {"imports": _format_import_block(python_code.globals, sys_importer), "code": python_code.src}


class StoredModule:
    """A stored GraphModule's ``forward`` run as plain Python, with no FX graph built (building one means
    tracing its code again, which made most of a warm start: perf/NOTES.md, v15).

    Args:
        source: :func:`module_source`'s dict.
        children: attribute name -> callable, for the code's ``self.<name>(...)`` calls (the split's pieces).
    """

    def __init__(self, source: dict[str, str], children: dict[str, Callable] | None = None):
        namespace: dict[str, Any] = {}
        exec(compile(source["imports"] + source["code"], "<compile cache>", "exec"), namespace)
        self._forward = namespace["forward"]
        self.__dict__.update(children or {})

    def __call__(self, *args):
        return self._forward(self, *args)


@dataclass
class Entry:
    """What an entry holds, as read.

    Attributes:
        split: the split module's source (:func:`module_source`), calling ``self.<piece name>(...)``.
        pieces: per piece, in order: ``name``, ``splitting_op``, ``source``, and for a splitting op ``direct``
            (the backend's ``direct_call_spec`` or None), else ``size_args`` (indices of its token-count
            arguments), ``returns_one`` (the piece returns one tensor, not a tuple) and ``compile_sizes`` (the
            token counts of its static-shape artifacts).
        bindings: one :data:`Binding` per input of ``split``.
        outputs: the output spec (:func:`output_spec`).
        artifacts: artifact name (a piece's, or :func:`static_artifact`'s) -> Inductor's compiled piece.
    """

    split: dict[str, str]
    pieces: list[dict[str, Any]]
    bindings: list[Binding]
    outputs: Binding
    artifacts: dict[str, Any] = field(default_factory=dict)


def static_artifact(piece: str, size: int) -> str:
    """The artifact name (``<name>.bin`` in the entry) of ``piece``'s static-shape compile at ``size`` tokens."""
    return f"{piece}@{size}"


def _warn(message: str) -> None:
    warnings.warn(f"compile cache: {message}", RuntimeWarning, stacklevel=3)


def _first_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0][:200]}"


def _check_manifest(path: Path) -> None:
    """The manifest lists exactly the entry's other files, each with its size and SHA-256.

    Raises:
        OSError: the manifest or a file is missing. ValueError: a file differs, one is not listed, or the
            manifest is no JSON object.
    """
    manifest = json.loads((path / _MANIFEST).read_text())
    present = {p.name for p in path.iterdir()} - {_MANIFEST}
    if not isinstance(manifest, dict) or set(manifest) != present or not {_FACTORS, _META} <= present:
        listed = sorted(manifest) if isinstance(manifest, dict) else manifest
        raise ValueError(f"the manifest lists {listed}, the folder holds {sorted(present)}")
    for name, (size, digest) in manifest.items():
        data = (path / name).read_bytes()
        if len(data) != size or hashlib.sha256(data).hexdigest() != digest:
            raise ValueError(f"{name} is {len(data)} bytes and its SHA-256 is not the manifest's")


def read_entry(folder: Path, key: str, factors: dict[str, Any], build: Callable[[Entry], T]) -> T | None:
    """``build(entry)`` for the entry ``folder/key`` if it is whole and its factors are ``factors``; else None:
    a missing entry silently, an unusable one with one warning line naming the reason. Whatever fails while
    the entry is read or built from (a file the manifest leaves out, stored code that does not run) is the
    entry's failure, never the start's: the caller compiles again and its entry replaces this one."""
    path = folder / key
    if not os.path.lexists(path):
        return None
    try:
        _check_manifest(path)
        if json.loads((path / _FACTORS).read_text()) != factors:
            raise ValueError("its factors.json is not this start's (a foreign entry)")
        meta = json.loads((path / _META).read_text())
        from torch._inductor import CompiledArtifact

        files = meta["inductor_artifacts"]  # artifact name -> the file holding it
        loaded = {file: CompiledArtifact.load(path=str(path / f"{file}.bin")) for file in sorted(set(files.values()))}
        artifacts = {name: loaded[file] for name, file in files.items()}
        bindings = [tuple(b) for b in meta["bindings"]]
        return build(Entry(meta["split"], meta["pieces"], bindings, tuple(meta["outputs"]), artifacts))
    except Exception as err:  # any failure to read is the entry's, never the start's: compile again
        _warn(f"entry {path} is unusable ({_first_line(err)}); compiling again")
        return None


def entry_identity(path: Path) -> tuple[int, int] | None:
    """What is at ``path`` now (inode and change time), to tell later whether another process replaced it."""
    try:
        stat = os.lstat(path)
    except OSError:
        return None
    return stat.st_ino, stat.st_ctime_ns


def write_entry(
    folder: Path,
    key: str,
    factors: dict[str, Any],
    files: dict[str, bytes],
    artifacts: dict,
    refused: tuple[int, int] | None = None,
) -> bool:
    """Write an entry as ``folder/key`` (module doc: a temporary folder, the manifest last, a rename).

    Args:
        files: file name -> contents (``entry.json``); ``factors.json`` is added.
        artifacts: file name -> Inductor artifact, saved as ``<name>.bin``.
        refused: :func:`entry_identity` of the entry this start found unusable, which ours replaces; an entry
            found in its place that is something else, and whole, is another process's: it is kept.

    Returns:
        True if this call's entry is now in place; False if the folder could not be written (one warning
        line) or another process's entry took the place first (ours is dropped).
    """
    final = folder / key
    temporary = folder / f".tmp-{key}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        temporary.mkdir(parents=True)
        files = {_FACTORS: (json.dumps(factors, indent=1, sort_keys=True) + "\n").encode(), **files}
        for name, data in files.items():
            (temporary / name).write_bytes(data)
        for name, artifact in artifacts.items():
            artifact.save(path=str(temporary / f"{name}.bin"))
        manifest = {}
        for file in sorted(temporary.iterdir()):
            data = file.read_bytes()
            manifest[file.name] = [len(data), hashlib.sha256(data).hexdigest()]
        (temporary / _MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if os.path.lexists(final):
            if entry_identity(final) != refused and _is_whole(final):  # another process's came first: keep it
                _remove(temporary)
                return False
            trash = folder / f".old-{key}-{uuid.uuid4().hex[:8]}"  # the entry read_entry refused
            os.rename(final, trash)
            _remove(trash)
        os.rename(temporary, final)
        return True
    except Exception as err:  # a folder that cannot be written, an artifact torch cannot save: run uncached
        _remove(temporary)
        if not _is_whole(final):  # else another process renamed its entry into place first
            _warn(f"could not write {final} ({_first_line(err)}); this start is not cached")
        return False


def _is_whole(path: Path) -> bool:
    try:
        _check_manifest(path)
        return True
    except Exception:
        return False


def _remove(path: Path) -> None:
    """Delete a folder or a file, whichever ``path`` is, if it exists."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


class CacheWriter:
    """Collects a cold start's entry while the backend traces and compiles; writes it when the first call
    has returned (:meth:`finish`). Every step that finds the model uncachable says why in one warning line
    and writes nothing.

    Args:
        folder, key, factors: where the entry goes and what it is keyed on
            (:func:`~reference.compilation.cache_key.cache_factors`). Made right after the lookup missed: whatever
            lies at ``folder/key`` now is what the lookup refused.
        model, args: the model and the arguments of the traced call (to bind the graph's inputs).
    """

    def __init__(self, folder: Path, key: str, factors: dict[str, Any], model: nn.Module, args: tuple):
        self.folder, self.key, self.factors = folder, key, factors
        self._refused = entry_identity(folder / key)  # what the lookup found unusable, if anything
        self._model, self._args = model, args
        self._meta: dict[str, Any] | None = None  # set by a trace whose graph can be stored
        self._artifacts: dict[str, Any] = {}
        self._graph_outputs = None
        self._hook = None

    def _give_up(self, reason: str) -> None:
        _warn(f"{reason}; this start is not cached")
        self._meta = self._model = self._args = None

    def traced(self, gm, example_inputs, split, pieces, size_args, direct_call_spec) -> None:
        """Dynamo's graph and example inputs, the split module before its pieces are installed, its pieces
        (:class:`~reference.compilation.split.Piece`), their size arguments and the backend's
        ``direct_call_spec``."""
        bindings = bind_inputs(gm, example_inputs, self._model, self._args)
        if isinstance(bindings, str):
            return self._give_up(bindings)
        sources = {p.name: module_source(p.module) for p in pieces}
        sources["the split module"] = module_source(split)
        unstorable = next((f"{name}: {s}" for name, s in sources.items() if isinstance(s, str)), None)
        if unstorable:
            return self._give_up(unstorable)
        stored = []
        for piece in pieces:
            entry = {"name": piece.name, "splitting_op": piece.is_splitting_op, "source": sources[piece.name]}
            if piece.is_splitting_op:
                direct = direct_call_spec(piece)
                entry["direct"] = direct if is_json(direct) else None  # else the stored code calls the op
            else:
                output = next(n for n in reversed(piece.module.graph.nodes) if n.op == "output")
                returns_one = isinstance(output.args[0], torch.fx.Node)
                entry.update(size_args=size_args[piece.name], returns_one=returns_one)
            stored.append(entry)
        self._meta = {"split": sources["the split module"], "pieces": stored, "bindings": bindings}
        self._hook = split.register_forward_hook(self._record_outputs)

    def _record_outputs(self, _module, _inputs, outputs) -> None:
        self._graph_outputs = outputs
        self._hook.remove()  # the first call only: later calls pay nothing

    def compiled(self, runnables: dict[str, Callable], static: dict[str, dict[int, Callable]]) -> None:
        """The compiled pieces (piece name -> callable) and their static-shape compiles (piece name -> token
        count -> callable): Inductor's artifacts are stored; FX pieces are stored as their code."""
        self._artifacts = {name: r for name, r in runnables.items() if not isinstance(r, torch.fx.GraphModule)}
        for name, by_size in static.items():
            self._artifacts.update({static_artifact(name, size): artifact for size, artifact in by_size.items()})
        for piece in (self._meta or {}).get("pieces", ()):
            if not piece["splitting_op"]:
                piece["compile_sizes"] = sorted(static.get(piece["name"], {}))

    def _artifact_files(self) -> tuple[dict[str, str], dict[str, Any]]:
        """(artifact name -> file name, file name -> artifact): one file per artifact object, named after the
        first (sorted) of the pieces that share it."""
        files, by_object = {}, {}
        for name in sorted(self._artifacts):
            artifact = self._artifacts[name]
            files[name] = by_object.setdefault(id(artifact), name)
        return files, {file: self._artifacts[file] for file in set(files.values())}

    def finish(self, output) -> bool:
        """Write the entry now that the first call returned ``output``; True if written."""
        if self._meta is None:
            return False
        spec = output_spec(self._graph_outputs or (), output)
        if isinstance(spec, str):
            self._give_up(spec)
            return False
        names, artifacts = self._artifact_files()
        meta = {**self._meta, "outputs": spec, "inductor_artifacts": names}
        self._meta = self._model = self._args = None
        files = {_META: (json.dumps(meta, indent=1) + "\n").encode()}
        written = write_entry(self.folder, self.key, self.factors, files, artifacts, self._refused)
        compilation_counter.num_cache_entries_written += written
        return written
