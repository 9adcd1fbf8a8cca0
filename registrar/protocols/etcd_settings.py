"""The etcd registration's settings: one frozen value, validated once when it is made, from
which `registrar.assembly` builds the `EtcdTransport` (and a surface reads the defaults its
help shows: a request's deadline is 2 s here, not HTTP's 5 s)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from ..core import rules
from ..core.errors import ConfigError
from ..core.transport import Timeout
from .etcd import DEFAULT_KEEPALIVE_FRACTION, DEFAULT_TIMEOUT, DEFAULT_TTL

__all__ = ["EtcdSettings"]


def _cert(value: object) -> tuple[str, str] | None:
    if value is None:
        return None
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(isinstance(path, str) and os.path.isfile(path) for path in value)
    ):
        return (value[0], value[1])
    raise rules.Invalid("must be a (certificate file, key file) pair of readable files")


@dataclass(frozen=True)
class EtcdSettings:
    """The key under a lease: where (endpoints, key), how long a crashed process's key
    outlives it (ttl) and when the lease is renewed, and how to reach etcd (credentials,
    deadline, TLS: a CA file or directory, a client certificate)."""

    endpoints: str | Sequence[str]
    key: str
    ttl: float = DEFAULT_TTL
    keepalive_fraction: float = DEFAULT_KEEPALIVE_FRACTION
    username: str | None = None
    password: str | None = None
    timeout: Timeout = DEFAULT_TIMEOUT
    verify: bool = True
    ca_bundle: str | None = None
    cert: tuple[str, str] | None = None

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "endpoints": rules.urls("etcd client", "http://127.0.0.1:2379"),
        "key": rules.single_line,
        "ttl": rules.seconds,
        "keepalive_fraction": rules.fraction_open,
        "username": rules.single_line,
        "password": rules.single_line,
        "timeout": rules.timeout,
        "verify": bool,
        "ca_bundle": rules.existing_path,
        "cert": _cert,
    }

    def __post_init__(self) -> None:
        if self.key is None:
            raise ConfigError("key must be a non-empty single-line string, e.g. /services/rank0")
        rules.check_fields(self, self.RULES)
        if (self.username is None) != (self.password is None):
            raise ConfigError("username and password go together: give both or neither")

    @property
    def tls(self) -> bool | str:
        """What the transport's `verify=` takes: the CA path, else whether to verify."""
        return self.ca_bundle if self.ca_bundle is not None else self.verify

    def transport_options(self) -> dict[str, Any]:
        """The `EtcdTransport` keyword arguments these settings stand for."""
        return {
            "ttl": self.ttl,
            "keepalive_fraction": self.keepalive_fraction,
            "username": self.username,
            "password": self.password,
            "timeout": self.timeout,
            "verify": self.tls,
            "cert": self.cert,
        }
