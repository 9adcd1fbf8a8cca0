"""The options table's parsers: each turns the text of a variable or a flag into a typed value,
and nothing more; the value's rule is the settings field's (`registrar.core.rules`). A
ValueError says what text is expected."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = [
    "int_or_off",
    "integer",
    "number",
    "parse_flag",
    "parse_port",
    "parse_seconds_or_zero",
    "seconds",
    "seconds_or_off",
    "text",
    "timeout",
    "urls",
    "word",
]

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


def seconds(text: str) -> float:
    try:
        return number(text)
    except ValueError:
        raise ValueError("must be a positive number of seconds") from None


def parse_seconds_or_zero(text: str) -> float:
    """A number of seconds (its rule says whether 0 or less is allowed)."""
    try:
        return number(text)
    except ValueError:
        raise ValueError("must be a number of seconds >= 0") from None


def seconds_or_off(text: str) -> float | None:
    if text.strip().lower() in _OFF:
        return None
    try:
        return number(text)
    except ValueError:
        raise ValueError("must be a positive number of seconds, or off") from None


def int_or_off(text: str) -> int | None:
    if text.strip().lower() in _OFF:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer >= 1, or unlimited") from None


def integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError("must be an integer") from None


def timeout(text: str) -> float | tuple[float, float]:
    parts = text.split(",")
    if len(parts) == 1:
        return seconds(parts[0])
    if len(parts) == 2:
        return (seconds(parts[0]), seconds(parts[1]))
    raise ValueError("must be seconds, or connect,read seconds")


def word(*words: str) -> Callable[[str], str]:
    """One of `words` (an enumeration: the text names a value, or names none)."""

    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in words:
            raise ValueError(f"must be {', '.join(words[:-1])} or {words[-1]}")
        return value

    return parse


def parse_flag(text: str) -> bool:
    """1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("must be true or false")


def parse_port(text: str) -> int:
    """A TCP port to listen on, 0 meaning any free one (the health server's own rule: it is no
    registration setting)."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be a port number within [0, 65535] (0: any free port)") from None
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number within [0, 65535] (0: any free port)")
    return value


def text(text: str) -> str:
    """Text as given (a variable is stripped when read; a flag's newline is the URL rule's to
    refuse)."""
    return text


def urls(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]
