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

import logging
from dataclasses import dataclass

from ..httpserver import ProbeServer
from ..metrics import RegistrarMetrics, metrics_available
from .apps import health_app, health_asgi_app
from .checks import (
    LIVENESS_CHECKS,
    READINESS_CHECKS,
    Check,
    camel_case,
    group_checks,
    health_checks,
    is_live,
)
from .document import (
    HEALTH_CONTENT_TYPE,
    Answer,
    HealthGroup,
    HealthOptions,
    HealthSource,
    ProbeQuery,
    answer_health,
    render_group_health,
    render_health,
)

__all__ = [
    "HEALTH_CONTENT_TYPE",
    "LIVENESS_CHECKS",
    "READINESS_CHECKS",
    "Answer",
    "Check",
    "HealthGroup",
    "HealthOptions",
    "HealthServer",
    "HealthSource",
    "ProbeQuery",
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
    expose_payload: bool = HealthOptions.expose_payload,
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
