"""Registrars assembled for a protocol that needs more than a URL: the one place that imports
both the engine (`registrar.core`) and a protocol (`registrar.protocols`), so that neither
imports the other. A protocol is chosen where the registrar is configured."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .core.errors import ConfigError
from .core.group import RegistrarGroup
from .core.registrar import Registrar
from .core.transport import Timeout, Token, file_token, validate_url
from .protocols.etcd import (
    DEFAULT_KEEPALIVE_FRACTION,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    EtcdTransport,
)
from .protocols.smg import (
    DEFAULT_CONFIRM_TIMEOUT,
    DEFAULT_DRAIN_TIMEOUT,
    DEFAULT_GRACE,
    DEFAULT_READY_INTERVAL,
    DEFAULT_WATCH_INTERVAL,
    KEY_ENV,
    SmgTransport,
    readiness,
    worker_spec,
)

__all__ = ["etcd_registrar", "smg_registrar", "smg_registrars"]


def etcd_registrar(
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
    if ca_bundle is not None and not os.path.isfile(ca_bundle):
        raise ConfigError(f"ca_bundle {ca_bundle!r} is not a readable file")
    transport = EtcdTransport(
        endpoints,
        key,
        ttl=ttl,
        keepalive_fraction=keepalive_fraction,
        username=username,
        password=password,
        timeout=timeout,
        verify=ca_bundle if ca_bundle is not None else bool(verify),
        cert=cert,
    )
    longest = transport.watch_interval
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
            f"keepalive_fraction={keepalive_fraction:g}: each check renews the lease, got "
            f"{watch_interval!r}"
        )
    first = transport.endpoints[0]  # only checked: the transport is given
    return Registrar(first, payload, transport=transport, watch_interval=watch_interval, **options)


def smg_registrar(
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
    payload = worker_spec(worker_url, worker_type, bootstrap_port, **dict(spec or {}))
    token: Token | None
    if key is not None and key_file is not None:
        raise ConfigError("give the gateway key or the gateway key file, not both")
    if key_file is not None:
        token, source = file_token(key_file, "the gateway key file"), f"the key file {key_file}"
    elif key:
        token, source = key, "the gateway key"
    else:
        token, source = os.environ.get(KEY_ENV) or None, f"${KEY_ENV}"
    transport = SmgTransport(
        gateway,
        token=token,
        token_source=source,
        timeout=timeout,
        verify=ca_bundle if ca_bundle is not None else bool(verify),
        ready=readiness(ready),
        grace=grace,
        ready_interval=ready_interval,
        confirm_timeout=confirm_timeout,
        drain_timeout=drain_timeout,
        clock=options.get("clock"),
    )
    return Registrar(
        gateway, payload, transport=transport, watch_interval=watch_interval, **options
    )


def smg_registrars(
    gateways: Sequence[str], worker_url: str, worker_type: str = "regular", **options: Any
) -> RegistrarGroup:
    """One `smg_registrar` per gateway (an HA pair, a mesh), each with its own state, as one
    group (started and stopped together; health shows each)."""
    urls = [validate_url(g, "gateway url") for g in gateways]
    if not urls:
        raise ConfigError("name at least one gateway URL")
    if len(set(urls)) != len(urls):
        raise ConfigError("a gateway URL is given twice")
    drain = float(options.get("drain_timeout", DEFAULT_DRAIN_TIMEOUT))
    timeout = options.get("timeout", 5.0)
    deadline = float(sum(timeout) if isinstance(timeout, tuple) else timeout)
    return RegistrarGroup(
        (smg_registrar(url, worker_url, worker_type, **options) for url in urls),
        # The drain's DELETE and last look, each within a request deadline, and the wait.
        stop_timeout=drain + 2 * deadline + 1.0,
    )
