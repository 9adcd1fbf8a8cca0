"""Prometheus metrics, behind the `registrar[metrics]` extra.

The core never imports prometheus-client: this module is imported only when metrics are asked
for, and `metrics_available()` says whether the extra is installed.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

from ..core.machine import State
from ..core.status import Status

if TYPE_CHECKING:
    from ..core.registrar import Registrar, RequestEvent

__all__ = ["RegistrarMetrics", "metrics_available"]


def metrics_available() -> bool:
    """Whether prometheus-client is installed."""
    return importlib.util.find_spec("prometheus_client") is not None


class RegistrarMetrics:
    """Metrics of one registrar on `registry` (a new `CollectorRegistry` when None):

    - `registrar_state` (Enum): the current state;
    - `registrar_attempts_total{outcome}`: registration requests by verdict;
    - `registrar_checks_total{route}`: route checks by finding;
    - `registrar_reregistrations_total`: routes found missing and registered again;
    - `registrar_last_success_timestamp_seconds`: the last accepted registration;
    - `registrar_request_duration_seconds{kind}`: request latency (register, check).
    """

    def __init__(self, registry: Any = None, namespace: str = "registrar") -> None:
        try:
            # Imported here so that the core never needs the extra.
            import prometheus_client as prom  # noqa: PLC0415
        except ImportError as exc:
            raise ImportError(
                "metrics need prometheus-client: pip install 'registrar[metrics]'"
            ) from exc
        self._prom = prom
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        kw: dict[str, Any] = {"namespace": namespace, "registry": self.registry}
        self.state = prom.Enum("state", "Registration state", states=[s.value for s in State], **kw)
        self.attempts = prom.Counter(
            "attempts", "Registration requests by outcome", ["outcome"], **kw
        )
        self.checks = prom.Counter("checks", "Route checks by finding", ["route"], **kw)
        self.reregistrations = prom.Counter(
            "reregistrations", "Routes found missing and registered again", **kw
        )
        self.last_success = prom.Gauge(
            "last_success_timestamp_seconds", "When the last registration was accepted", **kw
        )
        self.duration = prom.Histogram(
            "request_duration_seconds",
            "Request latency",
            ["kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            **kw,
        )
        for outcome in ("accepted", "retry", "fatal"):
            self.attempts.labels(outcome)
        self.state.state(State.UNREGISTERED.value)

    def attach(self, registrar: Registrar) -> RegistrarMetrics:
        """Follow `registrar` from now on (its current status included)."""
        self._on_status(registrar.status())
        registrar.add_listener(self._on_transition)
        registrar.add_request_listener(self._on_request)
        return self

    def _on_status(self, status: Status) -> None:
        self.state.state(status.state.value)
        if status.last_success_at is not None:
            self.last_success.set(status.last_success_at)

    def _on_transition(self, old: State, new: State, status: Status) -> None:
        self._on_status(status)
        if old is State.REGISTERED and new is State.REGISTERING:
            self.reregistrations.inc()

    def _on_request(self, event: RequestEvent) -> None:
        if event.kind == "register":
            self.attempts.labels(event.result).inc()
        else:
            self.checks.labels(event.result).inc()
        self.duration.labels(event.kind).observe(event.duration)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition of the registry and its content type."""
        return self._prom.generate_latest(self.registry), self._prom.CONTENT_TYPE_LATEST
