"""Health for people and machines: `application/health+json`, a WSGI app and an ASGI app with
no framework, a small server (docs/operations.md). Readiness depends on registration; liveness
does not depend on the bootstrap server being reachable, or a registry outage would restart the
whole fleet."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from http import HTTPStatus
from typing import Any

from .._httpserver import HealthServer, StartResponse, WSGIApp
from ..metrics import RegistrarMetrics, metrics_available
from ._document import (
    HEALTH_CONTENT_TYPE,
    NO_METRICS,
    Answer,
    HealthGroup,
    HealthOptions,
    HealthSource,
    answer_health,
    camel_case,
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


def _answerer(
    registrar: HealthSource | HealthGroup, metrics: RegistrarMetrics | None, options: HealthOptions
) -> Callable[[dict[str, Any]], Answer]:
    """The answer to a WSGI environ, whichever app received it: a health document, or
    prometheus-client's `/metrics` (its WSGI app serves both: it answers at once)."""
    metrics_app = metrics.wsgi_app() if metrics is not None else None

    def answer(environ: dict[str, Any]) -> Answer:
        method = environ.get("REQUEST_METHOD", "GET")
        path, query = environ.get("PATH_INFO", ""), environ.get("QUERY_STRING", "")
        found = answer_health(registrar, method, path, query, options)
        if found is not None:
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
        members = registrar.members() if isinstance(registrar, HealthGroup) else [registrar]
        for member in members:
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
