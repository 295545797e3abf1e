"""vLLM's spellings of the compilation flags on the command line, spelled out before argparse reads them.
Imports no torch.

* ``-O<n>``, ``-O <n>``, ``--optimization-level <n>``: vLLM's optimization level (today's meaning; in the
  seed's vLLM ``-O3`` meant compilation level 3). Levels are defaults for several settings at once, and here
  the settings they choose between are the modes: ``OPTIMIZATION_LEVEL_MODES``.
* ``-O.FIELD=VALUE``, ``-cc.FIELD=VALUE``, ``--compilation-config.FIELD=VALUE`` (or ``... VALUE`` as the
  next argument): one field of the compilation config; dots nest, e.g.
  ``-O.inductor_compile_config.max_autotune=true``. All of them merge into one ``--compilation-config``.
"""

from __future__ import annotations

import ast
import json
from typing import Any

from reference.config import ConfigError, config_fields, echo

# vLLM's optimization levels as this CLI's modes (docs.vllm.ai, design/optimization_levels): 0 compiles
# nothing and captures nothing; 1 is Dynamo + Inductor with piecewise graphs; 2 (vLLM's default) adds full
# graphs (FULL_AND_PIECEWISE); 3 is, in vLLM today, the same as 2.
OPTIMIZATION_LEVEL_MODES = {"0": "eager", "1": "inductor", "2": "inductor_full", "3": "inductor_full"}
_DOTTED = ("-O.", "-cc.", "--compilation-config.")
_WHOLE = ("-O", "-cc", "--compilation-config")


def _field_value(text: str) -> Any:
    """The value of ``-O.FIELD=VALUE``: JSON (``true``, ``[1, 2]``), else a Python literal, else the string
    itself. A bare number is that number (not a level, as a whole config's bare digit is)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
        return text


def _is_flag(text: str) -> bool:
    """Whether an argument is a flag (``-O3``, ``--modes``), not a value (``-1``, ``[1, 2]``)."""
    if not text.startswith("-"):
        return False
    try:
        float(text)
    except ValueError:
        return True
    return False


def _level(flag: str, text: str) -> str:
    if text not in OPTIMIZATION_LEVEL_MODES:
        raise ConfigError(f"{flag}: optimization level expected 0, 1, 2 or 3, got {echo(text)}")
    return text


def _set_path(fields: dict, path: list[str], value: Any) -> None:
    """``fields[path[0]][path[1]]... = value``, making the dicts on the way.

    Raises:
        ConfigError: a field on the way was set to a value that is not a dict (``-O.a=1 -O.a.b=2``).
    """
    for depth, key in enumerate(path[:-1], 1):
        fields = fields.setdefault(key, {})
        if not isinstance(fields, dict):
            inner = ".".join(path[:depth])
            raise ConfigError(f"-O.{'.'.join(path)}: -O.{inner} was set to {echo(fields)}, not a dict; give one")
    if isinstance(fields.get(path[-1]), dict):
        raise ConfigError(f"-O.{'.'.join(path)}: its fields were set one by one too; give one or the other")
    fields[path[-1]] = value


def expand_vllm_spellings(argv: list[str]) -> list[str]:
    """``argv`` with vLLM's spellings spelled out (module doc): an optimization level as
    ``--optimization-level N``, and a whole config and every dotted field as one ``--compilation-config``.

    Raises:
        ConfigError: an optimization level not in 0-3, or given twice; a dotted field without a name or a
            value, or given twice (also as a whole config's key); a whole config (``-O VALUE``, ``-cc``,
            ``--compilation-config``) given twice, or one that is not a dict next to dotted fields: where
            all but one would be dropped without a word.
    """
    out, wholes, levels, dotted, nested = [], [], [], set(), {}
    args = iter(argv)
    for arg in args:
        prefix = next((p for p in _DOTTED if arg.startswith(p)), None)
        if prefix is not None:
            path_text, sep, text = arg[len(prefix) :].partition("=")
            flag = prefix + path_text
            if not path_text or "" in path_text.split("."):
                raise ConfigError(f"{prefix}FIELD=VALUE: no field name in {echo(arg)}")
            if not sep:
                text = next(args, None)
                if text is None or _is_flag(text):
                    raise ConfigError(f"{flag}: no value; expected {flag}=VALUE or {flag} VALUE")
            if path_text in dotted:
                raise ConfigError(f"-O.{path_text} given twice ({echo(arg)}); give each field once")
            dotted.add(path_text)
            _set_path(nested, path_text.split("."), _field_value(text))
        elif arg.startswith("-O") and arg[2:].isdigit():
            levels.append(_level("-O", arg[2:]))
        elif arg.startswith("--optimization-level="):
            levels.append(_level("--optimization-level", arg.split("=", 1)[1]))
        elif arg == "--optimization-level":
            levels.append(_level(arg, next(args, "")))
        elif arg in _WHOLE:
            value = next(args, "")
            if arg == "-O" and value.strip().isdigit():
                levels.append(_level("-O", value.strip()))
            else:
                wholes.append(value)
        elif arg.startswith("--compilation-config="):
            wholes.append(arg.split("=", 1)[1])
        else:
            out.append(arg)
    if len(levels) > 1:
        raise ConfigError(f"optimization level given twice ({', '.join('-O' + n for n in levels)}); give one")
    if len(wholes) > 1:
        raise ConfigError(
            f"--compilation-config given twice (as -O, -cc or --compilation-config: "
            f"{', '.join(echo(w) for w in wholes)}); merge them into one dict, or set fields with -O.FIELD=VALUE"
        )
    whole = wholes[0] if wholes else None
    if nested:
        fields = config_fields(whole) if whole is not None else {}
        twice = sorted(set(fields) & set(nested), key=str)
        if twice:
            raise ConfigError(
                f"{twice[0]} given twice (in --compilation-config and as -O.{twice[0]}); give each field once"
            )
        whole = repr({**fields, **nested})
    out += ["--optimization-level", levels[0]] if levels else []
    return out + (["--compilation-config", whole] if whole is not None else [])
