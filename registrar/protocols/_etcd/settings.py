"""The etcd options and every rule of them (docs/etcd.md, "Settings")."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar, TypedDict

from ...core import _rules as rules
from ...core._errors import ConfigError
from ...core._transport import Timeout, deadline_seconds


def _ttl(value: object) -> float:
    kept = rules.seconds(value)
    if not 1 <= kept <= 9_000_000_000:
        raise rules.Invalid("must be a positive number of seconds within [1, 9e9] (etcd's lease)")
    return kept


def _keepalive_fraction(value: object) -> float:
    kept = rules.fraction_open(value)
    if not 0.05 <= kept <= 0.5:
        raise rules.Invalid("must be within [0.05, 0.5] (of the TTL)")
    return kept


def _cert(value: object) -> tuple[str, str] | None:
    if value is None:
        return None
    pair = value if isinstance(value, tuple) and len(value) == 2 else ()
    if pair and all(isinstance(path, str) and os.path.isfile(path) for path in pair):
        return (pair[0], pair[1])
    raise rules.Invalid("must be a (certificate file, key file) pair of readable files")


class EtcdOptions(TypedDict, total=False):
    """The fields of `EtcdSettings` after the endpoints and the key, as keywords."""

    ttl: float
    keepalive_fraction: float
    username: str | None
    password: str | None
    timeout: Timeout
    verify: bool | str
    cert: tuple[str, str] | None


@dataclass(frozen=True)
class EtcdSettings:
    endpoints: str | Sequence[str]
    key: str
    ttl: float = 10.0
    keepalive_fraction: float = 1 / 3  # etcd's Go client's: two renewals may fail before expiry
    username: str | None = None
    password: str | None = None
    timeout: Timeout = 2.0  # a stopped member costs this before failing over
    verify: bool | str = True
    cert: tuple[str, str] | None = None

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "endpoints": rules.urls("etcd client", "http://127.0.0.1:2379"),
        "key": rules.single_line,
        "ttl": _ttl,
        "keepalive_fraction": _keepalive_fraction,
        "username": rules.single_line,
        "password": rules.single_line,
        "timeout": rules.timeout,
        "verify": rules.tls,
        "cert": _cert,
    }

    def __post_init__(self) -> None:
        if self.key is None:
            raise ConfigError("key must be a non-empty single-line string, e.g. /services/rank0")
        rules.check_fields(self, self.RULES)
        if (self.username is None) != (self.password is None):
            raise ConfigError("username and password go together: give both or neither")
        left = self.lease_seconds * (1 - self.keepalive_fraction)
        deadline = deadline_seconds(self.timeout)
        if deadline >= left:
            raise ConfigError(
                f"timeout ({deadline:g} s per request) must be shorter than the part of the "
                f"TTL left after a renewal is due ({left:g} s of ttl={self.lease_seconds}): a "
                "member that never answers would cost the lease before the next one is asked; "
                "raise ttl or lower timeout"
            )

    @property
    def lease_seconds(self) -> int:
        """The lease's TTL in whole seconds, rounded up as etcd takes it."""
        return int(-(-self.ttl // 1))
