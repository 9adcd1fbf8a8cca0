"""The value rules of the settings, each once: a value to the value kept (normalised), or
`Invalid` saying what is allowed; the caller names the field, variable or flag (`describe`)."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from dataclasses import MISSING, fields
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ._diagnosis import port_problem
from ._errors import ConfigError
from ._redact import UNSAFE, clean, redact_url

_T = TypeVar("_T")
_V = TypeVar("_V")


class Invalid(ValueError):
    """A value broke a rule: `rule` says what is allowed ("must be ..."); `shown`, the value as
    it may be shown (redacted) before a rule ("'x' has no host"); a `secret` is never shown."""

    def __init__(self, rule: str, shown: str | None = None, *, secret: bool = False) -> None:
        super().__init__(rule)
        self.rule = rule
        self.shown = shown
        self.secret = secret


Rule = Callable[[Any], Any]


def describe(name: str, value: object, exc: Invalid) -> str:
    """One line naming `name` (a field, a variable, a flag) and the rule `value` broke."""
    if exc.secret:
        return f"{name} {exc.rule}"
    if exc.shown is not None:
        return f"{name} {exc.shown!r} {exc.rule}"
    return f"{name} {exc.rule}, got {value!r}"


def applied(name: str, value: object, rule: Rule, example: str = "") -> Any:
    """`rule(value)`, or `ConfigError` naming `name` (a field, an option, a variable)."""
    try:
        return rule(value)
    except Invalid as exc:
        raise ConfigError(describe(name, value, exc) + example) from None


def check_fields(target: object, rules: Mapping[str, Rule], prefix: str = "") -> None:
    """Apply `rules` to the frozen dataclass `target`, each field kept as its rule normalised it."""
    defaults = {f.name: f.default for f in fields(target)}  # type: ignore[arg-type]
    for name, rule in rules.items():
        good = defaults.get(name)
        example = "" if good in (None, MISSING) else f"; e.g. {name}={good!r}"
        kept = applied(prefix + name, getattr(target, name), rule, example)
        object.__setattr__(target, name, kept)


def number_within(holds: Callable[[float], bool], allowed: str) -> Callable[[object], float]:
    """The rule of a number (never a bool) for which `holds` is true, kept as a float."""

    def rule(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not holds(value):
            raise Invalid(allowed)
        return float(value)

    return rule


seconds = number_within(lambda v: 0 < v < math.inf, "must be a positive number of seconds")
seconds_or_zero = number_within(lambda v: 0 <= v < math.inf, "must be a number of seconds >= 0")
fraction_open = number_within(lambda v: 0 < v < 1, "must be a number within (0, 1)")
at_least_one = number_within(lambda v: 1 <= v < math.inf, "must be a number >= 1")
fraction = number_within(lambda v: 0 <= v <= 1, "must be a number within [0, 1]")


def count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise Invalid("must be a positive integer")
    return value


def each_seconds(value: object) -> float | tuple[float, float]:
    if isinstance(value, tuple) and len(value) == 2:
        return (seconds(value[0]), seconds(value[1]))
    return seconds(value)


def worded(
    rule: Callable[[_V], _T], allowed: str, error: type[ValueError] = Invalid
) -> Callable[[_V], _T]:
    """`rule`, the wording of its `error` replaced by `allowed` (the option parsers' too)."""

    def reworded(value: _V) -> _T:
        try:
            return rule(value)
        except error:
            raise error(allowed) from None

    return reworded


def _none_or(rule: Callable[[object], _T], allowed: str) -> Callable[[object], _T | None]:
    """None as it is, else `rule` worded by `allowed` (which names None among the values)."""
    checked = worded(rule, allowed)
    return lambda value: None if value is None else checked(value)


seconds_or_none = _none_or(seconds, "must be a positive number of seconds or None")
count_or_none = _none_or(count, "must be an integer >= 1 or None")
timeout = worded(each_seconds, "must be positive seconds or a (connect, read) pair")


def port_or_none(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise Invalid("must be a port within [1, 65535]")
    return value


def single_line(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or "\n" in value or "\r" in value:
        raise Invalid("must be a non-empty single-line string")
    return value


def header_token(value: object) -> str | None:
    """None (or empty: no token), or one line of visible ASCII, sendable as a header by every HTTP
    stack (a newline ends a header; non-latin-1 cannot be encoded). A secret: never shown."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise Invalid(f"must be a string, got {type(value).__name__}", secret=True)
    bad = next((i for i, c in enumerate(value) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise Invalid(
            "must be one line of visible ASCII characters (no spaces, no control or "
            f"non-ASCII characters); character {bad + 1} of {len(value)} is not",
            secret=True,
        )
    return value


def existing_path(value: object) -> str | None:
    """None, or a file or directory that exists now (a CA bundle, or a folder of CAs)."""
    if value is None:
        return None
    if not isinstance(value, str) or not (os.path.isfile(value) or os.path.isdir(value)):
        raise Invalid("is not a readable file or directory", shown=str(value))
    return value


def tls(value: object) -> bool | str:
    """True (the system's CAs), False (no verification), or the path of a CA file or directory
    to verify against, as `requests` and `httpx` take `verify`."""
    return str(existing_path(value)) if isinstance(value, str) else bool(value)


def url(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise Invalid("must be an http(s) URL such as http://127.0.0.1:8998")
    shown = clean(redact_url(value), 200)
    # urlsplit strips a trailing newline and drops tabs, so "http://host:8998\n" (a value read
    # from a file) would pass here and fail later, in the thread: refuse any such character.
    bad = next((i for i, c in enumerate(value) if c.isspace() or UNSAFE.match(c)), None)
    if bad is not None:
        raise Invalid(
            f"contains a space or control character at position {bad + 1} "
            "(a trailing newline from a file or variable?); remove it",
            shown,
        )
    if (unfilled := port_problem(value)) is not None:
        raise Invalid(f"{unfilled.sentence} [diagnosis {unfilled.code}]", shown)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - read for its ValueError (out of range)
    except ValueError as exc:
        raise Invalid(f"is not a valid URL: {exc}", shown) from None
    if parts.scheme not in ("http", "https"):
        raise Invalid("must start with http:// or https://, e.g. http://127.0.0.1:8998", shown)
    if not parts.hostname:
        raise Invalid("has no host, e.g. http://127.0.0.1:8998", shown)
    if parts.query or parts.fragment:
        raise Invalid("must not carry a query or fragment", shown)
    return value.rstrip("/")


def comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def urls(kind: str, example: str) -> Rule:
    """The rule of a list of `kind` URLs (a sequence, or one comma-separated string), none twice."""

    def rule(value: object) -> tuple[str, ...]:
        if isinstance(value, str):
            value = comma_list(value)
        if not isinstance(value, list | tuple) or not value:
            raise Invalid(f"must name at least one {kind} URL, e.g. {example}")
        found = tuple(url(item) for item in value)
        if len(set(found)) != len(found):
            raise Invalid(f"must not give a {kind} URL twice (a URL must not repeat)")
        return found

    return rule
