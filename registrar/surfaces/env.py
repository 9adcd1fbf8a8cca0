"""Configuration from `REGISTRAR_*` environment variables: a reader of the options table
(`registrar.surfaces._options.OPTIONS`), so a variable means the same to every surface that reads
the environment. A bad value is one line naming the variable and showing a good value."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..core._errors import ConfigError
from ..core._settings import DEFAULT_BACKOFF
from ._options import ENV_PREFIX, OPTIONS, Option

__all__ = [
    "UNSET",
    "command_options_from_env",
    "describe_env",
    "options_from_env",
    "read_variable",
    "registrar_options",
]

UNSET: Any = object()


def read_variable(option: Option, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> Any:
    """The checked value of `option`'s variable, or `UNSET` when it is unset or empty."""
    key = prefix + option.name
    if not (text := env.get(key, "").strip()):
        return UNSET
    try:
        return option.read(text)
    except ValueError as exc:
        # A secret (a token) is never shown, even in the error that refuses it.
        shown = key if getattr(exc, "secret", False) else f"{key}={text!r}"
        raise ConfigError(f"{shown} {exc}; e.g. {key}={option.example}") from None


def _read(
    table: Iterable[Option],
    names: Iterable[str] | None,
    kwarg: bool,
    environ: Mapping[str, str] | None,
    prefix: str,
) -> list[tuple[Option, Any]]:
    env = os.environ if environ is None else environ
    wanted = None if names is None else frozenset(names)
    rows = [r for r in table if wanted is None or r.name in wanted]
    found = [(r, read_variable(r, env, prefix)) for r in rows if (r.kwarg is not None) == kwarg]
    return [(row, value) for row, value in found if value is not UNSET]


def options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
    table: Iterable[Option] = OPTIONS,
) -> dict[str, Any]:
    """`Registrar` keyword arguments from the variables set (unset or empty ones are left out, so
    the library's defaults stand); `names` picks some variables (their names after the prefix)."""
    return registrar_options(_read(table, names, True, environ, prefix))


def registrar_options(values: Iterable[tuple[Option, Any]]) -> dict[str, Any]:
    """`Registrar` keyword arguments from checked values, the `Backoff` fields gathered in one."""
    options: dict[str, Any] = {}
    backoff: dict[str, Any] = {}
    for row, value in values:
        assert row.kwarg is not None
        group, _, name = row.kwarg.rpartition(".")  # "backoff.<field>" or a keyword
        (backoff if group else options)[name] = value
    if backoff:
        options["backoff"] = replace(DEFAULT_BACKOFF, **backoff)  # each field checked already
    return options


def command_options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The options of `registrar register` alone (no `Registrar` keyword) that are set, by key."""
    return {row.key: v for row, v in _read(OPTIONS, names, False, environ, prefix)}


def describe_env(prefix: str = ENV_PREFIX, table: Iterable[Option] = OPTIONS) -> str:
    """One line per variable, for --help texts and docs."""
    return "\n".join(f"{prefix}{row.name}: {row.help} (e.g. {row.example})" for row in table)
