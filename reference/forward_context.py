"""Per-step state that opaque ops read instead of graph inputs.

The compiled graph is traced once for every batch, so anything that changes shape or meaning from step
to step (which tokens belong to which sequence, where their keys go in the KV cache) cannot be a graph
input without forcing recompiles or breaking CUDA-graph replay. The runner puts it here, around one
forward call; the attention op, which runs eagerly between CUDA graphs, reads it.

The runner also says here which kind of CUDA graph the step is for (``cudagraph_runtime_mode``) and under
which key (``batch_descriptor``); the full-graph wrapper reads both (vLLM's dispatcher does the same).

A context belongs to the thread that set it: the runner's kernel warm-up runs an eager step on a thread of its
own while the main thread traces the model (:mod:`reference.engine.kernel_warm_up`), each under its own context.
vLLM keeps one process-wide context; a per-thread one (a ``contextvars.ContextVar``) lets two steps run at once.
Dynamo cannot trace a context variable's ``get``, so model code that reads the context inside the traced forward
(which would freeze one step's metadata into a graph traced once) fails at the trace instead of running wrong.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterator, NamedTuple


# A context variable is per thread (a new thread starts from an empty context) and reads faster than a
# threading.local attribute.
_current: contextvars.ContextVar["ForwardContext | None"] = contextvars.ContextVar("forward_context", default=None)
# vLLM's CUDAGraphMode values for one step: which graphs the step replays.
RUNTIME_MODES = ("NONE", "PIECEWISE", "FULL")


class BatchDescriptor(NamedTuple):
    """The key of a full CUDA graph: what about a step its graph was captured for.

    Attributes:
        num_tokens: the step's token count after padding (a capture size).
        uniform_decode: every sequence adds exactly one token (a full graph's attention assumes it).
    """

    num_tokens: int
    uniform_decode: bool


@dataclass
class ForwardContext:
    """What one forward step needs outside the graph.

    Attributes:
        attn_metadata: the step's ``AttentionMetadata`` (None for models whose attention needs none).
        attention_layers: layer name -> attention layer (holds its KV cache), for the op's lookup.
        cudagraph_runtime_mode: one of ``RUNTIME_MODES``, set by the runner's dispatch; None outside the
            runner (a direct call of a compiled model), where no full graph is used.
        batch_descriptor: the full graph's key when the mode is ``'FULL'``.
    """

    attn_metadata: Any = None
    attention_layers: dict[str, Any] = field(default_factory=dict)
    cudagraph_runtime_mode: str | None = None
    batch_descriptor: BatchDescriptor | None = None


@contextlib.contextmanager
def set_forward_context(context: ForwardContext) -> Iterator[ForwardContext]:
    """Make ``context`` current for the duration of one forward call. Contexts do not nest."""
    if current_forward_context() is not None:
        raise RuntimeError("set_forward_context: a forward context is already active; contexts do not nest")
    token = _current.set(context)
    try:
        yield context
    finally:
        _current.reset(token)


def current_forward_context() -> ForwardContext | None:
    """This thread's active context, or None outside a forward step."""
    return _current.get()


def get_forward_context() -> ForwardContext:
    """The active context.

    Raises:
        RuntimeError: no context is active, i.e. the model was called outside ``ModelRunner`` or
            ``set_forward_context``.
    """
    context = current_forward_context()
    if context is None:
        raise RuntimeError(
            "no forward context: attention needs per-step metadata; run the model through "
            "reference.engine.ModelRunner or inside reference.forward_context.set_forward_context(...)"
        )
    return context
