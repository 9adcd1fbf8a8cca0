"""Registrars assembled for a protocol that needs more than a URL: the one place that imports
both the engine (`registrar.core`) and a protocol (`registrar.protocols`), so that neither
imports the other. A protocol is chosen where the registrar is configured."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .core.errors import ConfigError
from .core.registrar import Registrar
from .core.transport import Timeout
from .protocols.etcd import (
    DEFAULT_KEEPALIVE_FRACTION,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
    EtcdTransport,
)

__all__ = ["etcd_registrar"]


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
