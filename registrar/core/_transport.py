"""The transport contract: what the registrar's loop asks of a protocol (`Transport`), the values
it answers with (it classifies what a server said, never raises on it) and the optional abilities
it detects (docs/architecture.md, "Adding a protocol in one file")."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ._clock import Waker
from ._diagnosis import Evidence
from ._errors import ConfigError

Timeout = float | tuple[float, float]
"""Seconds for the whole request, or a (connect, read) pair."""

TokenProvider = Callable[[], str | None]
"""Answers the bearer token when a request is about to be sent (None: send none), so a rotated
token (a re-written file, a refreshed secret) is used from the next request on."""
Token = str | TokenProvider


def deadline_seconds(timeout: Timeout) -> float:
    return sum(timeout) if isinstance(timeout, tuple) else timeout


def connect_read(timeout: Timeout) -> tuple[float, float]:
    return timeout if isinstance(timeout, tuple) else (timeout, timeout)


class Verdict(StrEnum):
    """What a registration attempt means for the next step."""

    ACCEPTED = "accepted"
    RETRY = "retry"  # transient: refused, reset, timed out, unresolvable, 5xx, 408, 429
    FATAL = "fatal"
    """The configuration is wrong (any other 4xx, TLS verification): retrying cannot help."""


@dataclass(frozen=True)
class RegisterOutcome:
    verdict: Verdict
    status_code: int | None = None
    error: str | None = None
    """Operator-readable, secret-free text naming the root cause or what to fix."""
    retry_after: float | None = None  # seconds asked by the server (429/503 `Retry-After`)
    refused: bool = False  # no process listens: probing again soon costs it nothing (no backoff)
    unsent: bool = False  # it never left (the name did not resolve): no look for it is needed

    @property
    def reachable(self) -> bool:
        return self.status_code is not None


class Route(StrEnum):
    PRESENT = "present"
    CONFLICT = "conflict"  # our rank is registered with another address: warn, do not fight
    MISSING = "missing"  # the server has forgotten us: register again
    UNDETERMINED = "undetermined"  # cannot tell (e.g. other ranks still missing): keep watching
    UNREACHABLE = "unreachable"


@dataclass(frozen=True)
class RouteCheck:
    """The result of one route check, with the evidence that decided it."""

    route: Route
    status_code: int | None = None
    evidence: str = ""
    refused: bool = False  # UNREACHABLE, refused: the server is down; probed again at once
    broken: bool = False
    """UNREACHABLE: the kept-alive connection broke (the server going away or replaced)."""
    count: int | None = None
    """The registrations the server said it holds (SGLang's 503 "N workers registered"): after
    an attempt whose answer was lost, only 0 proves it did not arrive."""

    @property
    def reachable(self) -> bool:
        return self.route is not Route.UNREACHABLE


@runtime_checkable
class Transport(Protocol):
    """How a registrar talks to its server, from the registrar's thread only. It answers with
    outcome values and never raises on what a server says."""

    @property
    def display_url(self) -> str:
        """The server's URL with credentials redacted, for status and logs."""

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        """Send the registration once; classify, never raise on what the server says."""

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """Check once that the route is still there; None when the protocol cannot tell."""

    def close(self) -> None:
        """Release connections (and a lease, say); called once, when the registrar's thread ends."""


@runtime_checkable
class IdleWatcher(Protocol):
    """Optional: a transport that can tell, while idle between checks, that its route may be
    gone (the server closed the kept-alive connection, a watch reported the key deleted)."""

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait up to `timeout` seconds: True at once on a sign of a lost route, False on timeout
        or as soon as `waker` is set. Never raises; one that cannot watch now waits on `waker`."""


@runtime_checkable
class Abortable(Protocol):
    """Optional: `stop()` ends a request in flight early, not at its deadline."""

    def abort(self) -> None:
        """End the request in flight now, if any (called from another thread; never raises)."""


@runtime_checkable
class Resolving(Protocol):
    """Optional: says what the resolver does to the server's host name (`Status.resolution`)."""

    def resolution(self) -> str | None:
        """ "resolving NAME ..." while its lookup stalls, the last good address in use while
        it fails, else None (called from any thread; never blocks on a request)."""


@runtime_checkable
class FleetSized(Protocol):
    """Optional: how many clients register with the same server (SGLang: the prefill topology's
    size), over which the loop spreads a fleet's first contact and probes (else one)."""

    def fleet_size(self, payload: Mapping[str, Any]) -> int:
        """How many clients (including this one) register with this server, at least 1."""


@runtime_checkable
class WatchBounded(Protocol):
    """Optional: the protocol fits the watch interval, whatever front door built the registrar:
    etcd's checks renew its lease (a longest value), smg's undo an operator's DELETE (a default)."""

    def fit_watch_interval(self, given: float | None, chosen: bool) -> float | None:
        """The interval to use for `given` (`chosen`: the caller set it); `ConfigError` if unfit."""


@runtime_checkable
class Diagnosable(Protocol):
    """Optional: can gather evidence about where it registers (the HTTP transports)."""

    def evidence(self, payload: Mapping[str, Any]) -> Evidence:
        """Probe cheaply (resolve, connect, one or two GETs), never raise."""


@runtime_checkable
class Gated(Protocol):
    """Optional: the registration is offered only while the served process is ready. While
    `not_ready()` names a reason the loop asks again every `ready_interval` seconds, spending no
    startup budget; withdrawing is the transport's business (`check` then reports it missing)."""

    @property
    def ready_interval(self) -> float: ...

    def not_ready(self) -> str | None:
        """None when the registration may be offered now, else why not in one line; never raises."""


def file_token(path: str | os.PathLike[str], name: str) -> TokenProvider:
    """A `TokenProvider` reading `path` before each request; `ConfigError` naming `name` when it
    cannot be read now or is empty (missing mid-rotation: that request fails and is retried)."""
    source = Path(path)
    try:
        first = source.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {name} {str(source)!r}: {exc.strerror or exc}") from None
    if not first:
        raise ConfigError(f"{name} {str(source)!r} is empty")
    return lambda: source.read_text().strip() or None
