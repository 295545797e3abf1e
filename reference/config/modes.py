"""The model modes the project compares: names used by test ids and markers, ``bench_latency --modes``,
perf ids and result tables, each a set of :class:`CompilationConfig` fields."""

from __future__ import annotations

from typing import Any

from reference.config.compilation import CompilationConfig
from reference.config.parsing import ConfigError, echo

# "eager" is enforce_eager: `for_eager()` of the defaults, so custom ops default to all.
MODES: dict[str, dict[str, Any]] = {
    "eager": {},
    "no_inductor": {"level": 3, "use_inductor": False, "custom_ops": ["all"]},
    "inductor": {"level": 3, "use_inductor": True},
}


def mode_config(mode: str, **overrides: Any) -> CompilationConfig:
    """The :class:`CompilationConfig` of model mode ``mode`` (a key of ``MODES``) with ``overrides``.

    For ``eager`` the overrides apply to the defaults and ``for_eager()`` follows, as with
    ``enforce_eager``, so piecewise-only settings fall away.

    Raises:
        ConfigError: an unknown mode (the message lists the modes) or an invalid override.
    """
    if mode not in MODES:
        raise ConfigError(f"mode: expected one of {list(MODES)}, got {echo(mode)}")
    config = CompilationConfig(**{**MODES[mode], **overrides})
    return config.for_eager() if mode == "eager" else config
