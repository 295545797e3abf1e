"""Dynamo capture: trace a model's forward once, with the token dimension dynamic.

:func:`compile_model` returns a callable with the model's signature. Convention: every tensor argument
of ``forward`` has the token dimension first (``input_ids [T]``, ``positions [T]``, ``x [T, H]``) and
the model returns tensors whose first dimension is T as well.

* Level 0: the model itself; with piecewise graphs, wrapped in breakable graphs (:mod:`.breakable`).
* Level 1 ("Dynamo as is"): ``torch.compile`` with its usual guards; a new shape may recompile.
* Levels 2 and 3 ("Dynamo once", "piecewise"): the first call marks dim 0 of every tensor argument
  dynamic, so one graph serves every token count, and Dynamo's guards are dropped, so later calls never
  re-trace (vLLM gets the same effect by bypassing Dynamo's dispatcher). Dropping the guards is safe for a
  model whose code and parameters do not change after the first call; we re-check the one thing a
  caller can plausibly get wrong, the arguments' dtype, device and non-token dimensions, on every call.

Levels 2 and 3 keep what the first call traced and compiled in the compile cache (:mod:`.compile_cache`),
looked up at the first call: a hit runs the stored split graph directly, without Dynamo. A miss (or no cache)
calls ``CompiledModel.before_trace``, if set, just before Dynamo traces (a first call that raises leaves the
next call a first call, which looks up and calls it again): the runner starts its kernel warm-up
there, which a start served by the cache does not need.

With full graphs (``cudagraph_mode`` ``'full_decode_only'`` or ``'full_and_piecewise'``) the result is
wrapped once more, at any level, in :class:`.full_graph.FullCUDAGraphs`.
"""

from __future__ import annotations

import functools
import types
import warnings
from typing import Callable

import torch
from torch import nn

from reference.compilation.backend import PiecewiseBackend, check_splitting_ops_exist
from reference.compilation.breakable import BreakableCUDAGraphs
from reference.compilation.cache_key import cache_factors, cache_folder, cache_key, uncachable
from reference.compilation.compile_cache import CacheWriter, bound_call, read_entry
from reference.compilation.counters import compilation_counter
from reference.compilation.full_graph import FullCUDAGraphs
from reference.compilation.stale_outputs import StaleOutputGuard
from reference.compilation.stamp import LayerStamp, NotStampable
from reference.compilation.warning_site import user_stacklevel
from reference.config import CompilationConfig, ConfigError


def _own_forward(model: nn.Module) -> Callable:
    """``model.forward`` bound to a private copy of its code object (:func:`_own_function`)."""
    return types.MethodType(_own_function(model), model)


def _own_function(model: nn.Module) -> Callable:
    """``model.forward``'s function (``self`` its first argument) with a private copy of its code object.

    Dynamo caches compiled code per code object, and every model of a class shares ``forward``'s. Each
    compiled model brings its own backend, so to Dynamo a second model of the class is a recompile of
    the first: the ninth would hit its recompile limit, and the entries of dead models (their CUDA
    graphs included) would stay cached. A private code object gives every compiled model exactly one
    cache entry, freed with the model.
    """
    fn = model.forward.__func__
    code = fn.__code__.replace(co_name=fn.__code__.co_name)  # a new, equal code object
    clone = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    clone.__kwdefaults__, clone.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return clone


def _counting_calls(forward: Callable, guard: StaleOutputGuard) -> Callable:
    def call(*args):
        guard.begin_call()
        return forward(*args)

    return call


def _signature(args) -> list:
    return [(a.dtype, a.device, tuple(a.shape[1:])) if isinstance(a, torch.Tensor) else type(a) for a in args]


class CompiledModel:
    """A model's forward, compiled per ``config``. Call it like the model.

    Args:
        model, config: see :func:`compile_model`.
        check_inputs: after the tracing call, check every call's arguments (dtype, device, non-token
            dimensions) against the traced ones, raising ``TypeError`` on a mismatch. A caller that feeds
            slices of its own static buffers, as ``ModelRunner`` does, cannot mismatch and turns the
            per-call check off.

    Attributes:
        backend: the :class:`PiecewiseBackend` (None at level 0).
        breakable: the :class:`BreakableCUDAGraphs` (level 0 with piecewise graphs), else None.
        full_graphs: the :class:`FullCUDAGraphs` (with full graphs), else None.
        before_trace: None, or a callable called once (levels 2-3), at the first call, when it is about to
            trace the model: after the compile cache missed, or with no cache. Not called on a hit. The runner
            starts its kernel warm-up there (:mod:`reference.engine.kernel_warm_up`).
        layer_stamp: levels 2-3 with ``stamp_layers``, for a model that declares repeated layers with enough of
            them: the :class:`~.stamp.LayerStamp` of its tracing call (Dynamo traces ``layer_stamp.prefix``
            layers); else None.
    """

    def __init__(self, model: nn.Module, config: CompilationConfig, *, check_inputs: bool = True):
        self.config = config
        self.check_inputs = check_inputs
        guard = StaleOutputGuard() if config.debug_cudagraph_outputs else None
        self.backend = PiecewiseBackend(config, guard) if config.level > 0 else None
        self.breakable: BreakableCUDAGraphs | None = None
        self._model = model
        self._cache_writer: CacheWriter | None = None
        self._signature = None
        self._called = False
        self.before_trace: Callable[[], None] | None = None
        self.layer_stamp: LayerStamp | None = None
        self._stamp_next = False
        if config.breakable:
            if config.splitting_ops:
                check_splitting_ops_exist(config.splitting_ops)
            self.breakable = BreakableCUDAGraphs(
                model,
                config.splitting_ops,
                config.cudagraph_capture_sizes,
                config.cudagraph_num_of_warmups,
                config.debug_cudagraph_addresses,
                guard,
            )
            self._forward: Callable = self.breakable
        elif config.level == 0:
            self._forward = model
        elif config.level == 1:
            self._forward = torch.compile(_own_forward(model), backend=self.backend, fullgraph=True)
        else:
            # `self` is an argument, so that the tracing call may pass a model with fewer layers (.stamp)
            self._traced_function = torch.compile(
                _own_function(model),
                backend=self.backend,
                fullgraph=True,
                dynamic=False,  # only the dims we mark are dynamic
                options={"guard_filter_fn": lambda guards: [False] * len(guards)},
            )
            self._compiled = functools.partial(self._traced_function, model)
            self._forward = self._call_traced  # the compile cache may swap what it calls at the first call
            # a model that declares repeated layers has Dynamo trace a prefix of them (.stamp)
            self.layer_stamp = LayerStamp.for_model(model) if config.stamp_layers else None
            self._stamp_next = self.layer_stamp is not None
        self.full_graphs: FullCUDAGraphs | None = None
        if config.full_graphs:
            self.full_graphs = FullCUDAGraphs(
                self._forward, config.cudagraph_num_of_warmups, config.debug_cudagraph_addresses, guard
            )
            self._forward = self.full_graphs
        if guard is not None:  # each call of the model is a new call to the guard; nothing to do when off
            self._forward = _counting_calls(self._forward, guard)

    def _call_traced(self, *args):
        """Levels 2-3: Dynamo's compiled forward, or, after a compile-cache hit, the cached split module."""
        if self._stamp_next:
            self._stamp_next = False
            output = self._trace_stamped(args)
        elif self._cache_writer is None:
            return self._compiled(*args)
        else:
            output = self._compiled(*args)  # the tracing call
        if self._cache_writer is not None:
            writer, self._cache_writer, self.backend.cache_writer = self._cache_writer, None, None
            writer.finish(output)
        return output

    def _trace_stamped(self, args):
        """The tracing call with Dynamo shown a copy of the model whose stack holds a prefix of the layers (the
        model itself stays whole: the kernel warm-up's thread runs it meanwhile), the backend stamping the
        rest. Where the trace cannot be stamped, or fails before the backend compiled anything (a forward that
        indexes the stack by a count of its own), one warning line and the tracing call again, of the model."""
        stamp = self.backend.layer_stamp = self.layer_stamp
        try:
            return self._traced_function(stamp.prefix_model(), *args)
        except Exception as err:
            inner = err.inner_exception if isinstance(err, torch._dynamo.exc.BackendCompilerFailed) else err
            if self.backend.traced and not isinstance(inner, NotStampable):
                raise  # the graph was compiled: the error is the call's own
            reason = str(inner) if isinstance(inner, NotStampable) else f"its trace raised {type(inner).__name__}: " + (
                str(inner).strip().splitlines() or [""])[0]
        finally:
            self.backend.layer_stamp = None
        warnings.warn(
            f"stamped layers: {reason}; tracing all {len(stamp.kinds)} layers instead of {stamp.prefix}",
            RuntimeWarning,
            stacklevel=user_stacklevel(),
        )
        return self._compiled(*args)

    def _use_compile_cache(self, args) -> bool:
        """At the first call (levels 2-3): serve the model from its compile-cache entry, or have the trace write
        one (:mod:`.compile_cache`). Returns whether the entry serves it (else the call traces)."""
        folder = cache_folder(self.config)
        if folder is None:
            return False
        reason = uncachable(self.config)
        if reason:
            warnings.warn(f"compile cache: {reason}; this start is not cached", RuntimeWarning, stacklevel=3)
            return False
        factors = cache_factors(self._model, self.config, args)
        key = cache_key(factors)
        on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)

        def build(entry):
            split = self.backend.load(entry, on_cuda)
            forward = bound_call(split, entry.bindings, entry.outputs, self._model)
            self.backend.loaded(entry)  # only now: an entry that fails above leaves the model free to trace
            return forward

        with self.backend.partition_graphs(on_cuda):  # Inductor wraps an artifact's partitions as it loads it
            forward = read_entry(folder, key, factors, build)
        if forward is None:
            compilation_counter.num_cache_misses += 1
            self._cache_writer = self.backend.cache_writer = CacheWriter(folder, key, factors, self._model, args)
            return False
        compilation_counter.num_cache_hits += 1
        self._compiled, self._stamp_next = forward, False
        return True

    @property
    def awaits_trace(self) -> bool:
        """True until the first call has traced the model (levels 2-3 need >= 2 tokens for it)."""
        return self.config.level >= 2 and self._signature is None

    def __call__(self, *args):
        if not self._called:
            self._called = True
            self._warn_without_cuda(args)
        if self.config.level >= 2 and (self._signature is None or self.check_inputs):
            first = self._signature is None
            self._check_or_mark_dynamic(args)
            if first:
                return self._first_call(args)
        return self._run(args)

    def _first_call(self, args):
        """Levels 2-3: look the compile cache up, call ``before_trace`` unless it serves the model, and run the
        call that traces. If anything raises, the next call is a first call again (it marks the token dimension
        dynamic, looks up and traces anew) rather than a call that runs Dynamo unmarked."""
        try:
            if not self._use_compile_cache(args):
                self._before_trace()
            return self._run(args)
        except BaseException:
            self._signature = None
            self._cache_writer = None
            self._stamp_next = self.layer_stamp is not None
            if self.backend is not None:
                self.backend.cache_writer = None
            raise

    def _run(self, args):
        try:
            return self._forward(*args)
        except torch._dynamo.exc.BackendCompilerFailed as err:
            if isinstance(err.inner_exception, ConfigError):  # the backend refused the config: say so plainly
                raise err.inner_exception from None
            raise

    def _before_trace(self) -> None:
        """Call ``before_trace`` once."""
        hook, self.before_trace = self.before_trace, None
        if hook is not None:
            hook()

    def _check_or_mark_dynamic(self, args) -> None:
        if self._signature is not None:
            if _signature(args) != self._signature:
                raise TypeError(
                    "compiled model called with arguments of another dtype, device or non-token shape than "
                    f"the first call: got {_signature(args)}, traced {self._signature}; the graph was traced "
                    "once, for the first kind, and cannot serve others"
                )
            return
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if a.dim() == 0 or a.shape[0] < 2:
                    raise ValueError(
                        f"the first call traces the model and needs at least 2 tokens in argument {i} (got shape "
                        f"{tuple(a.shape)}): Dynamo specializes sizes 0 and 1, which would fix the graph to that "
                        "size; make the first call with a larger batch"
                    )
                torch._dynamo.mark_dynamic(a, 0)
        self._signature = _signature(args)

    def _warn_without_cuda(self, args) -> None:
        if self.config.cudagraph_mode != "none" and not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
            warnings.warn(
                f"CUDA graphs asked for (cudagraph_mode={self.config.cudagraph_mode!r}) but the model is not on a "
                "CUDA device: CUDA graphs exist only on CUDA, so the model runs (compiled, if its level says so) "
                "without graphs",
                RuntimeWarning,
                stacklevel=3,
            )


def compile_model(model: nn.Module, config: CompilationConfig, *, check_inputs: bool = True) -> CompiledModel:
    """Wrap ``model`` so that calling the result runs it compiled according to ``config``.

    Raises:
        ConfigError: at level 3, a splitting op named in ``config`` that is not a registered op.
    """
    return CompiledModel(model, config, check_inputs=check_inputs)
