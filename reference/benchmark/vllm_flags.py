"""vLLM's shorthands for the compilation config on the command line (``-O3``, ``-O.FIELD=VALUE``,
``-cc.FIELD=VALUE``), spelled out before argparse reads the arguments. Imports no torch."""

from __future__ import annotations

import ast
import json
from typing import Any

from reference.config import ConfigError, config_fields, echo


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


def expand_vllm_spellings(argv: list[str]) -> list[str]:
    """``argv`` with vLLM's shorthands spelled out: ``-O3`` -> ``--compilation-config 3``, and every
    ``-O.FIELD=VALUE`` / ``-cc.FIELD=VALUE`` merged into one ``--compilation-config`` (with a whole one
    given too, each field set once). ``-cc VALUE`` is an alias argparse knows.

    Raises:
        ConfigError: ``-O.FIELD`` without ``=VALUE``, or a whole config that is not a dict; a whole config
            (``-O VALUE``, ``-O3``, ``-cc``, ``--compilation-config``) or one field given twice (as two
            ``-O.FIELD``, or in the whole config and as ``-O.FIELD``), where all but one would be dropped
            without a word.
    """
    out, dotted, wholes = [], {}, []
    args = iter(argv)
    for arg in args:
        if arg.startswith(("-O.", "-cc.")):
            key, sep, text = arg.split(".", 1)[1].partition("=")
            if not sep or not key:
                raise ConfigError(f"{arg.split('.')[0]}.FIELD=VALUE: expected e.g. -O.level=3, got {echo(arg)}")
            if key in dotted:
                raise ConfigError(f"-O.{key} given twice ({echo(arg)}); give each field once")
            dotted[key] = _field_value(text)
        elif arg.startswith("-O") and arg not in ("-O",) and arg[2:].lstrip("-").isdigit():
            wholes.append(arg[2:])
        elif arg in ("-O", "-cc", "--compilation-config"):
            wholes.append(next(args, ""))
        elif arg.startswith("--compilation-config="):
            wholes.append(arg.split("=", 1)[1])
        else:
            out.append(arg)
    if len(wholes) > 1:
        raise ConfigError(
            f"--compilation-config given twice (as -O, -O<level>, -cc or --compilation-config: "
            f"{', '.join(echo(w) for w in wholes)}); merge them into one dict, or set fields with -O.FIELD=VALUE"
        )
    whole = wholes[0] if wholes else None
    if dotted:
        fields = config_fields(whole) if whole is not None else {}
        twice = sorted(set(fields) & set(dotted), key=str)
        if twice:
            raise ConfigError(
                f"{twice[0]} given twice (in --compilation-config and as -O.{twice[0]}); give each field once"
            )
        whole = repr({**fields, **dotted})
    return out + (["--compilation-config", whole] if whole is not None else [])
