"""The project's ``torch.library`` ops: one call defines an op from its reference implementation.

An opaque op is what Dynamo keeps as one graph node and what a CUDA kernel can replace. Each op of the
project is written once, as plain torch code (its *reference*), and :func:`define_op` makes that code the
op's implementation on every device, registers a fake (shape) implementation for tracing, and, on CUDA
with Triton, swaps in a kernel. Layers call the reference in ``forward_native`` and the op in
``forward_custom`` (see :mod:`reference.ops.custom_op`).

Registration. The ops are defined with ``torch.library.Library`` (schema inferred from ``impl``'s
annotations, one kernel for every device, a CUDA kernel where there is one), not with
``torch.library.custom_op``: the latter wraps each call in Python checks and an autograd kernel, about ten
times the dispatcher's own cost per call (measured in perf/NOTES.md, v13), paid by every eager call of every
op and, in torch's own piecewise graphs, by the attention op between the graphs. The ops serve inference and
have no backward. vLLM registers its ops the same way for the same reason (``direct_register_custom_op``).

Splitting ops. The ops the piecewise backend runs eagerly between CUDA graphs by default (attention and
its stand-ins) carry ``torch.Tag.cudagraph_unsafe``, torch's own marker for an op that must not be
captured (Inductor's graph partition cuts at it too). :func:`register_direct_call` lets the backend call
such an op's Python function without the dispatcher.
"""

from __future__ import annotations

import importlib.util
from typing import Callable, Sequence

import torch

NAMESPACE = "reference"
# On CUDA the custom ops run Triton kernels when Triton is installed (it ships with CUDA builds of torch);
# otherwise, and on CPU, they run their reference torch implementation.
HAS_TRITON = importlib.util.find_spec("triton") is not None
SPLITTING_TAG = torch.Tag.cudagraph_unsafe
# What the Triton kernels are written for; other dtypes (float64 references) run the torch code on CUDA too.
TRITON_DTYPES = (torch.float16, torch.bfloat16, torch.float32)

# One library fragment holds every op of the namespace (the models' stand-in ops included); it must live
# as long as the process, or torch drops the registrations.
_LIBRARY = torch.library.Library(NAMESPACE, "FRAGMENT")
_DIRECT_CALLS: dict[str, Callable] = {}


def kernel_backend(device: "str | torch.device") -> str:
    """Which implementation the custom ops use on ``device``: ``'triton'`` or ``'torch'``."""
    return "triton" if HAS_TRITON and torch.device(device).type == "cuda" else "torch"


def define_op(
    name: str,
    impl: Callable,
    *,
    fake: Callable,
    mutates_args: Sequence[str] = (),
    cuda: Callable | None = None,
    splitting: bool = False,
):
    """Define op ``reference::<name>`` running ``impl``; returns ``torch.ops.reference.<name>``, the op as
    Dynamo records it (callable like ``impl``).

    Args:
        name: the op's name in the ``reference`` namespace.
        impl: fully type-annotated function (torch.library infers the schema from the annotations); the
            op's implementation on every device without a ``cuda`` kernel.
        fake: what Dynamo runs on fake tensors, once per call site, while it traces: allocate the outputs
            with the shapes, dtypes and strides ``impl`` (and ``cuda``) give, compute nothing. Running
            ``impl`` there would work too, but traces every op inside it with a symbolic token count at
            every layer (the cost is in perf/NOTES.md, v9).
        mutates_args: names of the arguments ``impl`` writes into.
        cuda: implementation on CUDA devices, used only when Triton is installed and the first
            floating-point argument's dtype is one of ``TRITON_DTYPES`` (``impl`` runs otherwise).
        splitting: tag the op ``torch.Tag.cudagraph_unsafe``: a default splitting op.
    """
    schema = torch.library.infer_schema(impl, mutates_args=tuple(mutates_args))
    _LIBRARY.define(name + schema, tags=(SPLITTING_TAG,) if splitting else ())
    # Every device runs impl (below autograd: these ops serve inference, and have no backward)
    _LIBRARY.impl(name, impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{NAMESPACE}::{name}", fake, lib=_LIBRARY)
    if cuda is not None and HAS_TRITON:

        def on_cuda(*args):
            # the activations' dtype: rotary's first argument is the int64 positions
            dtype = next(a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
            return cuda(*args) if dtype in TRITON_DTYPES else impl(*args)

        _LIBRARY.impl(name, on_cuda, "CUDA")
    return getattr(getattr(torch.ops, NAMESPACE), name)


def register_direct_call(qualname: str, fn: Callable) -> None:
    """Declare ``fn`` (same signature and effect as op ``qualname``) safe to call without the dispatcher.

    The piecewise backend uses it for splitting ops, which run eagerly between CUDA graphs where the
    dispatcher's Python-op overhead is paid on every call of every layer.
    """
    _DIRECT_CALLS[qualname] = fn


def direct_call(qualname: str) -> Callable | None:
    """The function registered for op ``qualname`` with :func:`register_direct_call`, if any."""
    return _DIRECT_CALLS.get(qualname)
