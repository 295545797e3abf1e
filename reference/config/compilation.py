"""``CompilationConfig``: how a model is traced, split, compiled and captured into CUDA graphs.

The field names and their meaning follow vLLM's ``CompilationConfig`` so that a vLLM user can pass the
same dictionary (``{'level': 3, 'use_inductor': False, 'custom_ops': ['all']}``). Where vLLM is loose we
are strict, on purpose:

* Every field is validated when the config is built, and a bad value names the field and the allowed
  values. vLLM accepts unknown keys in some versions and clips contradictory settings silently.
* Defaults that depend on other fields (``cudagraph_mode``, the custom-op default) are resolved here,
  once, and shown by ``describe()``, instead of being patched later by whichever component runs first.
* Combinations that cannot mean what the user wrote (piecewise graphs of a whole-graph compile, an
  Inductor config with Inductor off, capture sizes that disagree with their maximum, full graphs of steps
  our attention cannot run inside a graph) are errors, where vLLM downgrades them with a log line.

This module knows nothing of ops or models. Which names in ``custom_ops`` and ``splitting_ops`` exist
is checked where the names meet the ops: ``CustomOpSelection`` (reference.ops) for custom ops, the
piecewise backend for splitting ops.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from reference.config.parsing import (
    ConfigError,
    check_choice,
    check_int,
    check_type,
    config_fields,
    echo,
    string_tuple,
)
from reference.config.vllm_names import translate

LEVELS = {
    0: "no compilation: the model runs as plain PyTorch",
    1: "Dynamo as is: torch.compile with guards and recompilation, whole graph, no CUDA graphs",
    2: "Dynamo once: one trace with a dynamic token dimension, guards dropped, whole graph",
    3: "piecewise: one trace, split at splitting ops, pieces compiled and captured as CUDA graphs",
}
# vLLM's CUDAGraphMode names, in lower case (vLLM's capitals are read as these, see vllm_names).
CUDAGRAPH_MODES = ("none", "piecewise", "full_decode_only", "full_and_piecewise", "full")
PIECEWISE_GRAPH_MODES = ("piecewise", "full_and_piecewise")
FULL_GRAPH_MODES = ("full_decode_only", "full_and_piecewise", "full")
# vLLM's largest default capture size (tokens).
DEFAULT_MAX_CAPTURE_SIZE = 512
# Largest allowed capture size (tokens): far above any single-GPU step; the bound only stops a typo from
# building a list of millions of sizes.
MAX_CAPTURE_SIZE = 65536
# Fields whose default depends on other fields; remembered so `for_eager` can tell a user's choice
# from a default it may override.
_DEPENDENT_DEFAULTS = ("level", "cudagraph_mode")


# The Inductor settings use_inductor_graph_partition sets (reference.compilation.compile_piece.partition_patches)
PARTITION_INDUCTOR_SETTINGS = ("graph_partition", "custom_should_partition_ops", "post_grad_custom_pre_pass")


def default_capture_sizes(max_size: int) -> tuple[int, ...]:
    """Capture sizes 1, 2, 4, then every multiple of 8, up to and including ``max_size`` (tokens).

    The pattern is vLLM's (small batches are common in decode, larger ones are rarer and padding to the
    next multiple of 8 wastes at most 7 tokens). Unlike some vLLM versions, ``max_size`` itself is always
    kept even when it is not a multiple of 8, so a runner sized for ``max_size`` tokens never falls back
    to running without graphs at its own maximum.
    """
    sizes = {s for s in (1, 2, 4) if s <= max_size}
    sizes.update(range(8, max_size + 1, 8))
    sizes.add(max_size)
    return tuple(sorted(sizes))


@dataclass(frozen=True)
class CompilationConfig:
    """How the model is compiled. Build it with keywords or with :meth:`parse`.

    Fields (defaults in brackets):

    * ``level`` [3]: 0, 1, 2 or 3, see ``LEVELS``.
    * ``use_inductor`` [True]: compile each piece (or the whole graph at levels 1-2) with Inductor; when
      False the pieces stay as eager FX code, which is still captured into CUDA graphs at level 3.
    * ``custom_ops`` [[]]: which :class:`~reference.ops.custom_op.CustomOp` layers use their custom
      (opaque, hand-fused) implementation instead of ``forward_native``. Entries: ``'all'``, ``'none'``,
      ``'+name'``, ``'-name'``. With no ``'all'``/``'none'`` the default is *all* when Inductor does not
      compile the model (level 0, or ``use_inductor=False``) and *none* when it does, since Inductor fuses
      the native code itself.
    * ``splitting_ops`` [None]: qualified torch.library op names (``ns::name``) at which the graph is
      split (level 3) or the breakable capture is broken (level 0); these run eagerly between CUDA
      graphs. ``None`` (vLLM's default spelling) splits at every op tagged ``torch.Tag.cudagraph_unsafe``:
      the project declares its KV-cache attention op so where it defines it. ``[]`` keeps one whole graph.
    * ``cudagraph_mode`` ['piecewise' at level 3, else 'none'] (vLLM's ``CUDAGraphMode``):

      - ``'none'``: no CUDA graphs.
      - ``'piecewise'``: every step of a capture size replays one graph per piece, attention runs
        eagerly between them. At level 3 the pieces are the split Dynamo graph; at level 0 they are
        *breakable* graphs: the eager model's kernels, captured into segments broken at the splitting
        ops (no trace, no compile). Levels 1-2 compile one whole graph and cannot be piecewise.
      - ``'full_decode_only'``: a uniform decode step (one new token per sequence) of a capture size
        replays one graph of the whole forward, attention included; attention then reads its per-step
        metadata from static device buffers. Other steps run without graphs. Any level.
      - ``'full_and_piecewise'``: full graphs for uniform decode steps, piecewise for the rest (vLLM's
        current default). Level 3 or level 0 (breakable pieces).

      - ``'full'``: every step of a capture size, prefill, mixed and decode alike, replays one graph of
        the whole forward, one graph per size (vLLM's ``FULL``); attention inside it reads every per-step
        value from static tables. Steps above the largest capture size run without graphs. Any level.

      The full modes need an attention that declares it can serve such steps inside a graph
      (:class:`~reference.ops.attention.AttentionCGSupport`); where it does not (CUDA in a dtype without
      the Triton kernels), the runner lowers the mode with one warning line, as vLLM does: for an
      attention that serves decodes only, ``'full'`` to ``'full_and_piecewise'`` (``'full_decode_only'``
      without pieces: levels 1-2 or ``splitting_ops=[]``); for one that serves none, ``'full'`` and
      ``'full_and_piecewise'`` to ``'piecewise'`` (``'none'`` without pieces), ``'full_decode_only'`` to
      ``'none'``.
    * ``cudagraph_capture_sizes`` [1, 2, 4, 8, 16, ... up to ``max_cudagraph_capture_size``]: token
      counts that get a CUDA graph; deduplicated and sorted. Full decode graphs are captured at the sizes
      a decode step can have (at most the runner's ``max_num_seqs``); under ``'full'``, at the sizes any
      step can have (at most its ``max_num_batched_tokens``).
    * ``max_cudagraph_capture_size`` [512]: largest captured token count (vLLM's default maximum).
    * ``cudagraph_num_of_warmups`` [1]: eager runs of a piece at a size before that size is captured, so
      lazy initialisation (cuBLAS handles, autotuning, Triton loading a kernel) happens outside the graph; at
      least one, so 0 (vLLM's default) runs as 1
      (:func:`~reference.compilation.cuda_graph.plain_runs_before_capture` says why).
    * ``inductor_compile_config`` [{}]: Inductor config patches, e.g. ``{'max_autotune': True}``;
      ``'triton.cudagraphs': True`` (Inductor's own CUDA graphs) only with ``cudagraph_mode='none'``: the graphs
      have one owner.
    * ``compile_sizes`` [[]] (vLLM's field): token counts at which Inductor also compiles each piece with static
      shapes, beside the one symbolic-shape compile that serves every other count; a call at such a count runs
      that compile (inside its CUDA graph when the count is also a capture size). Ints in 1..65536, or the
      string ``'cudagraph_capture_sizes'`` for every capture size (refused with ``cudagraph_mode='none'``,
      which captures none); resolved to a sorted tuple of ints. Levels 2-3 with ``use_inductor`` only:
      vLLM accepts the field without Inductor, where it changes nothing. The engine also refuses a size no
      step can run at (:class:`~reference.engine.ModelRunner`: steps are padded to capture sizes), and drops
      sizes above its step limit with a warning.
    * ``use_inductor_graph_partition`` [False] (vLLM's field): Inductor compiles the whole traced graph and
      partitions it itself at the splitting ops (``torch._inductor.config.graph_partition``; the ops tagged
      ``cudagraph_unsafe``, plus ``splitting_ops`` when given), instead of the project's FX split; with
      piecewise graphs each of its partitions is captured per capture size by the project's wrapper
      (:mod:`reference.compilation.partition_graph`). Level 3 with ``use_inductor`` only; sets Inductor's
      ``graph_partition``, ``custom_should_partition_ops`` and ``post_grad_custom_pre_pass`` (a pass that puts
      into Inductor's cache keys whether partitions are wrapped: pytorch#165471), which
      ``inductor_compile_config`` may then not set.
    * ``stamp_layers`` [True]: at levels 2-3, for a model that declares its repeated decoder layers
      (``repeated_layers()``), Dynamo traces a prefix of them (4 of Llama's 32) and the graph is completed with
      copies of the last traced layers, checked against the trace, before it is split
      (:mod:`reference.compilation.stamp`); False traces every layer. The graph is the same either way: the
      switch exists to measure the trace it saves and to rule stamping out. The project's own; vLLM traces
      every layer.
    * ``debug_cudagraph_addresses`` [False]: on every replay check that each input tensor lives at the
      address it had at capture; raises naming the piece and size. Costs a check per piece per replay.
    * ``debug_cudagraph_outputs`` [False]: a graph output (valid until the model's next call, which
      replays over it) raises on any access once a later call has replayed, naming the piece (or
      segments, or full graph) and the size that produced it (:mod:`reference.compilation.stale_outputs`;
      torch's graph trees do the same). Costs fresh views per replay; off, nothing runs.
    * ``cache_dir`` ['']: the compile cache's folder (levels 2-3; :mod:`reference.compilation.compile_cache`);
      empty: ``$REFERENCE_COMPILE_CACHE``, else ``~/.cache/piecewise-reference/torch_compile_cache``; a relative
      path is relative to each process's working folder.
      ``REFERENCE_DISABLE_COMPILE_CACHE=1`` turns the cache off. vLLM's field of the same name.

    Raises:
        ConfigError: a field has the wrong type or value, or two fields contradict each other.
    """

    level: int | None = None
    use_inductor: bool = True
    custom_ops: tuple[str, ...] = ()
    splitting_ops: tuple[str, ...] | None = None
    cudagraph_mode: str | None = None
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    cudagraph_num_of_warmups: int = 1
    inductor_compile_config: Mapping[str, Any] = field(default_factory=dict)
    compile_sizes: tuple[int | str, ...] | None = None  # resolved to a tuple of ints
    use_inductor_graph_partition: bool = False
    stamp_layers: bool = True
    debug_cudagraph_addresses: bool = False
    debug_cudagraph_outputs: bool = False
    cache_dir: str = ""
    # The dependent fields the caller set explicitly (not a constructor argument).
    _explicit: frozenset[str] = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "_explicit", frozenset(f for f in _DEPENDENT_DEFAULTS if getattr(self, f) is not None))
        if self.level is None:
            set_(self, "level", 3)
        check_choice("level", self.level, tuple(LEVELS))
        check_type("use_inductor", self.use_inductor, bool)
        check_type("use_inductor_graph_partition", self.use_inductor_graph_partition, bool)
        check_type("stamp_layers", self.stamp_layers, bool)
        check_type("debug_cudagraph_addresses", self.debug_cudagraph_addresses, bool)
        check_type("debug_cudagraph_outputs", self.debug_cudagraph_outputs, bool)
        if isinstance(self.cache_dir, os.PathLike):
            set_(self, "cache_dir", os.fspath(self.cache_dir))
        check_type("cache_dir", self.cache_dir, str)
        if "\0" in self.cache_dir or (self.cache_dir and not self.cache_dir.strip()):
            raise ConfigError(
                f"cache_dir: expected a folder path (or '' for the default), got {echo(self.cache_dir)}: "
                "a path holds no NUL character and is not only spaces"
            )
        set_(self, "custom_ops", string_tuple("custom_ops", self.custom_ops))
        _validate_custom_ops(self.custom_ops)
        if self.splitting_ops is not None:
            set_(self, "splitting_ops", string_tuple("splitting_ops", self.splitting_ops))
            _validate_splitting_op_names(self.splitting_ops)
        if self.cudagraph_mode is None:
            set_(self, "cudagraph_mode", "piecewise" if self.level == 3 else "none")
        check_choice("cudagraph_mode", self.cudagraph_mode, CUDAGRAPH_MODES)
        check_int("cudagraph_num_of_warmups", self.cudagraph_num_of_warmups, minimum=0)
        self._resolve_capture_sizes()
        self._resolve_compile_sizes()
        if not isinstance(self.inductor_compile_config, Mapping) or not all(
            isinstance(k, str) for k in self.inductor_compile_config
        ):
            raise ConfigError(
                "inductor_compile_config: expected a dict with string keys (Inductor config names), "
                f"got {echo(self.inductor_compile_config)}"
            )
        set_(self, "inductor_compile_config", dict(self.inductor_compile_config))
        _validate_inductor_config(self.inductor_compile_config)
        self._check_contradictions()

    def _resolve_capture_sizes(self) -> None:
        sizes, max_size = self.cudagraph_capture_sizes, self.max_cudagraph_capture_size
        if max_size is not None:
            check_int("max_cudagraph_capture_size", max_size, minimum=1, maximum=MAX_CAPTURE_SIZE)
        if sizes is None:
            sizes = default_capture_sizes(DEFAULT_MAX_CAPTURE_SIZE if max_size is None else max_size)
        else:
            if not isinstance(sizes, (list, tuple)):
                raise ConfigError(f"cudagraph_capture_sizes: expected a list of positive ints, got {echo(sizes)}")
            for s in sizes:
                check_int("cudagraph_capture_sizes", s, minimum=1, maximum=MAX_CAPTURE_SIZE)
            sizes = tuple(sorted(set(sizes)))
            largest = max(sizes, default="none: the list is empty")
            if max_size is not None and largest != max_size:
                raise ConfigError(
                    f"cudagraph_capture_sizes (largest {largest}) and max_cudagraph_capture_size "
                    f"({max_size}) disagree; give one of them, or make the largest size equal the maximum"
                )
        object.__setattr__(self, "cudagraph_capture_sizes", sizes)
        object.__setattr__(self, "max_cudagraph_capture_size", max(sizes) if sizes else 0)

    def _resolve_compile_sizes(self) -> None:
        sizes = () if self.compile_sizes is None else self.compile_sizes
        allowed = (
            f"a list whose items are ints in 1..{MAX_CAPTURE_SIZE} (token counts) or the string "
            "'cudagraph_capture_sizes' (every capture size)"
        )
        if not isinstance(sizes, (list, tuple)):
            hint = "; write ['cudagraph_capture_sizes']" if sizes == "cudagraph_capture_sizes" else ""
            raise ConfigError(f"compile_sizes: expected {allowed}, got {echo(sizes)}{hint}")
        resolved: set[int] = set()
        for size in sizes:
            if size == "cudagraph_capture_sizes":
                if self.cudagraph_mode == "none":
                    raise ConfigError(
                        "compile_sizes: 'cudagraph_capture_sizes' names the sizes CUDA graphs capture, but "
                        "cudagraph_mode='none' captures none; list the token counts instead"
                    )
                resolved.update(self.cudagraph_capture_sizes)
            elif isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CAPTURE_SIZE:
                raise ConfigError(f"compile_sizes: expected {allowed}, got item {echo(size)}")
            else:
                resolved.add(size)
        object.__setattr__(self, "compile_sizes", tuple(sorted(resolved)))

    def _check_contradictions(self) -> None:
        mode = self.cudagraph_mode
        if self.piecewise_graphs and self.level not in (0, 3):
            raise ConfigError(
                f"cudagraph_mode={mode!r} needs level=3 (the piecewise backend) or level=0 (breakable graphs of "
                f"the eager model), got level={self.level}, which compiles one whole graph; use level 0 or 3, or "
                "cudagraph_mode='none' or 'full_decode_only'"
            )
        if mode != "none" and not self.cudagraph_capture_sizes:
            raise ConfigError(
                f"cudagraph_capture_sizes is empty but cudagraph_mode={mode!r}; "
                "give at least one size or set cudagraph_mode='none'"
            )
        if self.inductor_compile_config and not self.use_inductor:
            raise ConfigError("inductor_compile_config is set but use_inductor=False; drop one of them")
        if self.compile_sizes and self.level < 2:
            raise ConfigError(
                f"compile_sizes is set but level={self.level}: static-shape compiles sit beside the one "
                "symbolic-shape trace of levels 2-3; drop compile_sizes or use level 2 or 3 with Inductor"
            )
        if self.compile_sizes and not self.use_inductor:
            raise ConfigError(
                "compile_sizes is set but use_inductor=False: static-shape compiles are Inductor's (without it a "
                "piece is the same FX code at every size); drop compile_sizes or set use_inductor=True"
            )
        if self.inductor_compile_config and self.level == 0:
            raise ConfigError("inductor_compile_config is set but level=0 compiles nothing; drop it or use level >= 1")
        if self.cache_dir and self.level < 2:
            raise ConfigError(
                f"cache_dir is set but level={self.level}; the compile cache serves levels 2 and 3 (traced once), "
                "level 1 uses torch's own caches; drop cache_dir or use level 2 or 3"
            )
        if self.use_inductor_graph_partition and not (self.level == 3 and self.use_inductor):
            raise ConfigError(
                f"use_inductor_graph_partition=True needs level=3 and use_inductor=True (Inductor partitions the graph "
                f"it compiles whole), got level={self.level}, use_inductor={self.use_inductor}; drop it or use those"
            )
        if self.use_inductor_graph_partition and self.splitting_ops == ():
            raise ConfigError(
                "use_inductor_graph_partition=True with splitting_ops=[]: [] asks for one uncut graph, but Inductor's "
                "partition always cuts at the ops tagged cudagraph_unsafe; drop one of them"
            )
        overridden = sorted(set(self.inductor_compile_config) & set(PARTITION_INDUCTOR_SETTINGS))
        if self.use_inductor_graph_partition and overridden:
            raise ConfigError(
                f"inductor_compile_config sets {overridden}, which use_inductor_graph_partition=True sets itself "
                "(its partitions, and a pre-pass keying whether they are wrapped: pytorch#165471); drop them from "
                "inductor_compile_config"
            )
        if self.inductor_compile_config.get("triton.cudagraphs") is True and self.cudagraph_mode != "none":
            raise ConfigError(
                "inductor_compile_config: 'triton.cudagraphs'=True has Inductor capture CUDA graphs of its own inside "
                "the ones cudagraph_mode captures; keep one owner of the graphs: drop it, or set cudagraph_mode='none'"
            )
        if self.splitting_ops is not None and not (self.level == 3 or self.breakable):
            raise ConfigError(
                "splitting_ops only apply at level=3 (piecewise) or to breakable graphs (level=0 with cudagraph_mode "
                f"'piecewise' or 'full_and_piecewise'), got level={self.level}, cudagraph_mode={mode!r}; remove "
                "splitting_ops or use one of those"
            )

    # ------------------------------------------------------------------ derived settings
    @property
    def piecewise_graphs(self) -> bool:
        """True when steps that are not full-graph steps replay piecewise graphs."""
        return self.cudagraph_mode in PIECEWISE_GRAPH_MODES

    @property
    def full_graphs(self) -> bool:
        """True when some steps (uniform decode steps at least) replay one graph of the whole forward."""
        return self.cudagraph_mode in FULL_GRAPH_MODES

    @property
    def full_graphs_of_every_step(self) -> bool:
        """True when prefill and mixed steps replay full graphs too (``cudagraph_mode='full'``)."""
        return self.cudagraph_mode == "full"

    @property
    def breakable(self) -> bool:
        """True for breakable piecewise graphs: level 0 (no trace) with piecewise graphs."""
        return self.level == 0 and self.piecewise_graphs

    @property
    def inductor_compiles_model(self) -> bool:
        """True when Inductor generates the model's code (level >= 1 and ``use_inductor``)."""
        return self.level > 0 and self.use_inductor

    @property
    def custom_ops_default(self) -> bool:
        """Whether a custom op not named in ``custom_ops`` (and with no 'all'/'none') is enabled."""
        if "all" in self.custom_ops:
            return True
        if "none" in self.custom_ops:
            return False
        return not self.inductor_compiles_model

    def for_eager(self) -> "CompilationConfig":
        """This config with ``enforce_eager`` applied: level 0 and no CUDA graphs.

        Raises:
            ConfigError: the caller explicitly asked for compilation (level >= 1), CUDA graphs or compile
                sizes, which ``enforce_eager`` cannot honour. vLLM silently overrides such settings instead.
        """
        if "level" in self._explicit and self.level != 0:
            raise ConfigError(
                f"enforce_eager=True contradicts compilation_config level={self.level}; "
                "drop enforce_eager or set level=0"
            )
        if self.compile_sizes:
            raise ConfigError(
                f"enforce_eager=True contradicts compile_sizes={list(self.compile_sizes)} (Inductor's static-shape "
                "compiles); drop one of them"
            )
        if self.use_inductor_graph_partition:
            raise ConfigError(
                "enforce_eager=True contradicts use_inductor_graph_partition=True (Inductor's partitions of a "
                "compiled graph); drop one of them"
            )
        if "cudagraph_mode" in self._explicit and self.cudagraph_mode != "none":
            raise ConfigError(
                f"enforce_eager=True contradicts cudagraph_mode={self.cudagraph_mode!r}; "
                "drop enforce_eager or set cudagraph_mode='none'"
            )
        return dataclasses.replace(
            self,
            level=0,
            cudagraph_mode="none",
            splitting_ops=None,
            inductor_compile_config={},
            cache_dir="",
        )

    def describe(self) -> dict[str, Any]:
        """The resolved settings as a JSON-serialisable dict (for logs and result files)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    @classmethod
    def parse(cls, value: "CompilationConfig | Mapping[str, Any] | str | int | None") -> "CompilationConfig":
        """Build a config from a config, a dict, a JSON string, a Python-literal string or a level.

        ``"3"`` and ``3`` mean ``{'level': 3}``; ``'{"use_inductor": false}'`` is JSON;
        ``"{'use_inductor': False, 'custom_ops': ['all']}"`` is read with ``ast.literal_eval`` (never
        ``eval``). ``None`` gives the defaults. A config is returned as it is. vLLM's current spellings
        (``mode``, ``backend``, ``'PIECEWISE'``) are read as the seed's (:mod:`reference.config.vllm_names`).

        Raises:
            ConfigError: the string is neither JSON nor a Python literal, the value is not a dict, or a
                key is unknown (the message lists the known keys), or a value is invalid.
        """
        if isinstance(value, cls):
            return value
        fields = translate(config_fields(value))  # vLLM's mode / backend / capital cudagraph_mode too
        known = {f.name for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(fields) - known, key=repr)  # keys of a literal dict may be of mixed types
        if unknown:
            raise ConfigError(f"compilation config: unknown key(s) {unknown}; known keys: {sorted(known)}")
        return cls(**fields)


# ---------------------------------------------------------------------- field checks
def _validate_splitting_op_names(names: tuple[str, ...]) -> None:
    """Each name is ``namespace::op``, given once; whether it is a registered op is the backend's check."""
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"splitting_ops: {echo(name)} is given twice; name each op once")
        if name.count("::") != 1 or not all(name.split("::")):
            raise ConfigError(
                f"splitting_ops: {echo(name)} is not a qualified op name; expected 'namespace::op', "
                "e.g. 'reference::attention'"
            )


def _validate_custom_ops(entries: tuple[str, ...]) -> None:
    """Check the form of ``custom_ops`` entries and that they do not contradict each other.

    Whether a named op exists is checked by ``CustomOpSelection``, which holds the registry of ops.
    """
    allowed = "'all', 'none', or '+name'/'-name' with name a custom op (reference.ops.registered_custom_ops())"
    if "all" in entries and "none" in entries:
        raise ConfigError("custom_ops: 'all' and 'none' contradict each other; keep one")
    signs: dict[str, str] = {}
    for entry in entries:
        if entry in ("all", "none"):
            continue
        sign, name = entry[:1], entry[1:]
        if sign not in ("+", "-") or not name.isidentifier():
            raise ConfigError(f"custom_ops: {echo(entry)} is not valid; expected {allowed}")
        if signs.setdefault(name, sign) != sign:
            raise ConfigError(f"custom_ops: '+{name}' and '-{name}' contradict each other; keep one")


def _validate_inductor_config(patches: dict[str, Any]) -> None:
    """Keys must be Inductor config names; values of bool/int/float/str options must have that type."""
    if not patches:
        return
    import difflib

    import torch._inductor.config as inductor_config

    known = inductor_config.get_config_copy()
    for key, value in patches.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=3)
            hint = f"; did you mean {close}?" if close else "; see torch._inductor.config"
            raise ConfigError(f"inductor_compile_config: {echo(key)} is not an Inductor config option{hint}")
        default = known[key]
        if isinstance(default, (bool, int, float, str)) and default is not None:
            expected = type(default)
            ok = isinstance(value, expected) and (expected is bool or not isinstance(value, bool))
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                ok = True
            if not ok:
                raise ConfigError(
                    f"inductor_compile_config: {key!r} expects {expected.__name__} (default {default!r}), "
                    f"got {echo(value)}"
                )
