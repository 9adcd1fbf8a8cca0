"""The payload, checked once at construction (one line saying what is wrong with it, never a
traceback from the thread later), and the fleet size a transport reports. The options' rules
are in `registrar.core.rules`, applied by the settings (`registrar.core.settings`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

from .errors import ConfigError
from .transport import FleetSized, Transport
from .untrusted import MAX_DEPTH, nesting_depth

logger = logging.getLogger("registrar")


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
