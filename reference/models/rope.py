"""RoPE frequencies of a transformers config, without importing transformers' modeling code.

transformers keeps its frequencies in two places: the scaled kinds (``llama3``, ``linear``, ``yarn``, ...)
in ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS``, cheap to import, and the unscaled kind
(``default``) in a static method of each model's ``*RotaryEmbedding`` class, whose module imports
transformers' whole modeling stack (``modeling_utils`` and what it pulls in). That import was the largest
single part of a start's imports on the H200's host (perf/NOTES.md, v15 and v16), and building a model
needs nothing else from it. So the scaled kinds come from transformers' table, and the unscaled kind is
computed here with the same operations as transformers' method: RoFormer's frequencies (Su et al. 2021,
"RoFormer: Enhanced Transformer with Rotary Position Embedding", eq. 15), ``base ** (-2i / d)`` for
``i in 0 .. d/2 - 1``. conformance/test_rope.py checks both kinds bitwise against transformers' classes.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

UNSCALED = "default"  # transformers' name for RoPE without scaling


def rope_frequencies(
    config: PretrainedConfig, head_dim: int, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and the attention scaling of ``config``'s RoPE.

    Args:
        config: a transformers 5 config; its ``rope_parameters`` (a dict with ``rope_type``, ``rope_theta``
            and the kind's own fields) or, with ``layer_type``, ``rope_parameters[layer_type]`` (Gemma 3 keeps
            one such dict per layer type).
        head_dim: the rotated size per head (``d``).
        layer_type: the layer type whose parameters to read, or None for a config with one RoPE.

    Returns:
        ``(inv_freq [head_dim // 2] float32 on the CPU, attention_scaling)``: what transformers' model classes
        hold as ``inv_freq`` (or ``<layer_type>_inv_freq``) and ``attention_scaling``.

    Raises:
        ValueError: one line naming the field: the parameters are missing, ``rope_type`` is not ``default`` or a
            kind of ``ROPE_INIT_FUNCTIONS`` (the message lists them), ``rope_theta`` is not a number > 0, or
            a scaled kind's ``partial_rotary_factor`` is not 1 (these models rotate whole heads).
    """
    field = "rope_parameters" if layer_type is None else f"rope_parameters[{layer_type!r}]"
    params = getattr(config, "rope_parameters", None)
    if layer_type is not None and isinstance(params, dict):
        params = params.get(layer_type)
    if not isinstance(params, dict) or "rope_type" not in params:
        raise ValueError(
            f"{field}: expected a dict with 'rope_type' (transformers 5's RoPE settings), got {params!r}"
        )
    theta = params.get("rope_theta")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise ValueError(f"{field}['rope_theta']: expected a number > 0, got {theta!r}")
    kind = params["rope_type"]
    if kind == UNSCALED:  # transformers' own unscaled RoPE rotates whole heads whatever partial_rotary_factor says
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim  # [head_dim // 2]
        return 1.0 / (theta**exponents), 1.0
    if kind not in ROPE_INIT_FUNCTIONS:
        kinds = ", ".join(sorted([UNSCALED, *ROPE_INIT_FUNCTIONS]))
        raise ValueError(f"{field}['rope_type']: expected one of {kinds}, got {kind!r}")
    partial = params.get("partial_rotary_factor", 1.0)
    if partial != 1.0:  # the scaled kinds would rotate part of each head, which these models do not
        raise ValueError(f"{field}['partial_rotary_factor']: expected 1.0 (whole heads rotate), got {partial!r}")
    by_layer = {} if layer_type is None else {"layer_type": layer_type}
    return ROPE_INIT_FUNCTIONS[kind](config, None, **by_layer)
