"""The checks: one status snapshot read as named health checks (their Kubernetes names, their
health+json entries), and the verdict of several registrars of one service."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ...core.machine import State
from ...core.status import Status, iso_utc

HealthStatus = Literal["pass", "warn", "fail"]
_SEVERITY: dict[str, int] = {"pass": 0, "warn": 1, "fail": 2}

READINESS_CHECKS = ("registration", "server", "route")
"""The checks behind `/readyz`, by their Kubernetes names."""
LIVENESS_CHECKS = ("thread", "retrying")
"""The checks behind `/livez`: they fail only when nothing will change by itself."""


@dataclass(frozen=True)
class Check:
    """One named check. `name` is its Kubernetes name (`/readyz/<name>`, `?exclude=<name>`),
    `key` its health+json key (`component:measurement`), `entry` its health+json object."""

    name: str
    key: str
    status: HealthStatus
    reason: str | None
    entry: dict[str, Any]
    more: tuple[dict[str, Any], ...] = ()
    """The entries of the other members of a group (one per registry), after `entry`."""


def camel_case(name: str) -> str:
    """`attempts_total` -> `attemptsTotal`: the one rule from Python names to JSON names."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclass(frozen=True)
class _Observed:
    """What a check observed, as its health+json entry says it (`taken_at` None: no reading
    yet, so no time)."""

    component_type: str
    value: Any
    unit: str
    taken_at: float | None
    component_id: str | None = None
    extra: Mapping[str, Any] | None = None


def _check(
    name: str, key: str, verdict: HealthStatus, reason: str | None, seen: _Observed
) -> Check:
    entry: dict[str, Any] = {}
    if seen.component_id is not None:
        entry["componentId"] = seen.component_id
    entry.update(
        componentType=seen.component_type,
        observedValue=seen.value,
        observedUnit=seen.unit,
        status=verdict,
    )
    if seen.taken_at is not None:
        entry["time"] = iso_utc(seen.taken_at)
    if reason is not None and verdict != "pass":
        entry["output"] = reason
    entry.update(seen.extra or {})
    return Check(name, key, verdict, reason if verdict != "pass" else None, entry)


def health_checks(
    status: Status, *, thread_died: bool = False, now: float | None = None
) -> dict[str, Check]:
    """Every check, by name, read from one status snapshot taken at `now`."""
    taken = time.time() if now is None else now
    thread_died = thread_died or status.thread_died
    state = status.state
    # A registrar with no thread (it died, or this is a forked copy) cannot know its route.
    registered = state is State.REGISTERED and not thread_died
    fields = {
        camel_case(k): v for k, v in status.to_dict().items() if k not in ("state", "last_error")
    }
    if thread_died:
        reason = status.last_error or "the registrar's thread died"
    elif registered:
        reason = None
    elif state is State.FAILED:
        reason = status.last_error or "registration failed"
    elif state is State.STOPPED:
        reason = "the registrar was stopped"
    elif state is State.UNREGISTERED:
        reason = "not started"
    else:
        reason = status.last_error or "registering"
    if status.diagnosis is not None and not registered:
        reason = f"{reason}; diagnosis {status.diagnosis.code}: {status.diagnosis.sentence}"
    registration = _check(
        "registration",
        "registration:state",
        "pass" if registered else "fail",
        reason,
        _Observed("component", state.value, "state", taken, status.url, fields),
    )
    reachable = status.server_reachable
    server = _check(
        "server",
        "bootstrap:reachable",
        "warn" if reachable is False else "pass",
        "the bootstrap server did not answer the last request",
        _Observed("system", reachable, "boolean", status.last_request_at, status.url),
    )
    found = status.route
    route_reason = {
        "conflict": "another registration holds this rank's route",
        "missing": "the server has forgotten this route",
        "unreachable": "the route could not be checked",
    }.get(found or "")
    route = _check(
        "route",
        "route:check",
        "warn" if route_reason else "pass",
        route_reason,
        _Observed("component", found, "finding", status.last_check_at, status.url),
    )
    thread = _check(
        "thread",
        "registrar:thread",
        "fail" if thread_died else "pass",
        f"the registrar's thread died: {status.last_error}" if thread_died else None,
        _Observed("component", not thread_died, "boolean", taken),
    )
    gave_up = state is State.FAILED and not status.retrying
    retrying = _check(
        "retrying",
        "registration:retrying",
        "fail" if gave_up else "pass",
        f"gave up for good: {status.last_error or 'no attempt is scheduled'}",
        _Observed("component", status.retrying, "boolean", taken),
    )
    return {c.name: c for c in (registration, server, route, thread, retrying)}


def worst(verdicts: Iterable[HealthStatus]) -> HealthStatus:
    """The most severe of `verdicts` (pass when empty)."""
    return max(verdicts, key=_SEVERITY.__getitem__, default="pass")


def group_checks(
    members: Sequence[tuple[Status, bool]], *, now: float | None = None
) -> dict[str, Check]:
    """Every check of a group, by name: one entry per member (its own `status` in it), and
    one verdict for the group. Registration passes when every member is registered, warns
    when some are (the service is reachable through them), fails when none is; every other
    check is the worst of its members'."""
    taken = time.time() if now is None else now
    per = [health_checks(status, thread_died=died, now=taken) for status, died in members]
    merged: dict[str, Check] = {}
    for name in per[0]:
        checks = [p[name] for p in per]
        verdicts = [c.status for c in checks]
        verdict = worst(verdicts)
        if name == "registration" and "pass" in verdicts and verdict == "fail":
            verdict = "warn"
        reasons = [
            f"{status.url}: {c.reason}"
            for (status, _), c in zip(members, checks, strict=True)
            if c.reason
        ]
        merged[name] = Check(
            name,
            checks[0].key,
            verdict,
            "; ".join(reasons) if reasons and verdict != "pass" else None,
            checks[0].entry,
            tuple(c.entry for c in checks[1:]),
        )
    return merged

