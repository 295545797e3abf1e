"""Compile one piece for the symbolic (any-size) token dimension: with Inductor, or not at all.

``use_inductor=True`` hands the piece to ``torch._inductor.standalone_compile`` with the piece's own
symbolic shapes (``dynamic_shapes='from_graph'``: the fake tensors Dynamo left on the placeholders), so
one compiled artifact serves every batch size, and with one post-grad pass of ours
(:mod:`.inductor_passes`: residual adds stay adds); ``inductor_compile_config`` patches go over it.
``use_inductor=False`` keeps the FX GraphModule: its generated Python calls the same ATen ops (and
custom ops) that eager mode would, which is why eager+CUDAGraphs can be bitwise equal to eager.
"""

from __future__ import annotations

from typing import Callable

import torch

from reference.compilation.counters import compilation_counter
from reference.compilation.inductor_passes import UNFOLD_RESIDUAL_ADDMM
from reference.config import CompilationConfig


def example_inputs(module: torch.fx.GraphModule) -> list:
    """The fake tensors / SymInts Dynamo recorded for ``module``'s placeholders, in order."""
    return [node.meta["example_value"] for node in module.graph.nodes if node.op == "placeholder"]


def compile_piece(module: torch.fx.GraphModule, config: CompilationConfig) -> Callable:
    """Return a callable with ``module``'s calling convention (the compiled piece).

    Counts one backend compilation, and one Inductor or one eager compile.
    """
    compilation_counter.num_backend_compilations += 1
    if not config.use_inductor:
        compilation_counter.num_eager_compiles += 1
        return module
    compilation_counter.num_inductor_compiles += 1
    return torch._inductor.standalone_compile(
        module,
        example_inputs(module),
        dynamic_shapes="from_graph",
        options={
            "config_patches": {"post_grad_custom_post_pass": UNFOLD_RESIDUAL_ADDMM, **config.inductor_compile_config}
        },
    )
