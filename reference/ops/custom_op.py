"""Layers with two implementations: ``forward_native`` (plain torch) and ``forward_custom`` (one opaque op).

``forward_native`` is traceable PyTorch that Dynamo records op by op, so Inductor can fuse it with its
neighbours. ``forward_custom`` calls a single ``torch.library`` op (namespace ``reference``, defined with
:func:`reference.ops.library.define_op`) that Dynamo keeps as one node: the hand-fused kernel replaces
Inductor's fusion, which is what makes ``use_inductor=False`` fast. Which one a layer uses is decided
once, when the layer is built, from the :class:`CustomOpSelection` passed to it; the choice is recorded
so tests and logs can ask for it.

vLLM makes this decision through a process-global "current config"; here the selection is an explicit
constructor argument, so two models built with different settings in one process cannot interfere.
"""

from __future__ import annotations

from collections import Counter
from typing import ClassVar

from torch import nn

from reference.config import CompilationConfig, ConfigError, echo

# name -> CustomOp subclass; filled as the op modules of reference.ops are imported (the package's
# __init__ imports all of them before any of its modules can be used).
_REGISTRY: dict[str, type["CustomOp"]] = {}


def registered_custom_ops() -> frozenset[str]:
    """Names of all custom ops (e.g. ``'rms_norm'``), the names ``custom_ops`` entries may use."""
    return frozenset(_REGISTRY)


class CustomOpSelection:
    """Decides, per op name, whether layers use the custom implementation, and records each decision.

    Args:
        config: the compilation config whose ``custom_ops`` list and default apply.

    Attributes:
        enabled: Counter of op name -> number of layers built with the custom implementation.
        disabled: Counter of op name -> number of layers built with ``forward_native``.

    Raises:
        ConfigError: ``config.custom_ops`` names an op that is not registered (the message lists them).
    """

    def __init__(self, config: CompilationConfig):
        known = registered_custom_ops()
        for entry in config.custom_ops:
            if entry not in ("all", "none") and entry[1:] not in known:
                raise ConfigError(
                    f"custom_ops: unknown op {echo(entry[1:])} in {echo(entry)}; known ops: {sorted(known)}"
                )
        self.config = config
        self.enabled: Counter[str] = Counter()
        self.disabled: Counter[str] = Counter()

    def is_enabled(self, name: str) -> bool:
        """Whether op ``name`` uses its custom implementation ('+name'/'-name' win over 'all'/'none'; an op whose
        class sets ``opt_in`` is on only with '+name').

        Raises:
            KeyError: ``name`` is not a registered custom op.
        """
        if name not in _REGISTRY:
            raise KeyError(f"unknown custom op {name!r}; known: {sorted(_REGISTRY)}")
        if f"+{name}" in self.config.custom_ops:
            return True
        if f"-{name}" in self.config.custom_ops:
            return False
        return self.config.custom_ops_default and not _REGISTRY[name].opt_in

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
    subclass documents; the conformance suite checks it. A subclass that sets ``opt_in`` is left out of
    ``'all'`` (and of the default where custom ops are on): only ``'+name'`` turns it on. vLLM has no such
    ops; here it is for a custom implementation that is right but measured slower than the native one, so
    that ``'all'`` keeps meaning the fastest set (perf/NOTES.md says which and why).
    """

    name: ClassVar[str]
    opt_in: ClassVar[bool] = False

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
