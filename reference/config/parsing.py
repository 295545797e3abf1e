"""Reading config values from users: strings as data (never ``eval``), and checks whose errors name the field.

Every function here raises :class:`ConfigError` with a one-line message that names the field, the
allowed values and (cut to a readable length, see :func:`echo`) the value it got.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    """A configuration value is missing, of the wrong type, or contradicts another value."""


def echo(value: Any, limit: int = 200) -> str:
    """``repr(value)`` for an error message, on one line (a 2-d tensor's repr breaks its rows; a string's
    repr never holds a raw line break, so a string's own spaces are kept) and cut to ``limit`` characters (a
    pasted 100 KB string or a long token list would otherwise bury the message), with the full length noted
    when cut."""
    try:
        text = re.sub(r"\s*\n\s*", " ", repr(value))
    except ValueError:  # an int past Python's digit limit for conversion (sys.get_int_max_str_digits)
        if isinstance(value, int):
            return f"an int of about {value.bit_length() * 0.30103:.0f} digits"
        return f"a {type(value).__name__} holding an int of more digits than Python prints"
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def parse_config_text(text: str) -> Any:
    """A config string as data: a bare digit is ``{'level': digit}``, else JSON, else a Python literal.

    Raises:
        ConfigError: the text is none of these (``eval`` is never used), or a dict in it gives one key
            twice (both readers would keep the last value without a word).
    """
    text = text.strip()
    if re.fullmatch(r"-?[0-9]+", text):  # ASCII digits only: str.isdigit() also accepts '²' and '٣'
        return {"level": int(text)}
    try:
        return json.loads(text, object_pairs_hook=_dict_of_distinct_keys)
    except ConfigError:  # a key given twice
        raise
    # ValueError: JSONDecodeError, or an int past Python's digit limit for conversion (literal_eval refuses it too)
    except (ValueError, RecursionError):
        pass
    try:
        value = ast.literal_eval(text)
    # TypeError: unhashable dict key or set item; RecursionError/MemoryError: absurdly deep nesting
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as err:
        raise ConfigError(
            f"compilation config: {echo(text)} is neither JSON, a Python literal nor a level digit "
            f"({type(err).__name__})"
        ) from None
    for node in ast.walk(ast.parse(text, mode="eval")):  # literal_eval accepted it, so this parses too
        if isinstance(node, ast.Dict):
            _dict_of_distinct_keys([(ast.literal_eval(key), None) for key in node.keys])
    return value


def _dict_of_distinct_keys(pairs: list[tuple[Any, Any]]) -> dict:
    """``dict(pairs)``, refusing a key given twice (json's ``object_pairs_hook``)."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise ConfigError(f"compilation config: key {echo(key)} given twice")
        seen.add(key)
    return dict(pairs)


def config_fields(value: Mapping[str, Any] | str | int | None) -> dict[str, Any]:
    """The fields a compilation-config value sets, as a new dict.

    ``None`` -> ``{}``; a level ``3`` -> ``{'level': 3}``; a string as :func:`parse_config_text` reads it;
    a mapping is copied. Keys are not checked here (the config's constructor does that).

    Raises:
        ConfigError: a string that is neither JSON, a Python literal nor a digit, or a value that is no
            dict once read.
    """
    if value is None:
        return {}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"level": value}
    text = value if isinstance(value, str) else None
    if text is not None:
        value = parse_config_text(text)
    if not isinstance(value, Mapping):
        kind = type(value).__name__
        got = f"{kind}: {echo(value)}"
        if text is not None:  # say what was typed: '+3' reads as the int 3, which is no level digit here
            got = f"{echo(text)}, {'an' if kind[0] in 'aeiou' else 'a'} {kind}"
            if isinstance(value, int) and not isinstance(value, bool):
                got += f" (a level is a bare digit: {value})"
        raise ConfigError(
            f"compilation config: expected a dict, a JSON or Python-literal string, or a level digit; got {got}"
        )
    return dict(value)


def check_type(name: str, value: Any, typ: type) -> None:
    if not isinstance(value, typ):
        kind = type(value)  # module-qualified outside builtins: numpy 2's bool is called bool too
        got = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
        raise ConfigError(f"{name}: expected {typ.__name__}, got {got} {echo(value)}")


def check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    """``value`` is an int (not a bool) in ``minimum..maximum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (maximum and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in {minimum}..{maximum}"
        raise ConfigError(f"{name}: expected an int {allowed}, got {echo(value)}")


def check_choice(name: str, value: Any, allowed: tuple) -> None:
    # type check first: 3.0 == 3 and True == 1, but neither is the int level 3 or 1
    if isinstance(value, bool) or type(value) not in {type(a) for a in allowed} or value not in allowed:
        raise ConfigError(f"{name}: expected one of {list(allowed)}, got {echo(value)}")


def string_tuple(name: str, value: Any) -> tuple[str, ...]:
    """A list or tuple of strings as a tuple."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name}: expected a list of strings, got {echo(value)}")
    for item in value:
        if not isinstance(item, str):
            raise ConfigError(f"{name}: expected a list of strings, got item {echo(item)}")
    return tuple(value)
