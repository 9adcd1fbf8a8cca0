"""The registrar's own options, checked once at construction: one line naming the option and
what is allowed, never a traceback from the thread later."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

from .backoff import Backoff
from .errors import ConfigError
from .failure import POLICIES
from .transport import FleetSized, Transport
from .untrusted import MAX_DEPTH, nesting_depth

__all__ = [
    "check_ca_bundle",
    "check_count",
    "check_loop_options",
    "check_max_retry_after",
    "check_positive",
    "check_token",
    "encode_payload",
    "fleet_size",
]

logger = logging.getLogger("registrar")


def check_positive(name: str, value: object, allow_none: bool = False) -> float | None:
    """A positive, finite number of seconds (or None when allowed)."""
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")
    ):
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{name} must be a positive number of seconds{extra}, got {value!r}")
    return float(value)


def check_count(name: str, value: object, allow_none: bool = False) -> int | None:
    """An integer >= 1 (or None when allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        if allow_none:
            raise ConfigError(f"{name} must be an integer >= 1 or None, got {value!r}")
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_loop_options(backoff: object, max_attempts: object, on_failure: object) -> None:
    if not isinstance(backoff, Backoff):
        raise ConfigError(f"backoff must be a registrar.Backoff, got {backoff!r}")
    check_count("max_attempts", max_attempts, allow_none=True)
    if not callable(on_failure) and on_failure not in POLICIES:
        raise ConfigError(
            f"on_failure must be 'retry', 'stop', 'exit' or a callable, got {on_failure!r}"
        )


def check_token(token: object) -> None:
    if token is None or callable(token):
        return
    if not isinstance(token, str) or "\n" in token or "\r" in token:
        raise ConfigError(
            "token must be a single-line string, or a callable answering one per request"
        )


def check_ca_bundle(ca_bundle: str | None) -> None:
    if ca_bundle is not None and not os.path.isfile(ca_bundle):
        raise ConfigError(f"ca_bundle {ca_bundle!r} is not a readable file")


def check_max_retry_after(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value < float("inf")
    ):
        raise ConfigError(
            f"max_retry_after must be a number of seconds >= 0 (0 ignores Retry-After), "
            f"got {value!r}"
        )
    return float(value)


def encode_payload(payload: object, limit: int) -> dict[str, Any]:
    """A private JSON copy of `payload`, or ConfigError saying what is wrong with it."""
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        raise ConfigError(f"payload must be a mapping (a JSON object), got {kind}")
    # Counted without recursion first: json.dumps would raise RecursionError, not a ConfigError.
    if nesting_depth(dict(payload), MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(
            f"payload is nested more than {MAX_DEPTH} levels deep (or contains itself); "
            "registration payloads are flat objects"
        )
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"payload is not JSON-serialisable: {exc}") from None
    size = len(encoded.encode())
    if size > limit:
        raise ConfigError(
            f"payload is {size} bytes, over max_payload_bytes={limit}; "
            "shrink it or raise max_payload_bytes"
        )
    # A private copy: later changes to the caller's mapping cannot reach the thread.
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


def fleet_size(transport: Transport, payload: Mapping[str, Any]) -> int:
    """How many clients share this server, from the transport when it knows (else 1)."""
    if not isinstance(transport, FleetSized):
        return 1
    sized: Callable[[Mapping[str, Any]], int] = transport.fleet_size
    try:
        size = sized(payload)
    except Exception:
        logger.exception("fleet_size() of %r failed; assuming a fleet of one", transport)
        return 1
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return 1
    return size
