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
  pass the conformance rules, for the wrong reason. So are ``compile_sizes``: torch.compile's one dynamic
  graph has no static-shape compiles beside it.

Capture sizes are the runner's: it pads every step to one of them, and graph trees record a graph for
each size they see. ``stamp_layers`` is the project's and is ignored here: Dynamo traces every layer, so a
cold start of this peer is compared against a stamped one of the project's (perf/NOTES.md v44).
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn

from reference.compilation.replays import ReplayTally, dynamo_graphs
from reference.config import CompilationConfig


class Unsupported(Exception):
    """A valid config that an implementation does not implement (the conformance suite skips the test)."""


def compile_torch_native(model: nn.Module, config: CompilationConfig) -> Callable:
    """``model``'s forward compiled by torch itself per ``config`` (module doc), for ``ModelRunner``'s
    ``compile_fn``.

    Raises:
        Unsupported: full or breakable graphs, piecewise graphs without Inductor, or compile sizes.
    """
    if config.full_graphs:
        raise Unsupported(
            f"torch {torch.__version__} has no full CUDA graphs dispatched by batch descriptor "
            f"(cudagraph_mode={config.cudagraph_mode!r}): graph trees key graphs by input shapes"
        )
    if config.breakable:
        raise Unsupported(f"torch {torch.__version__} has no breakable CUDA graphs of an eager model")
    if config.compile_sizes:
        raise Unsupported(
            f"torch.compile (torch {torch.__version__}) makes one dynamic-shape graph here; static-shape compiles "
            "beside it for listed token counts (compile_sizes) are this project's (and vLLM's)"
        )
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
        # the mode's graphs, or Inductor's asked for by name where the mode captures none (the config allows it)
        "triton.cudagraphs": config.piecewise_graphs or config.inductor_compile_config.get("triton.cudagraphs", False),
    }
    return torch.compile(model, fullgraph=True, dynamic=True, options=options)


# CUDAGraphTreeManager methods where a call of a cudagraphified function replays or records, and the tally
# field each fills
_GRAPH_TREE_OUTCOMES = {"execute_node": "replays", "record_function": "recorded"}


@contextlib.contextmanager
def graph_tree_replays() -> Iterator[ReplayTally]:
    """A :class:`~reference.compilation.replays.ReplayTally` of what CUDA graph trees did inside the block.

    Every call of a cudagraphified partition enters ``CUDAGraphTreeManager._run`` once (a call may recurse
    into it, counted once) and ends in ``execute_node`` (a replay), ``record_function`` (a new recording),
    or else without a graph: ``run_eager`` (a warm-up run) or the un-graphed function itself (input
    mutation, the re-record limit), together the calls left over, ``eager_runs``. ``skipped`` is the change of
    Inductor's ``cudagraph_skips`` counter, ``recompiles`` of Dynamo's graph count. The manager's methods
    are wrapped for the block only: outside it graph trees run untouched.
    """
    from torch._dynamo.utils import counters
    from torch._inductor.cudagraph_trees import CUDAGraphTreeManager

    tally, calls, depth = ReplayTally(), [0], [0]
    originals = {name: getattr(CUDAGraphTreeManager, name) for name in ("_run", *_GRAPH_TREE_OUTCOMES)}

    def outer_run(self, *args, **kwargs):
        calls[0] += depth[0] == 0
        depth[0] += 1
        try:
            return originals["_run"](self, *args, **kwargs)
        finally:
            depth[0] -= 1

    def counting(name: str) -> Callable:
        def wrapper(self, *args, **kwargs):
            setattr(tally, _GRAPH_TREE_OUTCOMES[name], getattr(tally, _GRAPH_TREE_OUTCOMES[name]) + 1)
            return originals[name](self, *args, **kwargs)

        return wrapper

    skips, traced = counters["inductor"]["cudagraph_skips"], dynamo_graphs()
    CUDAGraphTreeManager._run = outer_run
    for name in _GRAPH_TREE_OUTCOMES:
        setattr(CUDAGraphTreeManager, name, counting(name))
    try:
        yield tally
    finally:
        for name, original in originals.items():
            setattr(CUDAGraphTreeManager, name, original)
        tally.eager_runs = calls[0] - tally.replays - tally.recorded
        tally.skipped = counters["inductor"]["cudagraph_skips"] - skips
        tally.recompiles = dynamo_graphs() - traced
