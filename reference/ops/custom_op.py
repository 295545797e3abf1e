"""Layers with two implementations: ``forward_native`` (plain torch) and ``forward_custom`` (one opaque op).

``forward_native`` is traceable PyTorch that Dynamo records op by op, so Inductor can fuse it with its
neighbours. ``forward_custom`` calls a single ``torch.library`` op (namespace ``reference``) that Dynamo
keeps as one node: the hand-fused kernel replaces Inductor's fusion, which is what makes
``use_inductor=False`` fast. Which one a layer uses is decided once, when the layer is built, from the
:class:`CustomOpSelection` passed to it; the choice is recorded so tests and logs can ask for it.

vLLM makes this decision through a process-global "current config"; here the selection is an explicit
constructor argument, so two models built with different settings in one process cannot interfere.
"""

from __future__ import annotations

import importlib.util
from collections import Counter
from typing import Callable, ClassVar

import torch
from torch import nn

from reference.config import CompilationConfig

_REGISTRY: dict[str, type["CustomOp"]] = {}

# On CUDA the custom ops run Triton kernels when Triton is installed (it ships with CUDA builds of torch);
# otherwise, and on CPU, they run their fused-in-one-function torch implementation.
HAS_TRITON = importlib.util.find_spec("triton") is not None


_DIRECT_CALLS: dict[str, Callable] = {}


def register_direct_call(qualname: str, fn: Callable) -> None:
    """Declare ``fn`` (same signature and effect as op ``qualname``) safe to call without the dispatcher.

    The piecewise backend uses it for splitting ops, which run eagerly between CUDA graphs where the
    dispatcher's Python-op overhead is paid on every call of every layer.
    """
    _DIRECT_CALLS[qualname] = fn


def direct_call(qualname: str) -> Callable | None:
    """The function registered for op ``qualname`` with :func:`register_direct_call`, if any."""
    return _DIRECT_CALLS.get(qualname)


def kernel_backend(device: "str | torch.device") -> str:
    """Which implementation the custom ops use on ``device``: ``'triton'`` or ``'torch'``."""
    return "triton" if HAS_TRITON and torch.device(device).type == "cuda" else "torch"


def registered_custom_ops() -> frozenset[str]:
    """Names of all custom ops (e.g. ``'rms_norm'``); importing ``reference.ops`` registers them."""
    import reference.ops  # noqa: F401  (registers every op module)

    return frozenset(_REGISTRY)


class CustomOpSelection:
    """Decides, per op name, whether layers use the custom implementation, and records each decision.

    Args:
        config: the compilation config whose ``custom_ops`` list and default apply.

    Attributes:
        enabled: Counter of op name -> number of layers built with the custom implementation.
        disabled: Counter of op name -> number of layers built with ``forward_native``.
    """

    def __init__(self, config: CompilationConfig):
        self.config = config
        self.enabled: Counter[str] = Counter()
        self.disabled: Counter[str] = Counter()

    def is_enabled(self, name: str) -> bool:
        """Whether op ``name`` uses its custom implementation ('+name'/'-name' win over 'all'/'none').

        Raises:
            KeyError: ``name`` is not a registered custom op.
        """
        if name not in registered_custom_ops():
            raise KeyError(f"unknown custom op {name!r}; known: {sorted(registered_custom_ops())}")
        if f"+{name}" in self.config.custom_ops:
            return True
        if f"-{name}" in self.config.custom_ops:
            return False
        return self.config.custom_ops_default

    def decide(self, name: str) -> bool:
        """:meth:`is_enabled`, recorded in ``enabled`` / ``disabled``."""
        use = self.is_enabled(name)
        (self.enabled if use else self.disabled)[name] += 1
        return use

    def summary(self) -> dict[str, list[str]]:
        """``{'enabled': [...], 'disabled': [...]}``: op names built so far, sorted."""
        return {"enabled": sorted(self.enabled), "disabled": sorted(self.disabled)}


class CustomOp(nn.Module):
    """Base class for a layer with a native and a custom implementation.

    Subclasses set ``name`` (the key used in ``custom_ops``) and implement ``forward_native`` and
    ``forward_custom`` with the same signature and semantics. Both must agree to the tolerance the
    subclass documents; the conformance suite checks it.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            if cls.name in _REGISTRY:
                raise RuntimeError(f"custom op name {cls.name!r} registered twice")
            _REGISTRY[cls.name] = cls

    def __init__(self, ops: CustomOpSelection):
        super().__init__()
        self.use_custom = ops.decide(self.name)

    def forward(self, *args, **kwargs):
        if self.use_custom:
            return self.forward_custom(*args, **kwargs)
        return self.forward_native(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_custom(self, *args, **kwargs):
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"impl={'custom' if self.use_custom else 'native'}"

