"""What the benchmark CLI offers, as names: modes (as LLM keyword arguments), baselines, dtypes.

Light on purpose (it imports nothing heavier than reference.config), so that ``bench_latency --help``
and usage errors answer before torch and transformers are imported.
"""

from __future__ import annotations

from typing import Any

from reference.config import MODES as MODE_FIELDS

# mode -> LLM keyword arguments (from reference.config.MODES); vLLM users know them as --enforce-eager
# and two -O configs.
MODE_KWARGS: dict[str, dict[str, Any]] = {
    mode: {"enforce_eager": True} if mode == "eager" else {"compilation_config": dict(fields)}
    for mode, fields in MODE_FIELDS.items()
}


def mode_kwargs(mode: str, overrides: dict[str, Any] | None) -> dict[str, Any]:
    """LLM keyword arguments of ``mode``, with ``overrides`` applied to a compiled mode's config."""
    kwargs = dict(MODE_KWARGS[mode])
    if overrides and "compilation_config" in kwargs:
        kwargs["compilation_config"] = {**kwargs["compilation_config"], **overrides}
    return kwargs


# transformers ``generate`` on our weights (reference.benchmark.baselines), and torch's own piecewise path
# (reference.peers.torch_native) in this project's engine, with the inductor mode's config
BASELINES = ("hf-eager", "hf-compile", "torch-native")
HF_BASELINES = ("hf-eager", "hf-compile")
TORCH_NATIVE_MODE = "inductor"
# LLM(dtype=...) names besides 'auto', the keys of reference.engine.arguments.DTYPES (a test keeps them equal;
# importing that module here would import torch)
DTYPE_NAMES = ("float32", "bfloat16", "float16")
