"""The values a transport answers with: it classifies what a server said, never raises on it."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


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
