"""The model modes the project compares: names used by test ids and markers, ``bench_latency --modes``,
perf ids and result tables, each a set of :class:`CompilationConfig` fields.

* ``eager``: ``enforce_eager`` (level 0, no graphs; custom ops default to all).
* ``breakable``: the eager model (no trace, no compile) captured into per-size CUDA-graph segments broken
  at the splitting ops; the seed PR's "turn off TorchDynamo too", as vLLM and SGLang ship it now.
* ``no_inductor`` / ``inductor``: level 3, pieces left as eager FX code or compiled by Inductor, in
  piecewise CUDA graphs (the seed's two modes).
* ``no_inductor_full`` / ``inductor_full``: the same pieces, plus one full CUDA graph of the whole forward
  per decode batch size (``cudagraph_mode='full_and_piecewise'``, vLLM's current default).
"""

from __future__ import annotations

from typing import Any

from reference.config.compilation import CompilationConfig
from reference.config.parsing import ConfigError, echo

# "eager" is enforce_eager: `for_eager()` of the defaults, so custom ops default to all.
MODES: dict[str, dict[str, Any]] = {
    "eager": {},
    "breakable": {"level": 0, "cudagraph_mode": "piecewise", "custom_ops": ["all"]},
    "no_inductor": {"level": 3, "use_inductor": False, "custom_ops": ["all"]},
    "inductor": {"level": 3, "use_inductor": True},
    "no_inductor_full": {
        "level": 3,
        "use_inductor": False,
        "custom_ops": ["all"],
        "cudagraph_mode": "full_and_piecewise",
    },
    "inductor_full": {"level": 3, "use_inductor": True, "cudagraph_mode": "full_and_piecewise"},
}
# The mode a full-graph mode adds full graphs to (its pieces are that mode's): test markers carry both.
BASE_MODE = {"no_inductor_full": "no_inductor", "inductor_full": "inductor"}


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


def mode_of(config: CompilationConfig) -> str | None:
    """The name in ``MODES`` whose settings ``config`` runs (level, Inductor, graph kinds), or None
    (levels 1-2, and combinations no mode names, such as level 0 with full graphs only)."""
    if config.level == 0:
        return {"none": "eager", "piecewise": "breakable"}.get(config.cudagraph_mode)
    if config.level != 3:
        return None
    base = "inductor" if config.use_inductor else "no_inductor"
    named = {"full_and_piecewise": f"{base}_full", "full_decode_only": None, "full": None}
    return named.get(config.cudagraph_mode, base)
