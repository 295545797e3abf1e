"""Compile one piece for the symbolic (any-size) token dimension: with Inductor, or not at all; and, with
``compile_sizes``, once more per listed token count with static shapes.

``use_inductor=True`` hands the piece to ``torch._inductor.standalone_compile`` with the piece's own
symbolic shapes (``dynamic_shapes='from_graph'``: the fake tensors Dynamo left on the placeholders), so
one compiled artifact serves every batch size, and with one post-grad pass of ours
(:mod:`.inductor_passes`: residual adds stay adds); ``inductor_compile_config`` patches go over it.
``use_inductor=False`` keeps the FX GraphModule: its generated Python calls the same ATen ops (and
custom ops) that eager mode would, which is why eager+CUDAGraphs can be bitwise equal to eager.

``compile_sizes`` (vLLM's field): Inductor compiles the piece again for each listed token count with every
shape fixed, so it may pick kernels and tilings for that count; :class:`SizeDispatch` routes a call at
such a count to that compile and every other call to the symbolic one. vLLM compiles a listed size at its
first call, from that call's arguments; we compile every size with the symbolic one, from uninitialised
inputs of the recorded shapes (:func:`inputs_at`), so compile time is counted as compile time and the compile
cache stores them all.
"""

from __future__ import annotations

from typing import Callable

import sympy
import torch

from reference.compilation.counters import compilation_counter
from reference.compilation.inductor_passes import PARTITION_WRAPPERS_KEY, UNFOLD_RESIDUAL_ADDMM
from reference.config import CompilationConfig


def example_inputs(module: torch.fx.GraphModule) -> list:
    """The fake tensors / SymInts Dynamo recorded for ``module``'s placeholders, in order."""
    return [node.meta["example_value"] for node in module.graph.nodes if node.op == "placeholder"]


def _at_size(dim, size: int) -> int:
    """A recorded dimension or stride with every symbol (a token count) set to ``size``."""
    if not isinstance(dim, torch.SymInt):
        return dim
    expr = dim.node.expr
    return int(expr.xreplace({symbol: sympy.Integer(size) for symbol in expr.free_symbols}))


def inputs_at(module: torch.fx.GraphModule, size: int) -> list:
    """Example inputs for a static-shape compile of ``module`` at ``size`` tokens: each recorded tensor as an
    uninitialised tensor of its dtype and device, its shape and strides with every symbol set to ``size``
    (a piece's symbols are all token counts, equal at run time: only the token dimension is marked dynamic),
    and ``size`` itself for a SymInt input. The tensors are real, on the piece's device, alive for one compile:
    a layer piece's weights take their size again for that long (0.4 GiB for an 8B layer in bf16)."""
    inputs = []
    for value in example_inputs(module):
        if isinstance(value, torch.Tensor):
            shape = [_at_size(d, size) for d in value.shape]
            stride = [_at_size(d, size) for d in value.stride()]
            value = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        inputs.append(_at_size(value, size))
    return inputs


def partition_patches(config: CompilationConfig) -> dict:
    """Inductor config patches for ``use_inductor_graph_partition`` (``PARTITION_INDUCTOR_SETTINGS``), empty
    without it: partition at the splitting ops (the ops tagged ``cudagraph_unsafe`` Inductor cuts at by
    itself; named ones are added), and a pre-pass that puts into Inductor's cache keys whether the partitions
    are wrapped (:data:`~reference.compilation.inductor_passes.PARTITION_WRAPPERS_KEY`, pytorch#165471)."""
    if not config.use_inductor_graph_partition:
        return {}
    named = list(config.splitting_ops or ())
    return {
        "graph_partition": True,
        "custom_should_partition_ops": named,
        "post_grad_custom_pre_pass": PARTITION_WRAPPERS_KEY,
    }


def _inductor(module: torch.fx.GraphModule, inputs: list, dynamic_shapes: str, config: CompilationConfig) -> Callable:
    compilation_counter.num_backend_compilations += 1
    compilation_counter.num_inductor_compiles += 1
    patches = {"post_grad_custom_post_pass": UNFOLD_RESIDUAL_ADDMM, **partition_patches(config)}
    return torch._inductor.standalone_compile(
        module,
        inputs,
        dynamic_shapes=dynamic_shapes,
        options={"config_patches": {**patches, **config.inductor_compile_config}},
    )


def compile_piece(module: torch.fx.GraphModule, config: CompilationConfig) -> Callable:
    """Return a callable with ``module``'s calling convention (the compiled piece, for any token count).

    Counts one backend compilation, and one Inductor or one eager compile.
    """
    if not config.use_inductor:
        compilation_counter.num_backend_compilations += 1
        compilation_counter.num_eager_compiles += 1
        return module
    return _inductor(module, example_inputs(module), "from_graph", config)


def compile_static(module: torch.fx.GraphModule, config: CompilationConfig, size_args: tuple[int, ...]) -> dict:
    """Inductor's static-shape compiles of ``module``, token count -> callable, one per ``config.compile_sizes``
    (each counted as one backend and one Inductor compile); empty for a piece without token-count arguments
    ``size_args`` (its shapes are static already) or without compile sizes."""
    if not size_args:
        return {}
    sizes = config.compile_sizes
    return {size: _inductor(module, inputs_at(module, size), "from_example_inputs", config) for size in sizes}


class SizeDispatch:
    """A piece's calling convention over its symbolic compile and its static ones (``compile_sizes``).

    Args:
        generic: the compile for any token count.
        static: token count -> the compile for that count.
        size_args: indices of the piece's token-count arguments (ints); a call whose counts all equal a key
            of ``static`` runs that compile, any other call ``generic``.
    """

    def __init__(self, generic: Callable, static: dict[int, Callable], size_args: tuple[int, ...]):
        self.generic, self.static, self.size_args = generic, static, size_args

    def __call__(self, *args):
        size = args[self.size_args[0]]
        runnable = self.static.get(size, self.generic)
        if runnable is not self.generic and any(args[i] != size for i in self.size_args[1:]):
            runnable = self.generic
        return runnable(*args)
