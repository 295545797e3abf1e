"""vLLM's spellings of the compilation flags on the command line, spelled out before argparse reads them.
Imports no torch.

* ``-O<n>``, ``-O=<n>``, ``-O <n>``, ``--optimization-level <n>``: vLLM's optimization level (today's
  meaning; in the seed's vLLM ``-O3`` meant compilation level 3). Levels are defaults for several settings at
  once, and here the settings they choose between are the modes: ``OPTIMIZATION_LEVEL_MODES``; so a
  compilation config goes with a level whose mode is compiled (``-O1`` .. ``-O3``; ``-O0`` is eager).
* ``-O.FIELD=VALUE``, ``-cc.FIELD=VALUE``, ``--compilation-config.FIELD=VALUE`` (or ``... VALUE`` as the
  next argument): one field of the compilation config; dots nest, e.g.
  ``-O.inductor_compile_config.max_autotune=true``, except inside ``inductor_compile_config``, whose option
  names are Inductor's own dotted ones (``-O.inductor_compile_config.cpp.threads=4`` sets ``'cpp.threads'``;
  vLLM's parser nests every dot, which Inductor refuses). All of them merge into one ``--compilation-config``.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from reference.benchmark.choices import MODE_KWARGS
from reference.config import ConfigError, config_fields, echo

# vLLM's optimization levels as this CLI's modes (docs.vllm.ai, design/optimization_levels): 0 compiles
# nothing and captures nothing; 1 is Dynamo + Inductor with piecewise graphs; 2 (vLLM's default) adds full
# graphs (FULL_AND_PIECEWISE); 3 is, in vLLM today, the same as 2.
OPTIMIZATION_LEVEL_MODES = {"0": "eager", "1": "inductor", "2": "inductor_full", "3": "inductor_full"}
_DOTTED = ("-O.", "-cc.", "--compilation-config.")
_WHOLE = ("-cc", "--compilation-config")
_LEVELS = "0, 1, 2 or 3"
_INT = re.compile(r"-?[0-9]+")  # ASCII digits only: str.isdigit() also accepts '²'


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
    """``text`` as an optimization level, ``flag`` naming where it was given.

    Raises:
        ConfigError: ``text`` is not one of 0-3.
    """
    if text not in OPTIMIZATION_LEVEL_MODES:
        raise ConfigError(f"{flag}: optimization level expected {_LEVELS}, got {echo(text)}")
    return text


def _no_level(flag: str) -> ConfigError:
    """The error of ``flag`` given without a level: last, before another flag, or with an empty value."""
    return ConfigError(f"{flag}: no value; expected an optimization level {_LEVELS}")


def _field_path(path_text: str) -> list[str]:
    """The keys ``-O.PATH`` sets, outermost first: dots nest, except below ``inductor_compile_config``, whose
    keys are Inductor's option names, themselves dotted (``cpp.threads``, ``triton.cudagraphs``)."""
    parts = path_text.split(".")
    if parts[0] == "inductor_compile_config" and len(parts) > 2:
        return [parts[0], ".".join(parts[1:])]
    return parts


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


def _config_not_applied(typed: str, level: str, configs: list[str]) -> ConfigError | None:
    """The error of a compilation config (``configs``, as typed) next to optimization level ``level`` (typed
    as ``typed``) whose mode takes none, e.g. ``-O0 -O.custom_ops=[...]``; None where its mode is compiled.

    In vLLM a level only sets defaults, which explicit fields override; here a level picks a mode, one row
    of the results, and -O0's is eager: ``enforce_eager`` alone (``MODE_KWARGS``), no compilation config,
    as ``--modes eager`` with ``--compilation-config`` is refused rather than the config dropped."""
    mode = OPTIMIZATION_LEVEL_MODES[level]
    if "compilation_config" in MODE_KWARGS[mode]:
        return None
    them = "them" if len(configs) > 1 else "it"
    return ConfigError(
        f"{typed} runs the {mode} mode ({', '.join(MODE_KWARGS[mode])}), which takes no compilation config, "
        f"so {', '.join(configs)} cannot apply; drop {them}, or choose a compiled level (-O1 .. -O3)"
    )


def expand_vllm_spellings(argv: list[str]) -> list[str]:
    """``argv`` with vLLM's spellings spelled out (module doc): an optimization level as
    ``--optimization-level N``, and a whole config and every dotted field as one ``--compilation-config``.
    ``-O=N`` is ``-ON``, as in vLLM; ``-O VALUE`` is a level where VALUE is an int, else a whole config.

    Raises:
        ConfigError: an optimization level without a value, not in 0-3 (``-O7``, ``-O-1``, ``-O3x``), or
            given twice (each named as typed); a dotted field without a name or a value, or given twice
            (also as a whole config's key); a whole config (``-O VALUE``, ``-cc``, ``--compilation-config``)
            given twice, or one that is not a dict next to dotted fields: where all but one would be dropped
            without a word; a compilation config next to a level whose mode takes none (``-O0``).
    """
    out, wholes, levels, dotted, nested = [], [], [], set(), {}
    configs = []  # the compilation configs and fields as typed, for messages
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
            parts = _field_path(path_text)
            for other in sorted(dotted):  # a dict's value and one of its fields, in either order
                shorter, longer = sorted((_field_path(other), parts), key=len)
                if longer[: len(shorter)] == shorter:
                    first, second = sorted((other, path_text), key=len)
                    raise ConfigError(
                        f"-O.{first} and -O.{second} both set {'.'.join(shorter)}; give the dict or its fields"
                    )
            dotted.add(path_text)
            configs.append(flag)
            _set_path(nested, parts, _field_value(text))
        elif arg == "--optimization-level" or arg.startswith("--optimization-level="):
            flag, sep, text = arg.partition("=")
            if not sep:
                text = next(args, None)
                if text is None or _is_flag(text):
                    raise _no_level(flag)
            if not text.strip():
                raise _no_level(flag)
            levels.append((arg if sep else f"{flag} {text}", _level(flag, text)))
        elif arg == "-O":
            value = next(args, None)
            if value is None or _is_flag(value) or not value.strip():
                raise _no_level(arg)
            if _INT.fullmatch(value.strip()):
                levels.append((f"-O {value.strip()}", _level(arg, value.strip())))
            else:
                wholes.append(value)
                configs.append(f"-O {echo(value, 60)}")
        elif arg.startswith("-O"):  # -O3 and -O=3; -O7, -O-1, -O3x are bad levels (-O.FIELD: above)
            text = arg[3:] if arg.startswith("-O=") else arg[2:]
            if not text.strip():
                raise _no_level("-O")
            if text.lstrip().startswith("{"):  # a config where a level goes: vLLM reads it as a level too
                raise ConfigError(
                    f"-O: optimization level expected {_LEVELS}, got {echo(text)}; a compilation config goes as "
                    "-O '{...}' (a space, no '=') or --compilation-config={...}"
                )
            levels.append((arg, _level("-O", text)))
        elif arg in _WHOLE:
            value = next(args, "")
            wholes.append(value)
            configs.append(f"{arg} {echo(value, 60)}")
        elif arg.startswith(("--compilation-config=", "-cc=")):
            flag, value = arg.split("=", 1)
            wholes.append(value)
            configs.append(f"{flag}={echo(value, 60)}")
        else:
            out.append(arg)
    if len(levels) > 1:
        times = "twice" if len(levels) == 2 else f"{len(levels)} times"
        raise ConfigError(f"optimization level given {times} ({', '.join(t for t, _ in levels)}); give one")
    if len(wholes) > 1:
        raise ConfigError(
            f"--compilation-config given twice (as -O, -cc or --compilation-config: "
            f"{', '.join(echo(w) for w in wholes)}); merge them into one dict, or set fields with -O.FIELD=VALUE"
        )
    if levels and configs:
        error = _config_not_applied(*levels[0], configs)
        if error is not None:
            raise error
    whole = wholes[0] if wholes else None
    if nested:
        fields = config_fields(whole) if whole is not None else {}
        twice = sorted(set(fields) & set(nested), key=str)
        if twice:
            raise ConfigError(
                f"{twice[0]} given twice (in --compilation-config and as -O.{twice[0]}); give each field once"
            )
        whole = repr({**fields, **nested})
    out += ["--optimization-level", levels[0][1]] if levels else []
    return out + (["--compilation-config", whole] if whole is not None else [])
