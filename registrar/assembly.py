"""Registrars assembled for a protocol that needs more than a URL: the one place that imports
both the engine (`registrar.core`) and a protocol (`registrar.protocols`), so that neither
imports the other. A protocol is chosen where the registrar is configured.

Each front door (`etcd_registrar`, `smg_registrar`, `smg_registrars`) keeps the keyword options
users know and turns them into the protocol's settings value (`EtcdSettings`, `SmgSettings`);
the `*_from` functions take that value as it is."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core.errors import ConfigError
from .core.group import RegistrarGroup
from .core.registrar import Registrar
from .core.transport import Timeout
from .protocols.etcd import DEFAULT_KEEPALIVE_FRACTION, DEFAULT_TIMEOUT, DEFAULT_TTL, EtcdTransport
from .protocols.etcd.settings import EtcdSettings
from .protocols.smg import (
    DEFAULT_CONFIRM_TIMEOUT,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_GRACE,
    DEFAULT_READY_INTERVAL,
    DEFAULT_WATCH_INTERVAL,
    SmgTransport,
    worker_spec,
)
from .protocols.smg.settings import SmgSettings

__all__ = [
    "etcd_registrar",
    "etcd_registrar_from",
    "smg_registrar",
    "smg_registrars",
    "smg_registrars_from",
]


def etcd_registrar(  # noqa: PLR0913 - a front door: the etcd options as keywords, as documented
    endpoints: str | Sequence[str],
    key: str,
    payload: Mapping[str, Any],
    *,
    ttl: float = DEFAULT_TTL,
    keepalive_fraction: float = DEFAULT_KEEPALIVE_FRACTION,
    username: str | None = None,
    password: str | None = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
    verify: bool = True,
    ca_bundle: str | None = None,
    cert: tuple[str, str] | None = None,
    watch_interval: float | None = None,
    **options: Any,
) -> Registrar:
    """A `Registrar` keeping `payload` under `key` in etcd (not started).

    The watch interval derives from the TTL (`watch_interval_for`) so that every lease renewal
    is on time; a longer one is refused. Other keyword arguments go to `Registrar` (backoff,
    max_attempts, on_failure, clock, rng, ...)."""
    settings = EtcdSettings(
        endpoints,
        key,
        ttl=ttl,
        keepalive_fraction=keepalive_fraction,
        username=username,
        password=password,
        timeout=timeout,
        verify=verify,
        ca_bundle=ca_bundle,
        cert=cert,
    )
    return etcd_registrar_from(settings, payload, watch_interval=watch_interval, **options)


def etcd_registrar_from(
    settings: EtcdSettings, payload: Mapping[str, Any], **options: Any
) -> Registrar:
    """`etcd_registrar` from its settings value; `options` go to `Registrar` (`watch_interval`
    None or absent: derived from the TTL)."""
    transport = EtcdTransport.from_settings(settings)
    longest = transport.watch_interval
    watch_interval = options.pop("watch_interval", None)
    if watch_interval is None:
        watch_interval = longest
    elif (
        isinstance(watch_interval, bool)
        or not isinstance(watch_interval, int | float)
        or not 0 < watch_interval <= longest
    ):
        transport.close()
        raise ConfigError(
            f"watch_interval must be within (0, {longest:g}] s for ttl={transport.ttl} and "
            f"keepalive_fraction={settings.keepalive_fraction:g}: each check renews the lease, "
            f"got {watch_interval!r}"
        )
    return Registrar(payload=payload, transport=transport, watch_interval=watch_interval, **options)


def smg_registrar(  # noqa: PLR0913 - a front door: the gateway options as keywords, as documented
    gateway: str,
    worker_url: str,
    worker_type: str = "regular",
    *,
    bootstrap_port: int | None = None,
    ready: str | Callable[[], bool] | None = None,
    grace: float = DEFAULT_GRACE,
    ready_interval: float = DEFAULT_READY_INTERVAL,
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
    key: str | None = None,
    key_file: str | None = None,
    timeout: Timeout = 5.0,
    verify: bool = True,
    ca_bundle: str | None = None,
    watch_interval: float | None = DEFAULT_WATCH_INTERVAL,
    spec: Mapping[str, Any] | None = None,
    **options: Any,
) -> Registrar:
    """A `Registrar` keeping the worker at `worker_url` listed by the smg gateway at `gateway`
    (not started). The control-plane key comes from `key`, else `key_file` (read before each
    request), else `$REGISTRAR_GATEWAY_KEY`. `spec` adds fields of the gateway's WorkerSpec.
    Other keyword arguments go to `Registrar`. `stop()` drains (see `SmgTransport.close`):
    give it `drain_timeout` and a request deadline (`Registrar.stop(timeout=...)`)."""
    settings = SmgSettings(
        (gateway,),
        worker_url,
        worker_type,
        bootstrap_port=bootstrap_port,
        ready=ready,
        grace=grace,
        ready_interval=ready_interval,
        confirm_timeout=confirm_timeout,
        drain_timeout=drain_timeout,
        key=key,
        key_file=key_file,
        timeout=timeout,
        verify=verify,
        ca_bundle=ca_bundle,
    )
    return _smg_registrar(settings, settings.gateways[0], spec, watch_interval, options)


def _smg_registrar(
    settings: SmgSettings,
    gateway: str,
    spec: Mapping[str, Any] | None,
    watch_interval: float | None,
    options: dict[str, Any],
) -> Registrar:
    payload = worker_spec(
        settings.worker_url, settings.worker_type, settings.bootstrap_port, **dict(spec or {})
    )
    transport = SmgTransport(settings, gateway, clock=options.get("clock"))
    return Registrar(payload=payload, transport=transport, watch_interval=watch_interval, **options)


def smg_registrars(
    gateways: Sequence[str], worker_url: str, worker_type: str = "regular", **options: Any
) -> RegistrarGroup:
    """One `smg_registrar` per gateway (an HA pair, a mesh), each with its own state, as one
    group (started and stopped together; health shows each)."""
    fields = {k: options.pop(k) for k in _SMG_FIELDS if k in options}
    settings = SmgSettings(tuple(gateways), worker_url, worker_type, **fields)
    return smg_registrars_from(settings, **options)


_SMG_FIELDS = (
    "bootstrap_port",
    "ready",
    "grace",
    "ready_interval",
    "confirm_timeout",
    "drain_timeout",
    "key",
    "key_file",
    "timeout",
    "verify",
    "ca_bundle",
)
"""The `smg_registrar` keywords that are fields of `SmgSettings`."""


def smg_registrars_from(settings: SmgSettings, **options: Any) -> RegistrarGroup:
    """`smg_registrars` from its settings value: one registrar per gateway it names; `options`
    go to `Registrar` (and `spec`, `watch_interval` as for `smg_registrar`)."""
    spec = options.pop("spec", None)
    watch_interval = options.pop("watch_interval", DEFAULT_WATCH_INTERVAL)
    return RegistrarGroup(
        (
            _smg_registrar(settings, gateway, spec, watch_interval, options)
            for gateway in settings.gateways
        ),
        stop_timeout=settings.stop_timeout,
    )
