"""Health for people and machines: `application/health+json`, a WSGI app and an ASGI app with
no framework, a small server (docs/operations.md). Readiness depends on registration; liveness
does not depend on the bootstrap server being reachable, or a registry outage would restart the
whole fleet. One status snapshot is read as named health checks (their Kubernetes names, their
health+json entries), a group's as one verdict, and one request is answered whatever the server
(`answer_health`: health+json or Kubernetes' `?verbose` text; the paths and queries:
docs/operations.md)."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from http import HTTPStatus
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qs

from ..._version import __version__
from ...core._board import State, Status, iso_utc
from ...core._diagnosis import hostport
from ...core._redact import clean
from .._httpserver import HealthServer, StartResponse, WSGIApp
from ..metrics import RegistrarMetrics, metrics_available

__all__ = [
    "HEALTH_CONTENT_TYPE",
    "HealthGroup",
    "HealthOptions",
    "HealthServer",
    "HealthSource",
    "answer_health",
    "camel_case",
    "health_app",
    "health_asgi_app",
    "render_health",
    "start_health_server",
]

logger = logging.getLogger(__name__)

HealthStatus = Literal["pass", "warn", "fail"]

HEALTH_CONTENT_TYPE = "application/health+json"
PROBES: dict[str, tuple[str, ...]] = {
    "readyz": ("registration", "server", "route"),
    "livez": ("thread", "retrying"),  # they fail only when nothing will change by itself
}
PROBES["health"] = PROBES["readyz"] + PROBES["livez"]


@dataclass(frozen=True)
class Check:
    """One named check. `name` is its Kubernetes name (`/readyz/<name>`, `?exclude=<name>`),
    `key` its health+json key (`component:measurement`), `entry` its health+json object, `more`
    the entries of a group's other members (one per registry)."""

    name: str
    key: str
    status: HealthStatus
    reason: str | None
    entry: dict[str, Any]
    more: tuple[dict[str, Any], ...] = ()


def camel_case(name: str) -> str:
    """`attempts_total` -> `attemptsTotal`: the one rule from Python names to JSON names."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclass(frozen=True)
class _Observed:
    """What a check observed, as its health+json entry says it (`taken_at` None: no time yet)."""

    component_type: str
    value: Any
    unit: str
    taken_at: float | None
    component_id: str | None = None
    extra: Mapping[str, Any] | None = None

    def check(self, name: str, key: str, verdict: HealthStatus, reason: str | None) -> Check:
        shown = reason if verdict != "pass" else None
        entry: dict[str, Any] = {
            "componentId": self.component_id,
            "componentType": self.component_type,
            "observedValue": self.value,
            "observedUnit": self.unit,
            "status": verdict,
            "time": None if self.taken_at is None else iso_utc(self.taken_at),
            "output": shown,
        }
        optional = ("componentId", "time", "output")  # left out when there is none
        entry = {k: v for k, v in entry.items() if v is not None or k not in optional}
        return Check(name, key, verdict, shown, {**entry, **(self.extra or {})})


def health_checks(status: Status, *, thread_died: bool, now: float) -> dict[str, Check]:
    """Every check, by name, read from one status snapshot taken at `now`."""
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
    registration = _Observed("component", state.value, "state", now, status.url, fields).check(
        "registration", "registration:state", "pass" if registered else "fail", reason
    )
    reachable = status.server_reachable
    server = _Observed("system", reachable, "boolean", status.last_request_at, status.url).check(
        "server",
        "bootstrap:reachable",
        "warn" if reachable is False else "pass",
        "the bootstrap server did not answer the last request",
    )
    found = status.route
    route_reason = {
        "conflict": "another registration holds this rank's route",
        "missing": "the server has forgotten this route",
        "unreachable": "the route could not be checked",
    }.get(found or "")
    route = _Observed("component", found, "finding", status.last_check_at, status.url).check(
        "route", "route:check", "warn" if route_reason else "pass", route_reason
    )
    thread = _Observed("component", not thread_died, "boolean", now).check(
        "thread",
        "registrar:thread",
        "fail" if thread_died else "pass",
        f"the registrar's thread died: {status.last_error}" if thread_died else None,
    )
    gave_up = state is State.FAILED and not status.retrying
    retrying = _Observed("component", status.retrying, "boolean", now).check(
        "retrying",
        "registration:retrying",
        "fail" if gave_up else "pass",
        f"gave up for good: {status.last_error or 'no attempt is scheduled'}",
    )
    return {c.name: c for c in (registration, server, route, thread, retrying)}


def worst(verdicts: Iterable[HealthStatus]) -> HealthStatus:
    return max(verdicts, key=("pass", "warn", "fail").index, default="pass")  # the most severe


def described_checks(
    members: Sequence[tuple[bool, Status]], *, group: bool, now: float | None = None
) -> tuple[dict[str, Check], str]:
    """Every check, by name, of one registrar (alone in `members`) or of a group, and what the
    document is about. A group's check has one entry per member and one verdict: registration
    passes when every member is registered, warns when some are (the service is reachable
    through them), fails when none is; every other check is the worst of its members'."""
    taken = time.time() if now is None else now
    per = [health_checks(status, thread_died=died, now=taken) for died, status in members]
    if not group:
        return per[0], f"registration with the bootstrap server at {members[0][1].url}"
    urls = [status.url for _, status in members]
    merged: dict[str, Check] = {}
    for name in per[0]:
        checks = [p[name] for p in per]
        verdicts = [c.status for c in checks]
        verdict = worst(verdicts)
        if name == "registration" and "pass" in verdicts and verdict == "fail":
            verdict = "warn"
        reasons = [f"{url}: {c.reason}" for url, c in zip(urls, checks, strict=True) if c.reason]
        merged[name] = replace(
            checks[0],
            status=verdict,
            reason="; ".join(reasons) if reasons and verdict != "pass" else None,
            more=tuple(c.entry for c in checks[1:]),
        )
    return merged, f"registration with {len(members)} registries: {', '.join(urls)}"


@dataclass(frozen=True)
class HealthOptions:
    """How the endpoints answer, beyond the checks; the payload is shown only when asked for
    (it may name internal addresses). The defaults here are the front doors' defaults."""

    expose_payload: bool = False
    service_id: str | None = None


class HealthSource(Protocol):
    """What the health endpoints read: a `Registrar` fits."""

    def status(self) -> Status: ...
    @property
    def thread_died(self) -> bool: ...
    @property
    def payload(self) -> dict[str, Any]: ...


@runtime_checkable
class HealthGroup(Protocol):
    """Several registrations of one service, one per registry (a `RegistrarGroup` fits)."""

    def members(self) -> Sequence[HealthSource]: ...


def default_service_id(payload: Mapping[str, Any] | None) -> str:
    """The rank's address from the payload (`rank_ip:rank_port`), else this host and process."""
    if payload and payload.get("rank_ip") and payload.get("rank_port") is not None:
        return hostport(str(payload["rank_ip"]), payload["rank_port"])
    return f"{socket.gethostname()}:{os.getpid()}"


def render_health(  # noqa: PLR0913 - public: the documented keyword options
    status: Status,
    *,
    payload: Mapping[str, Any] | None = None,
    thread_died: bool = False,
    probe: Literal["health", "readyz", "livez"] = "health",
    only: str | None = None,
    exclude: Sequence[str] = (),
    service_id: str | None = HealthOptions.service_id,
    now: float | None = None,
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the health+json document of `probe` (or of its one check `only`),
    leaving out the checks named in `exclude`: 200 for pass and warn, 503 for fail."""
    every, description = described_checks([(thread_died, status)], group=False, now=now)
    shown = _shown(every, probe, only, exclude)
    return render_probe(shown, description, payload, HealthOptions(True, service_id))


def _shown(
    every: Mapping[str, Check], probe: str, only: str | None, exclude: Sequence[str]
) -> list[Check]:
    return [every[n] for n in ([only] if only else PROBES[probe]) if n not in exclude]


def render_probe(
    shown: Sequence[Check],
    description: str,
    payload: Mapping[str, Any] | None,
    options: HealthOptions,
) -> tuple[int, dict[str, Any]]:
    verdict = worst(c.status for c in shown)
    document: dict[str, Any] = {
        "status": verdict,
        "releaseId": __version__,
        "serviceId": options.service_id or default_service_id(payload),
        "description": description,
    }
    if verdict != "pass":
        document["output"] = "; ".join(c.reason for c in shown if c.reason)
    document["checks"] = {c.key: [c.entry, *c.more] for c in shown}
    if payload is not None and options.expose_payload:
        document["payload"] = dict(payload)
    return (503 if verdict == "fail" else 200), document


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, independent of WSGI or ASGI."""

    code: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _answer(code: int, content_type: str, body: bytes, *extra: tuple[str, str]) -> Answer:
    headers = (
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        *extra,
    )
    return Answer(code, headers, body)


def _text(code: int, text: str, *extra: tuple[str, str]) -> Answer:
    return _answer(code, "text/plain; charset=utf-8", text.encode(), *extra)


_NOT_ALLOWED = _text(405, "405 method not allowed: use GET or HEAD\n", ("Allow", "GET, HEAD"))
NO_METRICS = _text(
    404, "404 not found: /metrics needs the extra: pip install 'sglang-registrar[metrics]'\n"
)


def answer_health(
    source: HealthSource | HealthGroup,
    method: str,
    path: str,
    query: str,
    options: HealthOptions = HealthOptions(),
) -> Answer | None:
    """The answer to one request, or None for `/metrics` (prometheus-client's, served by the
    caller). Unknown paths and methods answer plain text, not health documents."""
    path = path or "/"
    if path == "/metrics":
        return None if method in ("GET", "HEAD") else _NOT_ALLOWED
    probe, _, only = path.lstrip("/").partition("/")
    if probe not in PROBES or (only and only not in PROBES[probe]) or path.endswith("/"):
        # The client's path, escaped and capped: an answer is no place to reflect raw bytes.
        return _text(404, f"404 not found: {clean(path, 100)}; try /readyz, /livez or /health\n")
    if method not in ("GET", "HEAD"):
        return _NOT_ALLOWED
    params = parse_qs(query, keep_blank_values=True)
    exclude = [n for value in params.get("exclude", []) for n in value.split(",") if n]
    members = list(source.members()) if isinstance(source, HealthGroup) else [source]
    # The flag before the snapshot, whose own (read by `health_checks`) comes with its reason:
    # a reader never sees "died" without the reason that was published with it.
    snapshots = [(member.thread_died, member.status()) for member in members]
    every, description = described_checks(snapshots, group=isinstance(source, HealthGroup))
    shown = _shown(every, probe, only, exclude)
    if "verbose" in params:  # Kubernetes' text (a warning shows as `[+]name warn: reason`)
        said = {"pass": "[+]{} ok", "warn": "[+]{} warn: {}", "fail": "[-]{} failed: {}"}
        lines = [said[check.status].format(check.name, check.reason) for check in shown]
        excluded = [n for n in ([only] if only else PROBES[probe]) if n in exclude]
        lines.extend(f"[+]{name} excluded: ok" for name in excluded)
        if unknown := [n for n in exclude if n not in every]:
            listed = ", ".join(repr(n) for n in unknown)
            lines.append(f"warn: some health checks cannot be excluded: no matches for {listed}")
        failed = any(c.status == "fail" for c in shown)
        lines.append(f"{probe} check {'failed' if failed else 'passed'}")
        return _text(503 if failed else 200, "\n".join(lines) + "\n")
    code, document = render_probe(shown, description, members[0].payload, options)
    return _answer(code, HEALTH_CONTENT_TYPE, json.dumps(document, indent=2).encode() + b"\n")


ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], ASGIReceive, ASGISend], Awaitable[None]]


def _answerer(
    registrar: HealthSource | HealthGroup, metrics: RegistrarMetrics | None, options: HealthOptions
) -> Callable[[dict[str, Any]], Answer]:
    """The answer to a WSGI environ, whichever app received it: a health document, or
    prometheus-client's `/metrics` (its WSGI app serves both: it answers at once)."""
    metrics_app = metrics.wsgi_app() if metrics is not None else None

    def answer(environ: dict[str, Any]) -> Answer:
        method = environ.get("REQUEST_METHOD", "GET")
        path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        if (found := answer_health(registrar, method, path, query, options)) is not None:
            return found
        if metrics_app is None:
            return NO_METRICS
        # prometheus-client answers GET only, and HEAD must announce the length of the body it
        # leaves out (a WSGI server would otherwise count the empty body of HEAD and say 0).
        started: list[tuple[str, list[tuple[str, str]]]] = []

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            started.append((status, headers))
            return lambda data: None

        body = b"".join(metrics_app({**environ, "REQUEST_METHOD": "GET"}, capture))
        status, headers = started[-1]
        kept = tuple(h for h in headers if h[0].lower() != "content-length")
        code = int(status.split(" ", 1)[0])
        return Answer(code, (*kept, ("Content-Length", str(len(body)))), body)

    return answer


def health_app(
    registrar: HealthSource | HealthGroup,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = HealthOptions.expose_payload,
    service_id: str | None = HealthOptions.service_id,
) -> WSGIApp:
    """A WSGI app serving `/health`, `/readyz`, `/livez`, one path per check, and `/metrics`
    with `metrics`. Mount it in any WSGI server or under Flask (see docs/operations.md)."""
    answer = _answerer(registrar, metrics, HealthOptions(expose_payload, service_id))

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        found = answer(environ)
        start_response(f"{found.code} {HTTPStatus(found.code).phrase}", list(found.headers))
        return [] if environ.get("REQUEST_METHOD", "GET") == "HEAD" else [found.body]

    return app


def health_asgi_app(
    registrar: HealthSource | HealthGroup,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = HealthOptions.expose_payload,
    service_id: str | None = HealthOptions.service_id,
) -> ASGIApp:
    """The same endpoints as an ASGI app, with no framework: run it under any ASGI server, or
    mount it into FastAPI/Starlette (`app.mount("/registrar", health_asgi_app(reg))`). Reading
    the status never blocks, so it is safe on the event loop."""
    answer = _answerer(registrar, metrics, HealthOptions(expose_payload, service_id))

    async def app(scope: dict[str, Any], receive: ASGIReceive, send: ASGISend) -> None:
        if scope["type"] == "lifespan":  # nothing to set up or tear down: acknowledge
            while (message := await receive())["type"] != "lifespan.shutdown":
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            raise ValueError(f"the health app serves HTTP only, not {scope['type']!r}")
        # Mounted under a prefix, the path still carries it (ASGI): strip it.
        path: str = scope.get("path", "/").removeprefix(scope.get("root_path", "")) or "/"
        method: str = scope.get("method", "GET")
        environ = {
            "HTTP_" + name.decode("latin-1").upper().replace("-", "_"): value.decode("latin-1")
            for name, value in scope.get("headers", [])
        }
        query = scope.get("query_string", b"").decode("latin-1")
        environ.update(REQUEST_METHOD=method, PATH_INFO=path, QUERY_STRING=query)
        found = answer(environ)
        headers = [(k.lower().encode(), v.encode()) for k, v in found.headers]
        await send({"type": "http.response.start", "status": found.code, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else found.body})

    return app


def start_health_server(
    registrar: HealthSource | HealthGroup,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    metrics: RegistrarMetrics | bool | None = None,
    expose_payload: bool = HealthOptions.expose_payload,
) -> HealthServer:
    """Serve `health_app(registrar)` on `host:port` (0: an ephemeral port), bounded under
    probes (`registrar.surfaces._httpserver`). Raises OSError when the port cannot be bound.
    `metrics`: None serves a registry of its own when prometheus-client is installed (a group's
    members on one, labelled by their registry's URL), True insists, False never; a
    `RegistrarMetrics` is served as given (docs/operations.md)."""
    chosen = metrics if isinstance(metrics, RegistrarMetrics) else None
    if metrics is True or (metrics is None and metrics_available()):
        group = isinstance(registrar, HealthGroup)
        for member in registrar.members() if isinstance(registrar, HealthGroup) else [registrar]:
            if hasattr(member, "add_listener"):
                labels = {"registry": member.status().url} if group else None
                registry = chosen.registry if chosen is not None else None
                attached = RegistrarMetrics(registry, labels=labels).attach(member)  # type: ignore[arg-type]
                chosen = chosen or attached
    server = HealthServer(
        health_app(registrar, metrics=chosen, expose_payload=expose_payload), host, port
    )
    logger.info("health endpoints on %s (/livez /readyz /health)", server.url)
    return server
