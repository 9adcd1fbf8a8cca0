"""Health for people and machines: `application/health+json`, a WSGI app, a small server.

Readiness depends on registration; liveness does not depend on the bootstrap server being
reachable, or a registry outage would restart the whole fleet. Liveness fails only when the
registrar has given up for good or its thread died.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Protocol
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from .. import __version__
from ..core.machine import State
from ..core.status import Status, iso_utc
from .metrics import RegistrarMetrics, metrics_available

__all__ = [
    "HEALTH_CONTENT_TYPE",
    "HealthServer",
    "HealthSource",
    "health_app",
    "is_live",
    "render_health",
    "start_health_server",
]

logger = logging.getLogger(__name__)

HEALTH_CONTENT_TYPE = "application/health+json"

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_STATUS_OF = {
    State.REGISTERED: "pass",
    State.UNREGISTERED: "warn",
    State.REGISTERING: "warn",
    State.FAILED: "fail",
    State.STOPPED: "fail",
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


def render_health(
    status: Status, *, payload: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """The HTTP status and the health+json document for `status`: pass when registered, warn
    while registering, fail when failed or stopped (fail answers 503)."""
    verdict = _STATUS_OF[status.state]
    check: dict[str, Any] = {
        "componentType": "component",
        "observedValue": status.state.value,
        "status": verdict,
        "time": iso_utc(status.since),
        "attempt": status.attempt,
        "attemptsTotal": status.attempts_total,
        "registrations": status.registrations,
        "reregistrations": status.reregistrations,
        "lastSuccess": iso_utc(status.last_success_at),
        "nextAttempt": iso_utc(status.next_attempt_at),
        "retrying": status.retrying,
        "serverReachable": status.server_reachable,
        "lastCheck": iso_utc(status.last_check_at),
        "route": status.route,
        "url": status.url,
    }
    if status.last_error:
        check["output"] = status.last_error
    document: dict[str, Any] = {
        "status": verdict,
        "releaseId": __version__,
        "serviceId": "registrar",
        "description": "registration with the bootstrap server",
        "checks": {"registration:state": [check]},
    }
    if status.last_error and verdict != "pass":
        document["output"] = status.last_error
    if payload is not None:
        document["payload"] = payload
    return (503 if verdict == "fail" else 200), document


def is_live(status: Status, thread_died: bool) -> bool:
    """False only when nothing will ever change by itself: the registrar gave up for good, or
    its thread died. A bootstrap server that is merely down never fails liveness."""
    if thread_died:
        return False
    return not (status.state is State.FAILED and not status.retrying)


def health_app(
    registrar: HealthSource,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = False,
) -> WSGIApp:
    """A WSGI app serving `GET /health`, `/readyz`, `/livez` (and `/metrics` with `metrics`).
    Mount it in any WSGI server, or under Flask/FastAPI (see docs/operations.md)."""

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = environ.get("PATH_INFO", "") or "/"
        if path not in ("/health", "/readyz", "/livez", "/metrics"):
            return _reply(start_response, method, 404, {"status": "fail", "output": "not found"})
        if method not in ("GET", "HEAD"):
            return _reply(
                start_response,
                method,
                405,
                {"status": "fail", "output": "use GET"},
                extra=[("Allow", "GET, HEAD")],
            )
        if path == "/metrics":
            if metrics is None:
                return _reply(
                    start_response,
                    method,
                    404,
                    {
                        "status": "fail",
                        "output": "metrics need the extra: pip install 'registrar[metrics]'",
                    },
                )
            body, content_type = metrics.exposition()
            return _send(start_response, method, 200, body, content_type)
        status = registrar.status()
        payload = registrar.payload if expose_payload else None
        code, document = render_health(status, payload=payload)
        if path == "/readyz":
            code = 200 if status.state is State.REGISTERED else 503
        elif path == "/livez":
            live = is_live(status, registrar.thread_died)
            code = 200 if live else 503
            document = {
                "status": "pass" if live else "fail",
                "output": None if live else (status.last_error or "registrar thread died"),
                "checks": document["checks"],
            }
            if live:
                del document["output"]
        return _reply(start_response, method, code, document)

    return app


def _reply(
    start_response: StartResponse,
    method: str,
    code: int,
    document: dict[str, Any],
    extra: list[tuple[str, str]] | None = None,
) -> Iterable[bytes]:
    body = json.dumps(document, indent=2).encode() + b"\n"
    return _send(start_response, method, code, body, HEALTH_CONTENT_TYPE, extra)


def _send(
    start_response: StartResponse,
    method: str,
    code: int,
    body: bytes,
    content_type: str,
    extra: list[tuple[str, str]] | None = None,
) -> Iterable[bytes]:
    headers = [
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        *(extra or []),
    ]
    start_response(_REASONS.get(code, f"{code} Status"), headers)
    return [] if method == "HEAD" else [body]


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True


class _ThreadingWSGIServer6(_ThreadingWSGIServer):
    address_family = socket.AF_INET6


@dataclass
class HealthServer:
    """A running health server: `port` is the bound port; `stop()` shuts it down."""

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def __enter__(self) -> HealthServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_health_server(
    registrar: HealthSource,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    metrics: RegistrarMetrics | bool | None = None,
    expose_payload: bool = False,
) -> HealthServer:
    """Serve `health_app(registrar)` on `host:port` (0: an ephemeral port) from daemon threads.

    `metrics=None` serves `/metrics` when prometheus-client is installed (a new registry fed by
    this registrar); True insists (ImportError naming the extra when it is missing); False
    never does; a `RegistrarMetrics` is served as given. Raises OSError when the port cannot be
    bound."""
    chosen: RegistrarMetrics | None = None
    wanted = metrics is True or (metrics is None and metrics_available())
    if isinstance(metrics, RegistrarMetrics):
        chosen = metrics
    elif wanted and hasattr(registrar, "add_listener"):
        chosen = RegistrarMetrics().attach(registrar)  # type: ignore[arg-type]
    app = health_app(registrar, metrics=chosen, expose_payload=expose_payload)
    server_class = _ThreadingWSGIServer6 if ":" in host else _ThreadingWSGIServer
    server = make_server(host, port, app, server_class=server_class, handler_class=_QuietHandler)
    thread = threading.Thread(
        target=server.serve_forever,
        kwargs={"poll_interval": 0.1},
        name="registrar-health",
        daemon=True,
    )
    thread.start()
    bound = server.server_address[1]
    logger.info("health endpoints on http://%s:%d (/livez /readyz /health)", host, bound)
    return HealthServer(host, bound, server, thread)
