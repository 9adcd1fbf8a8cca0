"""The smg gateway registration's settings: one frozen value, validated once when it is made,
from which one `SmgTransport` per gateway is built. Every rule of the gateway options is here,
and only here."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from ...core import rules
from ...core.errors import ConfigError
from ...core.transport import Timeout, Token, deadline_seconds, file_token
from . import spec

KEY_ENV = "REGISTRAR_GATEWAY_KEY"
"""The variable holding the gateway's control-plane key when no key file is given."""
DEFAULT_CONFIRM_TIMEOUT = 30.0
"""Seconds one attempt waits for the gateway to list the worker ready after its POST (a stand-in
worker is listed in about 0.1 s; a worker whose /health fails is dropped within about 2 s)."""
DEFAULT_DRAIN_TIMEOUT = 15.0
"""Seconds `close` waits for the gateway to stop listing the worker after its DELETE (the
gateway's own settle time is 5 s by default)."""
DEFAULT_GRACE = 10.0
"""Seconds the served process may be not ready before the worker is withdrawn."""
DEFAULT_READY_INTERVAL = 1.0
"""Seconds between readiness checks of the served process."""


def _ready(value: object) -> str | Callable[[], bool] | None:
    if value is None or callable(value):
        return value
    return rules.url(value)


def _worker_url(value: object) -> str | None:
    return None if value is None else rules.url(value)


def _seconds(value: object) -> float:
    kept = rules.seconds(value)
    if kept >= 1e9:
        raise rules.Invalid("must be a positive number of seconds")
    return kept


@dataclass(frozen=True)
class SmgSettings:
    """The worker kept listed by one or more smg gateways: which worker, when it may be offered
    (`ready`, `grace`), how long to wait for the gateway (`confirm_timeout`, `drain_timeout`),
    the control-plane key (`key`, else `key_file` read before each request, else
    `$REGISTRAR_GATEWAY_KEY`), and how to reach the gateways (deadline, TLS)."""

    gateways: str | Sequence[str]
    worker_url: str | None = None
    """None: the payload is the worker's spec (`protocol="smg"`)."""
    worker_type: str = "regular"
    bootstrap_port: int | None = None
    ready: str | Callable[[], bool] | None = None
    grace: float = DEFAULT_GRACE
    ready_interval: float = DEFAULT_READY_INTERVAL
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT
    drain_timeout: float = DEFAULT_DRAIN_TIMEOUT
    key: Token | None = None
    key_file: str | None = None
    timeout: Timeout = 5.0
    verify: bool | str = True

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "gateways": rules.urls("gateway", "http://127.0.0.1:30000"),
        "worker_url": _worker_url,
        "worker_type": spec.worker_type,
        "bootstrap_port": rules.port_or_none,
        "ready": _ready,
        "grace": _seconds,
        "ready_interval": _seconds,
        "confirm_timeout": _seconds,
        "drain_timeout": _seconds,
        "timeout": rules.timeout,
        "verify": rules.tls,
    }

    def __post_init__(self) -> None:
        rules.check_fields(self, self.RULES)
        if self.key is not None and self.key_file is not None:
            raise ConfigError("give the gateway key or the gateway key file, not both")
        self.token()  # a key file that cannot be read now is an error now

    @property
    def stop_timeout(self) -> float:
        """How long stopping may take: the drain's DELETE and last look, each within a request
        deadline, and the wait for the gateway."""
        return self.drain_timeout + 2 * deadline_seconds(self.timeout) + 1.0

    def token(self) -> tuple[Token | None, str]:
        """The control-plane key (or a provider reading the key file) and where it comes from."""
        if self.key_file is not None:
            source = f"the key file {self.key_file}"
            return file_token(self.key_file, "the gateway key file"), source
        if self.key:
            return self.key, "the gateway key"
        return os.environ.get(KEY_ENV) or None, f"${KEY_ENV}"
