"""Health for people and machines: `application/health+json`, a WSGI app and an ASGI app with
no framework (mount either in any server, under Flask, or into FastAPI/Starlette), a small
server (docs/operations.md).

Readiness depends on registration; liveness does not depend on the bootstrap server being
reachable, or a registry outage would restart the whole fleet.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import Any

from .._httpserver import ProbeServer, StartResponse, WSGIApp
from ..metrics import RegistrarMetrics, metrics_available
from ._document import (
    HEALTH_CONTENT_TYPE,
    Answer,
    HealthGroup,
    HealthOptions,
    HealthSource,
    answer_health,
    camel_case,
    no_metrics,
    render_health,
)

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

ASGIReceive = Callable[[], Awaitable[dict[str, Any]]]
ASGISend = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], ASGIReceive, ASGISend], Awaitable[None]]


def health_app(
    registrar: HealthSource | HealthGroup,
    *,
    metrics: RegistrarMetrics | None = None,
    expose_payload: bool = HealthOptions.expose_payload,
    service_id: str | None = HealthOptions.service_id,
) -> WSGIApp:
    """A WSGI app serving `/health`, `/readyz`, `/livez`, one path per check, and `/metrics`
    with `metrics`. Mount it in any WSGI server or under Flask (see docs/operations.md)."""
    options = HealthOptions(expose_payload, service_id)
    metrics_app = metrics.wsgi_app() if metrics is not None else None

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        answer = answer_health(
            registrar,
            method,
            environ.get("PATH_INFO", ""),
            environ.get("QUERY_STRING", ""),
            options,
        )
        if answer is None:
            answer = no_metrics() if metrics_app is None else _wsgi_metrics(metrics_app, environ)
        start_response(f"{answer.code} {HTTPStatus(answer.code).phrase}", list(answer.headers))
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
    options = HealthOptions(expose_payload, service_id)
    metrics_app = metrics.wsgi_app() if metrics is not None else None

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
        answer = answer_health(registrar, method, path, query, options)
        if answer is None:
            # prometheus-client's exposition answers at once: the WSGI one serves both apps.
            environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "QUERY_STRING": query}
            for name, value in scope.get("headers", []):
                key = "HTTP_" + name.decode("latin-1").upper().replace("-", "_")
                environ[key] = value.decode("latin-1")
            answer = no_metrics() if metrics_app is None else _wsgi_metrics(metrics_app, environ)
        await send(
            {
                "type": "http.response.start",
                "status": answer.code,
                "headers": [(k.lower().encode(), v.encode()) for k, v in answer.headers],
            }
        )
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else answer.body})

    return app


async def _lifespan(receive: ASGIReceive, send: ASGISend) -> None:
    """Nothing to set up or tear down: acknowledge the server's lifespan events."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


HealthServer = ProbeServer
"""A running health server: `port` is the bound port, `url` its address; `stop()` ends it."""


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

    `metrics=None` serves `/metrics` when prometheus-client is installed (a new registry fed by
    this registrar); True insists (ImportError naming the extra when it is missing); False
    never does; a `RegistrarMetrics` is served as given."""
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
    server = ProbeServer(app, host, port)
    logger.info("health endpoints on http://%s:%d (/livez /readyz /health)", host, server.port)
    return server
