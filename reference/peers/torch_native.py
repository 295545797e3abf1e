"""torch's own piecewise CUDA graphs, as a compile function for the project's runner.

torch has the pieces of the idea itself: Inductor's graph partition cuts a compiled graph at the ops it
must not capture (``torch._inductor.config.graph_partition``, on by default since 2.9; the cut ops are
those tagged ``torch.Tag.cudagraph_unsafe``, which the project's attention ops carry, plus
``custom_should_partition_ops``), and CUDA graph trees (``mode="reduce-overhead"``, i.e.
``triton.cudagraphs``) capture every partition, one graph per input shape. :func:`compile_torch_native`
maps a :class:`~reference.config.CompilationConfig` onto that:

* level 0: the model itself; levels 1-2: ``torch.compile(fullgraph=True)`` with Inductor, or with the
  ``eager`` backend (Dynamo only) for ``use_inductor=False``; level 2 with ``dynamic=True``.
* level 3: Inductor with graph partition at the config's splitting ops (None: the tagged ones) and, for
  ``cudagraph_mode='piecewise'``, CUDA graph trees. ``use_inductor=False`` with piecewise graphs is
  :class:`Unsupported`: torch captures partitions only of graphs Inductor compiled; eager pieces in
  piecewise graphs are what this project (and vLLM) add.
* full graphs (``'full_decode_only'``, ``'full_and_piecewise'``) and breakable graphs (level 0 with
  piecewise graphs) are :class:`Unsupported`: graph trees key graphs by input shapes, not by the kind of
  step, and torch captures no eager model in segments. Running the model without them would measure, or
  pass the conformance rules, for the wrong reason.

Capture sizes are the runner's: it pads every step to one of them, and graph trees record a graph for
each size they see.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from reference.config import CompilationConfig


class Unsupported(Exception):
    """A valid config that an implementation does not implement (the conformance suite skips the test)."""


def compile_torch_native(model: nn.Module, config: CompilationConfig) -> Callable:
    """``model``'s forward compiled by torch itself per ``config`` (module doc), for ``ModelRunner``'s
    ``compile_fn``.

    Raises:
        Unsupported: full or breakable graphs, or piecewise graphs without Inductor.
    """
    if config.full_graphs:
        raise Unsupported(
            f"torch {torch.__version__} has no full CUDA graphs dispatched by batch descriptor "
            f"(cudagraph_mode={config.cudagraph_mode!r}): graph trees key graphs by input shapes"
        )
    if config.breakable:
        raise Unsupported(f"torch {torch.__version__} has no breakable CUDA graphs of an eager model")
    if config.level == 0:
        return model
    if config.level in (1, 2):
        backend = "inductor" if config.use_inductor else "eager"
        return torch.compile(model, backend=backend, fullgraph=True, dynamic=True if config.level == 2 else None)
    if not config.use_inductor:
        if config.piecewise_graphs:
            raise Unsupported(
                f"torch {torch.__version__} has no piecewise CUDA graphs without Inductor: graph trees capture "
                "the partitions of an Inductor-compiled graph only"
            )
        return torch.compile(model, backend="eager", fullgraph=True, dynamic=True)
    options = {
        **config.inductor_compile_config,
        "graph_partition": True,
        "custom_should_partition_ops": list(config.splitting_ops or ()),
        "triton.cudagraphs": config.piecewise_graphs,
    }
    return torch.compile(model, fullgraph=True, dynamic=True, options=options)
