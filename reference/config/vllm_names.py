"""vLLM's current spellings of three fields, read as this project's (the seed's) names.

vLLM renamed ``level`` to ``mode`` (values 0-3 or their names), replaced ``use_inductor`` with ``backend``
(``'inductor'`` or ``'eager'``), and spells ``cudagraph_mode`` in capitals (``'FULL_AND_PIECEWISE'``). A
config dict may use either spelling; two spellings of one field that disagree are an error naming both,
where vLLM lets the newer one win without a word.
"""

from __future__ import annotations

from typing import Any

from reference.config.parsing import ConfigError, echo

MODE_NAMES = {"NONE": 0, "STOCK_TORCH_COMPILE": 1, "DYNAMO_TRACE_ONCE": 2, "VLLM_COMPILE": 3}
BACKENDS = {"inductor": True, "eager": False}
CUDAGRAPH_MODE_NAMES = {
    "NONE": "none",
    "PIECEWISE": "piecewise",
    "FULL": "full",
    "FULL_DECODE_ONLY": "full_decode_only",
    "FULL_AND_PIECEWISE": "full_and_piecewise",
}


def _mode_level(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value in MODE_NAMES.values():
        return value
    if isinstance(value, str) and value in MODE_NAMES:
        return MODE_NAMES[value]
    raise ConfigError(f"mode: expected 0-3 or one of {list(MODE_NAMES)}, got {echo(value)}")


def _merge(fields: dict[str, Any], new: str, old: str, value: Any) -> None:
    """Set ``fields[old] = value``, refusing a different value already given under ``old``."""
    if old in fields and fields[old] != value:
        raise ConfigError(
            f"{new}={echo(fields[new])} and {old}={echo(fields[old])} disagree; they are two spellings of one "
            f"setting (vLLM's and the seed's): give one"
        )
    fields[old] = value


def translate(fields: dict[str, Any]) -> dict[str, Any]:
    """``fields`` with ``mode`` / ``backend`` turned into ``level`` / ``use_inductor`` and vLLM's capitals of
    ``cudagraph_mode`` into the lower-case names; a new dict.

    Raises:
        ConfigError: a bad value or two spellings that disagree.
    """
    fields = dict(fields)
    if "mode" in fields:
        _merge(fields, "mode", "level", _mode_level(fields["mode"]))
        del fields["mode"]
    if "backend" in fields:
        if not isinstance(fields["backend"], str) or fields["backend"] not in BACKENDS:  # a list is unhashable
            raise ConfigError(f"backend: expected one of {list(BACKENDS)}, got {echo(fields['backend'])}")
        _merge(fields, "backend", "use_inductor", BACKENDS[fields["backend"]])
        del fields["backend"]
    graph_mode = fields.get("cudagraph_mode")
    if isinstance(graph_mode, str) and graph_mode in CUDAGRAPH_MODE_NAMES:
        fields["cudagraph_mode"] = CUDAGRAPH_MODE_NAMES[graph_mode]
    return fields
