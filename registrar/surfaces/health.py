"""Health for people and machines: `application/health+json`, a WSGI app, an ASGI app, a small
server.

Readiness depends on registration; liveness does not depend on the bootstrap server being
reachable, or a registry outage would restart the whole fleet. Liveness fails only when the
registrar has given up for good or its thread died.

The documents follow the draft "Health Check Response Format for HTTP APIs": `pass` and `warn`
answer 200, `fail` answers 503, and the top-level status is the worst of the checks shown, so
the levels always agree. The paths follow Kubernetes' conventions: `/readyz` and `/livez`, one
path per check (`/readyz/registration`), `?exclude=NAME` and `?verbose` (plain text).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qs

from .._version import __version__
from ..core.machine import State
from ..core.redact import clean
from ..core.status import Status, iso_utc
from .httpserver import ProbeServer
from .metrics import RegistrarMetrics, metrics_available

__all__ = [
    "HEALTH_CONTENT_TYPE",
    "LIVENESS_CHECKS",
    "READINESS_CHECKS",
    "Answer",
    "Check",
    "HealthGroup",
    "HealthServer",
    "HealthSource",
    "answer_health",
    "camel_case",
    "group_checks",
    "health_app",
    "health_asgi_app",
    "health_checks",
    "is_live",
    "render_group_health",
    "render_health",
    "start_health_server",
]

logger = logging.getLogger(__name__)

HEALTH_CONTENT_TYPE = "application/health+json"
TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], ASGIReceive, ASGISend], Awaitable[None]]

HealthStatus = Literal["pass", "warn", "fail"]
_SEVERITY: dict[str, int] = {"pass": 0, "warn": 1, "fail": 2}

READINESS_CHECKS = ("registration", "server", "route")
"""The checks behind `/readyz`, by their Kubernetes names."""
LIVENESS_CHECKS = ("thread", "retrying")
"""The checks behind `/livez`: they fail only when nothing will change by itself."""
_PROBES: dict[str, tuple[str, ...]] = {
    "readyz": READINESS_CHECKS,
    "livez": LIVENESS_CHECKS,
    "health": READINESS_CHECKS + LIVENESS_CHECKS,
}
_REASONS = {
    200: "200 OK",
    404: "404 Not Found",
    405: "405 Method Not Allowed",
    503: "503 Service Unavailable",
}


class HealthSource(Protocol):
    """What the health endpoints read: a `Registrar` fits."""

    def status(self) -> Status: ...

    @property
    def thread_died(self) -> bool: ...

    @property
    def payload(self) -> dict[str, Any]: ...


@runtime_checkable
class HealthGroup(Protocol):
    """Several registrations of one service, one per registry (a `RegistrarGroup` fits):
    every check shows one entry per member."""

    def members(self) -> Sequence[HealthSource]: ...


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


def _check(
    name: str,
    key: str,
    verdict: HealthStatus,
    reason: str | None,
    *,
    component_type: str,
    value: Any,
    unit: str,
    taken_at: float | None,
    component_id: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Check:
    entry: dict[str, Any] = {}
    if component_id is not None:
        entry["componentId"] = component_id
    entry.update(
        componentType=component_type,
        observedValue=value,
        observedUnit=unit,
        status=verdict,
    )
    if taken_at is not None:  # no reading yet (no request sent, no check made): no time
        entry["time"] = iso_utc(taken_at)
    if reason is not None and verdict != "pass":
        entry["output"] = reason
    entry.update(extra or {})
    return Check(name, key, verdict, reason if verdict != "pass" else None, entry)


def health_checks(
    status: Status, *, thread_died: bool = False, now: float | None = None
) -> dict[str, Check]:
    """Every check, by name, read from one status snapshot taken at `now` (default: the
    current time)."""
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
    registration = _check(
        "registration",
        "registration:state",
        "pass" if registered else "fail",
        reason,
        component_type="component",
        component_id=status.url,
        value=state.value,
        unit="state",
        taken_at=taken,
        extra=fields,
    )
    reachable = status.server_reachable
    server = _check(
        "server",
        "bootstrap:reachable",
        "warn" if reachable is False else "pass",
        "the bootstrap server did not answer the last request",
        component_type="system",
        component_id=status.url,
        value=reachable,
        unit="boolean",
        taken_at=status.last_request_at,
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
        component_type="component",
        component_id=status.url,
        value=found,
        unit="finding",
        taken_at=status.last_check_at,
    )
    thread = _check(
        "thread",
        "registrar:thread",
        "fail" if thread_died else "pass",
        f"the registrar's thread died: {status.last_error}" if thread_died else None,
        component_type="component",
        value=not thread_died,
        unit="boolean",
        taken_at=taken,
    )
    gave_up = state is State.FAILED and not status.retrying
    retrying = _check(
        "retrying",
        "registration:retrying",
        "fail" if gave_up else "pass",
        f"gave up for good: {status.last_error or 'no attempt is scheduled'}",
        component_type="component",
        value=status.retrying,
        unit="boolean",
        taken_at=taken,
    )
    return {c.name: c for c in (registration, server, route, thread, retrying)}


def worst(verdicts: Iterable[HealthStatus]) -> HealthStatus:
    """The top-level status of a set of checks: the most severe one (pass when empty)."""
    result: HealthStatus = "pass"
    for verdict in verdicts:
        if _SEVERITY[verdict] > _SEVERITY[result]:
            result = verdict
    return result


def default_service_id(payload: Mapping[str, Any] | None) -> str:
    """What this health document is about: the rank's address from the payload
    (`rank_ip:rank_port`), else this host and process."""
    if payload and payload.get("rank_ip") and payload.get("rank_port") is not None:
        host = str(payload["rank_ip"])
        host = f"[{host}]" if ":" in host else host
        return f"{host}:{payload['rank_port']}"
    return f"{socket.gethostname()}:{os.getpid()}"


def render_health(
    status: Status,
    *,
    payload: Mapping[str, Any] | None = None,
    thread_died: bool = False,
    probe: Literal["health", "readyz", "livez"] = "health",
    only: str | None = None,
    exclude: Sequence[str] = (),
    service_id: str | None = None,
    now: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the health+json document of `probe` (or of its one check `only`),
    leaving out the checks named in `exclude`: 200 for pass and warn, 503 for fail."""
    every = health_checks(status, thread_died=thread_died, now=now)
    description = f"registration with the bootstrap server at {status.url}"
    return _document(every, description, payload, probe, only, exclude, service_id)


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


def render_group_health(
    members: Sequence[tuple[Status, bool]],
    *,
    payload: Mapping[str, Any] | None = None,
    probe: Literal["health", "readyz", "livez"] = "health",
    only: str | None = None,
    exclude: Sequence[str] = (),
    service_id: str | None = None,
    now: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """`render_health` for a group: (status, thread_died) per member, one entry each."""
    every = group_checks(members, now=now)
    urls = ", ".join(status.url for status, _ in members)
    description = f"registration with {len(members)} registries: {urls}"
    return _document(every, description, payload, probe, only, exclude, service_id)


def _document(
    every: Mapping[str, Check],
    description: str,
    payload: Mapping[str, Any] | None,
    probe: str,
    only: str | None,
    exclude: Sequence[str],
    service_id: str | None,
) -> tuple[int, dict[str, Any]]:
    names = [only] if only is not None else list(_PROBES[probe])
    shown = [every[n] for n in names if n not in exclude]
    verdict = worst(c.status for c in shown)
    document: dict[str, Any] = {
        "status": verdict,
        "releaseId": __version__,
        "serviceId": service_id or default_service_id(payload),
        "description": description,
    }
    if verdict != "pass":
        document["output"] = "; ".join(c.reason for c in shown if c.reason)
    document["checks"] = {c.key: [c.entry, *c.more] for c in shown}
    if payload is not None:
        document["payload"] = dict(payload)
    return (503 if verdict == "fail" else 200), document


def verbose_text(
    checks: Sequence[Check], excluded: Sequence[str], unknown: Sequence[str], probe: str
) -> tuple[int, str]:
    """Kubernetes' `?verbose` output: one `[+]name ok` or `[-]name failed: reason` line per
    check (a warning shows as `[+]name warn: reason`), then the verdict."""
    lines = []
    for check in checks:
        if check.status == "pass":
            lines.append(f"[+]{check.name} ok")
        elif check.status == "warn":
            lines.append(f"[+]{check.name} warn: {check.reason}")
        else:
            lines.append(f"[-]{check.name} failed: {check.reason}")
    lines.extend(f"[+]{name} excluded: ok" for name in excluded)
    if unknown:
        listed = ", ".join(repr(n) for n in unknown)
        lines.append(f"warn: some health checks cannot be excluded: no matches for {listed}")
    failed = any(c.status == "fail" for c in checks)
    lines.append(f"{probe} check {'failed' if failed else 'passed'}")
    return (503 if failed else 200), "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, independent of WSGI or ASGI."""

    code: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _text(code: int, text: str, *extra: tuple[str, str]) -> Answer:
    body = text.encode()
    headers = (
        ("Content-Type", TEXT_CONTENT_TYPE),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        *extra,
    )
    return Answer(code, headers, body)


def answer_health(
    source: HealthSource | HealthGroup,
    method: str,
    path: str,
    query: str,
    *,
    expose_payload: bool = False,
    service_id: str | None = None,
) -> Answer | None:
    """The answer to one request, or None for `/metrics` (served by the caller). Unknown paths
    and methods answer plain text, not health documents."""
    path = path or "/"
    if path == "/metrics":
        return None if method in ("GET", "HEAD") else _not_allowed()
    probe, _, only = path.lstrip("/").partition("/")
    if probe not in _PROBES or (only and only not in _PROBES[probe]) or path.endswith("/"):
        # The client's path, escaped and capped: an answer is no place to reflect raw bytes.
        asked = clean(path, 100)
        return _text(404, f"404 not found: {asked}; try /readyz, /livez or /health\n")
    if method not in ("GET", "HEAD"):
        return _not_allowed()
    params = parse_qs(query, keep_blank_values=True)
    exclude = [n for value in params.get("exclude", []) for n in value.split(",") if n]
    members = list(source.members()) if isinstance(source, HealthGroup) else [source]
    snapshots = [_snapshot(member) for member in members]
    if isinstance(source, HealthGroup):
        every = group_checks(snapshots)
        description = f"registration with {len(members)} registries: " + ", ".join(
            status.url for status, _ in snapshots
        )
    else:
        every = health_checks(snapshots[0][0], thread_died=snapshots[0][1])
        description = f"registration with the bootstrap server at {snapshots[0][0].url}"
    if "verbose" in params:
        names = [only] if only else list(_PROBES[probe])
        shown = [every[n] for n in names if n not in exclude]
        excluded = [n for n in names if n in exclude]
        unknown = [n for n in exclude if n not in every]
        code, text = verbose_text(shown, excluded, unknown, probe)
        return _text(code, text)
    payload = members[0].payload
    code, document = _document(
        every,
        description,
        payload if expose_payload else None,
        probe,
        only or None,
        exclude,
        service_id or default_service_id(payload),
    )
    body = json.dumps(document, indent=2).encode() + b"\n"
    headers = (
        ("Content-Type", HEALTH_CONTENT_TYPE),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
    )
    return Answer(code, headers, body)


def _snapshot(source: HealthSource) -> tuple[Status, bool]:
    """A member's status and whether its thread died: the flag first, then the snapshot, and
    the snapshot's own field wins, so a reader never sees "died" without the reason that was
    published with it."""
    flagged = source.thread_died
    status = source.status()
    return status, status.thread_died or flagged


def _not_allowed() -> Answer:
    return _text(405, "405 method not allowed: use GET or HEAD\n", ("Allow", "GET, HEAD"))


def is_live(status: Status, thread_died: bool) -> bool:
    """False only when nothing will ever change by itself: the registrar gave up for good, or
    its thread died. A bootstrap server that is merely down never fails liveness."""
    if thread_died:
        return False
    return not (status.state is State.FAILED and not status.retrying)


def health_app(
    registrar: HealthSource | HealthGroup,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = False,
    service_id: str | None = None,
) -> WSGIApp:
    """A WSGI app serving `/health`, `/readyz`, `/livez`, one path per check, and `/metrics`
    with `metrics`. Mount it in any WSGI server or under Flask (see docs/operations.md)."""
    metrics_app = metrics.wsgi_app() if metrics is not None else None

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        answer = answer_health(
            registrar,
            method,
            environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            expose_payload=expose_payload,
            service_id=service_id,
        )
        if answer is None:
            answer = _no_metrics() if metrics_app is None else _wsgi_metrics(metrics_app, environ)
        start_response(_REASONS.get(answer.code, f"{answer.code} Status"), list(answer.headers))
        return [] if method == "HEAD" else [answer.body]

    return app


def _wsgi_metrics(metrics_app: WSGIApp, environ: dict[str, Any]) -> Answer:
    """prometheus-client's answer to GET, as one `Answer` with its Content-Length: it answers
    GET only, and HEAD must announce the length of the body it leaves out (a WSGI server
    would otherwise count the empty body of HEAD and say 0)."""
    started: list[tuple[str, list[tuple[str, str]]]] = []

    def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        started.append((status, headers))
        return lambda data: None

    body = b"".join(metrics_app({**environ, "REQUEST_METHOD": "GET"}, capture))
    status, headers = started[-1]
    kept = tuple(h for h in headers if h[0].lower() != "content-length")
    return Answer(int(status.split(" ", 1)[0]), (*kept, ("Content-Length", str(len(body)))), body)


def _no_metrics() -> Answer:
    return _text(
        404, "404 not found: /metrics needs the extra: pip install 'sglang-registrar[metrics]'\n"
    )


def health_asgi_app(
    registrar: HealthSource | HealthGroup,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = False,
    service_id: str | None = None,
) -> ASGIApp:
    """The same endpoints as an ASGI app, with no framework: run it under any ASGI server, or
    mount it into FastAPI/Starlette (`app.mount("/registrar", health_asgi_app(reg))`). Reading
    the status never blocks, so it is safe on the event loop."""
    metrics_app = metrics.asgi_app() if metrics is not None else None

    async def app(scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            raise ValueError(f"the health app serves HTTP only, not {scope['type']!r}")
        path: str = scope.get("path", "/")
        root: str = scope.get("root_path", "")
        # Mounted under a prefix, the path still carries it (ASGI): strip it.
        if root and path.startswith(root):
            path = path[len(root) :] or "/"
        method: str = scope.get("method", "GET")
        query = scope.get("query_string", b"").decode("latin-1")
        answer = answer_health(
            registrar, method, path, query, expose_payload=expose_payload, service_id=service_id
        )
        if answer is None:
            if metrics_app is None:
                answer = _no_metrics()
            else:
                await metrics_app({**scope, "method": "GET"}, receive, _with_length(send, method))
                return
        await send(
            {
                "type": "http.response.start",
                "status": answer.code,
                "headers": [(k.lower().encode(), v.encode()) for k, v in answer.headers],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else answer.body})

    return app


def _with_length(send: ASGISend, method: str) -> ASGISend:
    """prometheus-client's ASGI answer (one start, one body) held until its body is known, so
    that it carries a Content-Length, and HEAD announces the length of the body it leaves out."""
    held: list[dict[str, Any]] = []

    async def sized(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            held.append(message)
            return
        if message["type"] == "http.response.body" and held and not message.get("more_body"):
            body: bytes = message.get("body", b"")
            start = held.pop()
            headers = [h for h in start.get("headers", []) if h[0].lower() != b"content-length"]
            headers.append((b"content-length", str(len(body)).encode()))
            await send({**start, "headers": headers})
            message = {**message, "body": b"" if method == "HEAD" else body}
        await send(message)

    return sized


async def _lifespan(receive: ASGIReceive, send: ASGISend) -> None:
    """Nothing to set up or tear down: acknowledge the server's lifespan events."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


@dataclass
class HealthServer:
    """A running health server: `port` is the bound port; `stop()` shuts it down."""

    host: str
    port: int
    _server: ProbeServer

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> HealthServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_health_server(
    registrar: HealthSource | HealthGroup,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    metrics: RegistrarMetrics | bool | None = None,
    expose_payload: bool = False,
) -> HealthServer:
    """Serve `health_app(registrar)` on `host:port` (0: an ephemeral port) from a few daemon
    threads, whatever the number of connections (see `registrar.surfaces.httpserver`).

    `metrics=None` serves `/metrics` when prometheus-client is installed (a new registry fed by
    this registrar); True insists (ImportError naming the extra when it is missing); False
    never does; a `RegistrarMetrics` is served as given. Raises OSError when the port cannot be
    bound."""
    chosen: RegistrarMetrics | None = None
    wanted = metrics is True or (metrics is None and metrics_available())
    if isinstance(metrics, RegistrarMetrics):
        chosen = metrics
    elif wanted and isinstance(registrar, HealthGroup):
        # One registry, each member's series labelled by its registry's URL.
        for member in registrar.members():
            if hasattr(member, "add_listener"):
                labels = {"registry": member.status().url}
                member_metrics = RegistrarMetrics(
                    chosen.registry if chosen is not None else None, labels=labels
                ).attach(member)  # type: ignore[arg-type]
                chosen = chosen or member_metrics
    elif wanted and hasattr(registrar, "add_listener"):
        chosen = RegistrarMetrics().attach(registrar)  # type: ignore[arg-type]
    app = health_app(registrar, metrics=chosen, expose_payload=expose_payload)
    # Bounded under probes: a sized backlog, a deadline on every request head, a fixed pool
    # of worker threads (registrar.surfaces.httpserver; docs/reliability.md has the figures).
    server = ProbeServer(app, host, port)
    logger.info("health endpoints on http://%s:%d (/livez /readyz /health)", host, server.port)
    return HealthServer(host, server.port, server)
