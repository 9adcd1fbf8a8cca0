"""The `POST /workers` body (the gateway's WorkerSpec), checked once where a registrar is
configured: a bad field is one `ConfigError` naming it, not a 400 at every attempt."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core import _rules as rules
from ...core._errors import ConfigError

WORKER_TYPES = ("prefill", "decode", "regular")


def worker_type(value: object) -> str:
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
    kind = rules.applied("worker_type", spec.setdefault("worker_type", "regular"), worker_type)
    port = rules.applied("bootstrap_port", spec.get("bootstrap_port"), rules.port_or_none)
    if port is not None and kind != "prefill":
        raise ConfigError("bootstrap_port is for a prefill worker (worker_type=prefill)")
    return spec
