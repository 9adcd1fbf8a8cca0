"""JSON whose shape someone else chose: read (a server's answer, a payload file) with nesting
bounded and every failure a `ValueError` naming what was wrong, never a `RecursionError`; and
the payload, checked once at construction (one line saying what is wrong with it)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ._errors import ConfigError
from ._redact import clean

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted; registration payloads are one level deep."""


def _too_deep(value: object) -> bool:
    """Whether `value`'s dicts, lists and tuples nest deeper than `MAX_DEPTH`, counted without
    recursion and stopping there, so a cyclic or absurd value costs little."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > MAX_DEPTH:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def load_json(text: str | bytes) -> Any:
    """The JSON value in `text`, or `ValueError` (bad JSON, nested deeper than `MAX_DEPTH`)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, digits
        raise ValueError(f"not valid JSON: {clean(exc, 200)}") from None
    if _too_deep(value):
        raise ValueError(f"JSON nested more than {MAX_DEPTH} levels deep")
    return value


def json_object(text: str | bytes) -> dict[str, Any] | None:
    """The JSON object in `text`; None when it is not valid JSON or not an object."""
    try:
        value = load_json(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def encode_payload(payload: object, limit: int) -> dict[str, Any]:
    """A private JSON copy of `payload`, or ConfigError saying what is wrong with it."""
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        raise ConfigError(f"payload must be a mapping (a JSON object), got {kind}")
    # Counted without recursion first: json.dumps would raise RecursionError, not a ConfigError.
    if _too_deep(dict(payload)):
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
