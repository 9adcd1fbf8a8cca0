"""The smg gateway options and every rule of them (docs/gateway.md, "Settings"), and the
`POST /workers` body (the gateway's WorkerSpec), checked once where a registrar is configured:
a bad field is one `ConfigError` naming it, not a 400 at every attempt."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypedDict

from ...core import _rules as rules
from ...core._errors import ConfigError
from ...core._transport import Timeout, Token, deadline_seconds, file_token

KEY_ENV = "REGISTRAR_GATEWAY_KEY"
DEFAULT_CONFIRM_TIMEOUT = 30.0
"""A stand-in worker is listed in about 0.1 s; one whose /health fails is dropped in about 2 s."""
_seconds = rules.number_within(lambda v: 0 < v < 1e9, "must be a positive number of seconds")
WORKER_TYPES = ("prefill", "decode", "regular")


def worker_type_rule(value: object) -> str:
    """The rule of a worker's type (the spec's field and `SmgSettings.worker_type`)."""
    if value not in WORKER_TYPES:
        raise rules.Invalid(f"must be one of {', '.join(WORKER_TYPES)}")
    return str(value)


def worker_spec(
    url: str, worker_type: str = "regular", bootstrap_port: int | None = None, **fields: Any
) -> dict[str, Any]:
    """The body for a worker at `url`; other WorkerSpec fields (priority, labels...) pass."""
    port = {} if bootstrap_port is None else {"bootstrap_port": bootstrap_port}
    return validate_spec({"url": url, "worker_type": worker_type, **fields, **port})


def validate_spec(payload: object) -> dict[str, Any]:
    """A copy of `payload` with its URL normalised, or one `ConfigError` naming the field."""
    if not isinstance(payload, Mapping):
        raise ConfigError(f"payload must be a worker spec mapping, got {type(payload).__name__}")
    spec = dict(payload)
    spec["url"] = rules.applied("worker url", spec.get("url"), rules.url)
    kind = rules.applied("worker_type", spec.setdefault("worker_type", "regular"), worker_type_rule)
    port = rules.applied("bootstrap_port", spec.get("bootstrap_port"), rules.port_or_none)
    if port is not None and kind != "prefill":
        raise ConfigError("bootstrap_port is for a prefill worker (worker_type=prefill)")
    return spec


class SmgOptions(TypedDict, total=False):
    """The fields of `SmgSettings` after the gateways and the worker, as keywords."""

    bootstrap_port: int | None
    ready: str | Callable[[], bool] | None
    grace: float
    ready_interval: float
    confirm_timeout: float
    drain_timeout: float
    key: Token | None
    key_file: str | None
    timeout: Timeout
    verify: bool | str


@dataclass(frozen=True)
class SmgSettings:
    gateways: str | Sequence[str]
    worker_url: str | None = None  # None: the payload is the worker's spec (`protocol="smg"`)
    worker_type: str = "regular"
    bootstrap_port: int | None = None
    ready: str | Callable[[], bool] | None = None
    grace: float = 10.0
    ready_interval: float = 1.0
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT
    drain_timeout: float = 15.0  # the gateway's own settle time is 5 s by default
    key: Token | None = None
    key_file: str | None = None
    timeout: Timeout = 5.0
    verify: bool | str = True

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "gateways": rules.urls("gateway", "http://127.0.0.1:30000"),
        "worker_url": lambda value: None if value is None else rules.url(value),
        "worker_type": worker_type_rule,
        "bootstrap_port": rules.port_or_none,
        "ready": lambda value: value if value is None or callable(value) else rules.url(value),
        "grace": _seconds,
        "ready_interval": _seconds,
        "confirm_timeout": _seconds,
        "drain_timeout": _seconds,
        "timeout": rules.timeout,
        "verify": rules.tls,
    }

    auth: tuple[Token | None, str] = field(init=False, repr=False, compare=False)
    """The control-plane key (or a provider reading the key file) and where it comes from: read
    once, here (a key file that cannot be read now is an error now)."""

    def __post_init__(self) -> None:
        rules.check_fields(self, self.RULES)
        if self.key is not None and self.key_file is not None:
            raise ConfigError("give the gateway key or the gateway key file, not both")
        auth: tuple[Token | None, str] = (os.environ.get(KEY_ENV) or None, f"${KEY_ENV}")
        if self.key_file is not None:
            source = f"the key file {self.key_file}"
            auth = file_token(self.key_file, "the gateway key file"), source
        elif self.key:
            auth = self.key, "the gateway key"
        object.__setattr__(self, "auth", auth)  # frozen: set once, as it is made

    @property
    def stop_timeout(self) -> float:
        """Seconds a stop may take: the drain's wait, its DELETE and last look (a deadline each)."""
        return self.drain_timeout + 2 * deadline_seconds(self.timeout) + 1.0
