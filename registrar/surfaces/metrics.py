"""Prometheus metrics, behind the `sglang-registrar[metrics]` extra (the names:
docs/operations.md), prometheus-client imported only when metrics are asked for. Registrars
sharing a registry (SGLang runs several ranks per host) share one set of metric families, told
apart by constant `labels`: prometheus-client allows one collector per name and registry."""

from __future__ import annotations

import functools
import importlib.util
import re
import threading
import weakref
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import Any

from .._version import __version__
from ..core._board import RequestEvent, State, Status
from ..core._diagnosis import Code
from ..core._errors import ConfigError
from ..core._registrar import Registrar

__all__ = ["RegistrarMetrics", "metrics_available"]

_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_RESERVED = frozenset({"result", "kind", "version", "code"})


def metrics_available() -> bool:
    """Whether prometheus-client is installed."""
    return importlib.util.find_spec("prometheus_client") is not None


def _prometheus() -> Any:
    try:
        import prometheus_client  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(
            "metrics need prometheus-client: pip install 'sglang-registrar[metrics]'"
        ) from exc
    return prometheus_client


class _Families:
    """The metric families of one (registry, namespace), shared by every registrar on it."""

    def __init__(self, prom: Any, registry: Any, namespace: str, labels: tuple[str, ...]) -> None:
        self.labels = labels
        # Weak: the registrar's listeners keep its metrics alive, and nothing else must.
        self.members: weakref.WeakValueDictionary[tuple[str, ...], RegistrarMetrics] = (
            weakref.WeakValueDictionary()
        )
        kw: dict[str, Any] = {"namespace": namespace, "registry": registry}
        names = list(labels)
        prom.Info("build", "The registrar library's version", **kw).info({"version": __version__})
        self.state = prom.Enum(
            "state", "Registration state", names, states=[s.value for s in State], **kw
        )
        self.attempts = prom.Counter(
            "attempts", "Registration requests by result", [*names, "result"], **kw
        )
        self.checks = prom.Counter(
            "checks", "Route checks by result (what the check found)", [*names, "result"], **kw
        )
        self.reregistrations = prom.Counter(
            "reregistrations", "Routes found missing and registered again", names, **kw
        )
        gauge = functools.partial(prom.Gauge, labelnames=names, **kw)
        self.server_reachable = gauge(
            "server_reachable", "1 when the bootstrap server answered the last request, 0 otherwise"
        )
        self.last_success = gauge(
            "last_success_timestamp_seconds", "When the last registration was accepted"
        )
        self.next_attempt = gauge(
            "next_attempt_timestamp_seconds",
            "When the next registration attempt is due (0: none scheduled)",
        )
        self.diagnosis = gauge(
            "diagnosis",
            "1 for the diagnosis stated now (a wrong port, host, scheme), by code; 0 otherwise",
            labelnames=[*names, "code"],
        )
        self.duration = prom.Histogram(
            "request_duration_seconds",
            "Request latency by kind (register, check)",
            [*names, "kind"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            **kw,
        )


def _diagnosed(code: str) -> Callable[[Status], bool]:
    return lambda status: status.diagnosis is not None and status.diagnosis.code == code


def _reader(
    metrics: weakref.ReferenceType[RegistrarMetrics], read: Callable[[Status], Any]
) -> Callable[[], float]:
    """A gauge function reading the followed registrar's status at scrape time, so it is always
    current: 0 without one, and for None (no answer yet, none scheduled)."""

    def value() -> float:
        owner = metrics()
        status = owner.current_status() if owner is not None else None
        return float(read(status) or 0.0) if status is not None else 0.0

    return value


_FAMILIES: weakref.WeakKeyDictionary[Any, dict[str, _Families]] = weakref.WeakKeyDictionary()
_FAMILIES_LOCK = threading.Lock()


class RegistrarMetrics:
    """Metrics of one registrar on `registry` (a new `CollectorRegistry` when None), its series
    told apart from other registrars' on the same registry by the constant `labels`."""

    def __init__(
        self,
        registry: Any = None,
        namespace: str = "registrar",
        *,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self._prom = prom = _prometheus()
        self.registry = registry if registry is not None else prom.CollectorRegistry()
        constant = dict(labels or {})
        for name, value in constant.items():
            if not isinstance(name, str) or not _LABEL.match(name) or name.startswith("__"):
                raise ConfigError(f"metrics label name {name!r} is not a Prometheus label name")
            if name in _RESERVED or name == f"{namespace}_state":
                raise ConfigError(f"metrics label name {name!r} is used by registrar; pick another")
            if not isinstance(value, str):
                raise ConfigError(f"metrics label {name}={value!r} must be a string")
        self.labels: dict[str, str] = constant
        self._registrar: weakref.ReferenceType[Registrar] | None = None
        names = tuple(sorted(constant))
        self._values = tuple(constant[n] for n in names)
        with _FAMILIES_LOCK:
            per_registry = _FAMILIES.setdefault(self.registry, {})
            if namespace not in per_registry:
                per_registry[namespace] = _Families(prom, self.registry, namespace, names)
            families = per_registry[namespace]
            if families.labels != names:
                raise ConfigError(
                    f"every registrar on this registry must use the labels {list(families.labels)}"
                    f" (these metrics already use them), got {list(names)}"
                )
            if (holder := families.members.get(self._values)) is not None and holder.in_use():
                shown = ", ".join(f"{k}={v!r}" for k, v in constant.items()) or "no labels"
                raise ConfigError(
                    f"another registrar's metrics on this registry already use {shown}; "
                    "give each registrar distinct labels, e.g. labels={'rank': '0'}"
                )
            families.members[self._values] = self
        self._families = families
        for result in ("accepted", "retry", "fatal"):
            families.attempts.labels(*self._values, result)
        self._own(families.reregistrations)
        self._own(families.state).state(State.UNREGISTERED.value)
        # Held weakly: else the registry would keep these metrics (and their labels) for ever.
        me = weakref.ref(self)
        self._own(families.server_reachable).set_function(
            _reader(me, attrgetter("server_reachable"))
        )
        self._own(families.last_success).set_function(_reader(me, attrgetter("last_success_at")))
        self._own(families.next_attempt).set_function(_reader(me, attrgetter("next_attempt_at")))
        for code in Code:
            child = families.diagnosis.labels(*self._values, code.value)
            child.set_function(_reader(me, _diagnosed(code.value)))

    def in_use(self) -> bool:
        """Whether these labels still belong to a live registrar (or one not attached yet)."""
        return self._registrar is None or self._registrar() is not None

    def _own(self, metric: Any) -> Any:
        return metric.labels(*self._values) if self._values else metric

    def current_status(self) -> Status | None:
        """The followed registrar's status, or None (not attached, or gone)."""
        registrar = self._registrar() if self._registrar is not None else None
        return registrar.status() if registrar is not None else None

    def attach(self, registrar: Registrar) -> RegistrarMetrics:
        """Follow `registrar` from now on (its current status included), never keeping it alive."""
        self._registrar = weakref.ref(registrar)
        self._own(self._families.state).state(registrar.status().state.value)
        registrar.add_listener(self._on_transition)
        registrar.add_request_listener(self._on_request)
        return self

    def _on_transition(self, old: State, new: State, status: Status) -> None:
        self._own(self._families.state).state(new.value)
        if old is State.REGISTERED and new is State.REGISTERING:
            self._own(self._families.reregistrations).inc()

    def _on_request(self, event: RequestEvent) -> None:
        f = self._families
        counter = f.attempts if event.kind == "register" else f.checks
        counter.labels(*self._values, event.result).inc()
        f.duration.labels(*self._values, event.kind).observe(event.duration)

    def wsgi_app(self) -> Any:
        """prometheus-client's WSGI exposition of the registry."""
        return self._prom.make_wsgi_app(self.registry)
