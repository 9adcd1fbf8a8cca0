"""The immutable status snapshot that health endpoints, metrics and people read."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, TypedDict

from ._diagnosis import Diagnosis
from ._machine import State


def iso_utc(timestamp: float | None) -> str | None:
    """An epoch timestamp as ISO 8601 UTC text (`2026-11-30T03:00:00.000Z`), or None."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_TIMESTAMPS = ("since", "last_success_at", "next_attempt_at", "last_check_at", "last_request_at")


@dataclass(frozen=True)
class Status:
    """One consistent view of a registrar, replaced whole on every change. Timestamps are
    wall-clock epoch seconds (ISO 8601 UTC in `to_dict()`); `next_attempt_at` is None when no
    attempt is scheduled (registered, an attempt in flight, or given up for good)."""

    state: State
    since: float
    url: str
    attempt: int = 0
    """Attempts in the current run of failures (0 after a success)."""
    attempts_total: int = 0
    """Registration requests sent since start."""
    last_error: str | None = None
    last_success_at: float | None = None
    next_attempt_at: float | None = None
    registrations: int = 0
    """Accepted registrations, the first one included."""
    reregistrations: int = 0
    """Times the route was found missing and registration started again."""
    server_reachable: bool | None = None
    """Whether the bootstrap server answered the last request (None before any)."""
    last_check_at: float | None = None
    route: str | None = None
    """What the last route check found: present, conflict, missing, undetermined, unreachable;
    None before any, and from an accepted registration until the check after it."""
    retrying: bool = False
    """True while attempts are scheduled or in flight (also in FAILED with on_failure="retry")."""
    last_request_at: float | None = None
    """When the last request (registration or check) ended: when `server_reachable` was read."""
    resolution: str | None = None
    """Read live: "resolving NAME (no answer for 3 s)" while a lookup stalls past its first
    second, or the last good address in use while lookups fail; None while names resolve."""
    thread_died: bool = False
    """No thread will update this snapshot again (an unexpected error, or this process is a
    fork): in the snapshot so a reader never sees "dead" without the reason (`last_error`)."""
    diagnosis: Diagnosis | None = None
    """What a probe saw after requests kept failing for `diagnose_after` seconds (a wrong port,
    a name that does not resolve, ...); None while the server answers."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping of every field, in snake_case (`/health` converts to camelCase
        by one rule: Python names in Python, JSON names on the wire)."""
        data = asdict(self) | {"state": self.state.value}
        return data | {key: iso_utc(data[key]) for key in _TIMESTAMPS}


class Changes(TypedDict, total=False):
    """The fields of `Status` a change sets (all but the state, its time and the URL, which
    the machine and construction set): typed from `decide` to the snapshot."""

    attempt: int
    attempts_total: int
    last_error: str | None
    last_success_at: float | None
    next_attempt_at: float | None
    registrations: int
    reregistrations: int
    server_reachable: bool | None
    last_check_at: float | None
    route: str | None
    retrying: bool
    last_request_at: float | None
    resolution: str | None
    thread_died: bool
    diagnosis: Diagnosis | None
