"""Configuration from `REGISTRAR_*` environment variables: a reader of the options table
(`registrar.surfaces._options.OPTIONS`), so a variable means the same to every surface that reads
the environment. A bad value is one line naming the variable and showing a good value.
"""

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
"""What `read_variable` answers for a variable unset or empty."""


def read_variable(option: Option, env: Mapping[str, str], prefix: str = ENV_PREFIX) -> Any:
    """The checked value of `option`'s variable, `UNSET` when unset or empty, or
    `ConfigError` naming the variable and showing a good value."""
    key = prefix + option.name
    text = env.get(key, "").strip()
    if not text:
        return UNSET
    try:
        return option.read(text)
    except ValueError as exc:
        # A secret (a token) is never shown, even in the error that refuses it.
        shown = key if getattr(exc, "secret", False) else f"{key}={text!r}"
        raise ConfigError(f"{shown} {exc}; e.g. {key}={option.example}") from None


def _read(
    rows: Iterable[Option], environ: Mapping[str, str] | None, prefix: str
) -> list[tuple[Option, Any]]:
    """The checked values of the variables of `rows` that are set."""
    env = os.environ if environ is None else environ
    found = [(row, read_variable(row, env, prefix)) for row in rows]
    return [(row, value) for row, value in found if value is not UNSET]


def _rows(table: Iterable[Option], names: Iterable[str] | None, kwarg: bool) -> list[Option]:
    wanted = None if names is None else frozenset(names)
    return [
        row
        for row in table
        if (wanted is None or row.name in wanted) and (row.kwarg is not None) == kwarg
    ]


def options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
    table: Iterable[Option] = OPTIONS,
) -> dict[str, Any]:
    """`Registrar` keyword arguments from the variables that are set (unset or empty ones are
    left out, so the library's defaults stand), or `ConfigError` naming the variable.

    `names` restricts the table to some variables (their names after the prefix); `table`
    reads another table instead (e.g. the SGLang plugin's own)."""
    return registrar_options(_read(_rows(table, names, kwarg=True), environ, prefix))


def registrar_options(values: Iterable[tuple[Option, Any]]) -> dict[str, Any]:
    """`Registrar` keyword arguments from checked values of rows that name one, the fields of
    the `Backoff` gathered into one."""
    options: dict[str, Any] = {}
    backoff: dict[str, Any] = {}
    for row, value in values:
        assert row.kwarg is not None
        if row.kwarg.startswith("backoff."):
            backoff[row.kwarg.removeprefix("backoff.")] = value
        else:
            options[row.kwarg] = value
    if backoff:
        options["backoff"] = replace(DEFAULT_BACKOFF, **backoff)  # each field checked already
    return options


def command_options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The options of `registrar register` alone (no `Registrar` keyword) that are set, by key
    (`health_port`), or `ConfigError` naming the variable."""
    return {row.key: v for row, v in _read(_rows(OPTIONS, names, kwarg=False), environ, prefix)}


def describe_env(prefix: str = ENV_PREFIX, table: Iterable[Option] = OPTIONS) -> str:
    """One line per variable, for --help texts and docs."""
    return "\n".join(f"{prefix}{row.name}: {row.help} (e.g. {row.example})" for row in table)
