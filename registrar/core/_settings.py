"""The registrar's settings: one frozen value per concern, validated once, when it is made
(docs/architecture.md, "Settings and options"). Defaults live here and nowhere else."""

from __future__ import annotations

import logging
import os
import random
import sys
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, TypedDict, get_args

from . import _rules as rules
from ._backoff import DEFAULT_MAX_RETRY_AFTER, Backoff
from ._board import Status
from ._clock import Clock, SystemClock
from ._errors import ConfigError
from ._transport import Timeout, Token

DEFAULT_BACKOFF = Backoff()
DEFAULT_WATCH_INTERVAL = 15.0
"""Seconds between route checks, for what sends no close (a partition, a host that vanished): a
restart is noticed on the idle connection. Why 15 s: docs/benchmarks.md."""
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
DEFAULT_DIAGNOSE_AFTER = 30.0
"""Seconds of requests reaching no bootstrap server before a diagnosis is stated: longer than
SGLang takes to start its bootstrap server after the ranks (seconds), short enough to name a
wrong port before an operator goes looking (docs/operations.md, troubleshooting)."""

OnFailureName = Literal["retry", "stop", "exit"]
OnFailure = OnFailureName | Callable[[Status], OnFailureName | None]
"""When the startup budget is spent; a callable is given the FAILED status (None means "stop")."""
POLICIES = get_args(OnFailureName)
EXIT_CODE = 3  # the process's exit status for on_failure="exit"


def default_exit(code: int) -> None:
    """End the process now: the registrar's thread cannot raise SystemExit into the main one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _backoff(value: object) -> Backoff:
    if not isinstance(value, Backoff):
        raise rules.Invalid("must be a registrar.Backoff")
    return value


def _on_failure(value: object) -> OnFailure:
    if not callable(value) and value not in POLICIES:
        raise rules.Invalid("must be 'retry', 'stop', 'exit' or a callable")
    return value  # type: ignore[return-value]


def _token(value: object) -> Token | None:
    """A provider (asked before each request), or a fixed token: a single-line string, which
    `rules.header_token` then holds to what an HTTP header can carry."""
    if value is None or callable(value):
        return value
    if not isinstance(value, str) or "\n" in value or "\r" in value:
        raise rules.Invalid(
            "must be a single-line string, or a callable answering one per request", secret=True
        )
    return rules.header_token(value)


def split_options(options: dict[str, Any], settings: type[Any]) -> dict[str, Any]:
    """Take out of `options` those that are fields of the dataclass `settings`."""
    names = {f.name for f in fields(settings)}
    return {name: options.pop(name) for name in list(options) if name in names}


def refuse_unknown(options: Mapping[str, Any], fix: str) -> None:
    """`Registrar`'s run-time twin of its typed keywords, for callers without a type checker:
    one line naming each option left over and how to give it instead."""
    if options:
        raise ConfigError(f"Registrar got unexpected options {', '.join(sorted(options))}: {fix}")


def options_of(settings: type[Any], required: bool = False) -> list[str]:
    """The fields of a settings class after its first (the URL); `required`: those undefaulted."""
    return [
        f.name
        for f in fields(settings)[1:]
        if f.init and not (required and (f.default, f.default_factory) != (MISSING, MISSING))
    ]


def default_of(settings: type[Any], name: str) -> Any:
    """The default of field `name` of a settings class (what `--help` shows)."""
    return settings.__dataclass_fields__[name].default


@dataclass(frozen=True)
class LoopSettings:
    """The loop: how often to retry, when to give up and what then, how often to check the route."""

    backoff: Backoff = DEFAULT_BACKOFF
    max_attempts: int | None = 5
    max_elapsed: float | None = None
    on_failure: OnFailure = "retry"
    watch_interval: float | None = DEFAULT_WATCH_INTERVAL
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    diagnose_after: float | None = DEFAULT_DIAGNOSE_AFTER

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "backoff": _backoff,
        "max_attempts": rules.count_or_none,
        "max_elapsed": rules.seconds_or_none,
        "on_failure": _on_failure,
        "watch_interval": rules.seconds_or_none,
        "max_retry_after": rules.worded(
            rules.seconds_or_zero, "must be a number of seconds >= 0 (0 ignores Retry-After)"
        ),
        "max_payload_bytes": rules.count,
        "diagnose_after": rules.seconds_or_none,
    }

    def __post_init__(self) -> None:
        rules.check_fields(self, self.RULES)


@dataclass(frozen=True)
class HttpSettings:
    """Where and how to reach an HTTP server: its URL, each request's deadline, the bearer
    token, and TLS (`verify`: True for the system's CAs, False, or a CA file or directory)."""

    url: str
    timeout: Timeout = 5.0
    token: Token | None = None
    verify: bool | str = True

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "url": rules.url,
        "timeout": rules.timeout,
        "token": _token,
        "verify": rules.tls,
    }

    def __post_init__(self) -> None:
        rules.check_fields(self, self.RULES)


class LoopOptions(TypedDict, total=False):
    """The keywords of every front door that are fields of `LoopSettings` and `Hooks` (checked
    against them by tests/test_front_doors.py): what mypy checks at a caller."""

    backoff: Backoff
    max_attempts: int | None
    max_elapsed: float | None
    on_failure: OnFailure
    watch_interval: float | None
    max_retry_after: float
    max_payload_bytes: int
    diagnose_after: float | None
    clock: Clock
    rng: Callable[[], float]
    exit: Callable[[int], None]


class HttpOptions(TypedDict, total=False):
    """The fields of `HttpSettings` after the URL, as keywords."""

    timeout: Timeout
    token: Token | None
    verify: bool | str


class Options(LoopOptions, HttpOptions, total=False):
    """`Registrar`'s keywords: the loop's, and the HTTP settings of a protocol built on them."""


@dataclass(frozen=True)
class Hooks:
    """What tests and embedders inject: the clock, the random source, and how to exit."""

    clock: Clock = field(default_factory=SystemClock)
    rng: Callable[[], float] = random.random
    exit: Callable[[int], None] = default_exit
