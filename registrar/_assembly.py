"""The front doors of etcd and smg: the one place importing both `registrar.core` and
`registrar.protocols` (docs/architecture.md, "Settings and options")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .core import _rules as rules
from .core._group import RegistrarGroup
from .core._registrar import Registrar
from .core._settings import split_options
from .protocols._smg.settings import SmgSettings
from .protocols._smg.spec import worker_spec
from .protocols._smg.transport import DEFAULT_WATCH_INTERVAL, SmgTransport


def etcd_registrar(
    endpoints: str | Sequence[str], key: str, payload: Mapping[str, Any], **options: Any
) -> Registrar:
    """A `Registrar` keeping `payload` under `key` in etcd (not started): `protocol="etcd"`,
    `options` the fields of `EtcdSettings` and `Registrar`'s (docs/etcd.md)."""
    return Registrar(endpoints, payload, protocol="etcd", key=key, **options)


def smg_registrar(
    gateway: str, worker_url: str, worker_type: str = "regular", **options: Any
) -> Registrar:
    """A `Registrar` keeping the worker at `worker_url` listed by the smg gateway at `gateway`
    (not started). `options` are the fields of `SmgSettings`, `spec` (more fields of the
    gateway's WorkerSpec) and `Registrar`'s (docs/gateway.md)."""
    return smg_registrars((gateway,), worker_url, worker_type, **options).members()[0]


def smg_registrars(
    gateways: Sequence[str], worker_url: str, worker_type: str = "regular", **options: Any
) -> RegistrarGroup:
    """One `smg_registrar` per gateway (an HA pair, a mesh), each with its own state, as one
    group (started and stopped together; health shows each)."""
    fields = split_options(options, SmgSettings)
    settings = SmgSettings(tuple(gateways), worker_url, worker_type, **fields)
    spec = options.pop("spec", None)
    options.setdefault("watch_interval", DEFAULT_WATCH_INTERVAL)
    payload = worker_spec(
        rules.applied("worker_url", settings.worker_url, rules.url),
        settings.worker_type,
        settings.bootstrap_port,
        **dict(spec or {}),
    )
    return RegistrarGroup(
        (
            Registrar(
                payload=payload,
                transport=SmgTransport(settings, gateway, clock=options.get("clock")),
                **options,
            )
            for gateway in settings.gateways
        ),
        stop_timeout=settings.stop_timeout,
    )
