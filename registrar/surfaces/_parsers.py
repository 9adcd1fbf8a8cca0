"""The options table's parsers: each turns the text of a variable or a flag into a typed value,
and nothing more; the value's rule is the settings field's (`registrar.core._rules`). A
ValueError says what text is expected."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from ..core._rules import worded

_T = TypeVar("_T")
_OFF = frozenset({"off", "none", "never", "unlimited", "inf"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _off_or(parse: Callable[[str], _T], expected: str) -> Callable[[str], _T | None]:
    """`parse`, or None for a word that means no limit."""
    read = worded(parse, expected, ValueError)
    return lambda text: None if text.strip().lower() in _OFF else read(text)


seconds = worded(number, "must be a positive number of seconds", ValueError)
parse_seconds_or_zero = worded(number, "must be a number of seconds >= 0", ValueError)
seconds_or_off = _off_or(number, "must be a positive number of seconds, or off")
int_or_off = _off_or(int, "must be an integer >= 1, or unlimited")
integer = worded(int, "must be an integer", ValueError)


def timeout(text: str) -> float | tuple[float, float]:
    parts = text.split(",")
    if len(parts) == 1:
        return seconds(parts[0])
    if len(parts) == 2:
        return (seconds(parts[0]), seconds(parts[1]))
    raise ValueError("must be seconds, or connect,read seconds")


def word(*words: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in words:
            raise ValueError(f"must be {', '.join(words[:-1])} or {words[-1]}")
        return value

    return parse


def parse_flag(text: str) -> bool:
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("must be true or false")


def parse_port(text: str) -> int:
    """A TCP port to listen on, 0 meaning any free one (the health server's own rule: it is no
    registration setting)."""
    expected = "must be a port number within [0, 65535] (0: any free port)"
    value = worded(int, expected, ValueError)(text)
    if not 0 <= value <= 65535:
        raise ValueError(expected)
    return value
