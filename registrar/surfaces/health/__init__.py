"""Health for people and machines: `application/health+json`, a WSGI app, an ASGI app, a small
server (docs/operations.md).

Readiness depends on registration; liveness does not depend on the bootstrap server being
reachable, or a registry outage would restart the whole fleet.
"""

from __future__ import annotations

import logging

from ..httpserver import ProbeServer
from ..metrics import RegistrarMetrics, metrics_available
from .apps import health_app, health_asgi_app
from .checks import camel_case
from .document import (
    HEALTH_CONTENT_TYPE,
    HealthGroup,
    HealthOptions,
    HealthSource,
    render_group_health,
    render_health,
)

__all__ = [
    "HEALTH_CONTENT_TYPE",
    "HealthGroup",
    "HealthServer",
    "HealthSource",
    "camel_case",
    "health_app",
    "health_asgi_app",
    "render_group_health",
    "render_health",
    "start_health_server",
]

logger = logging.getLogger(__name__)

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
    probes (`registrar.surfaces.httpserver`). Raises OSError when the port cannot be bound.

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
