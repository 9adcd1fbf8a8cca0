"""Reading JSON that someone else wrote (a server's answer, a payload file, a health document)
without letting its shape end the reader: nesting is bounded and every failure is a
`ValueError` naming what was wrong, never a `RecursionError` from deep inside the decoder."""

from __future__ import annotations

import json
from typing import Any

from .redact import clean

MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted; registration payloads are one level deep."""


def nesting_depth(value: object, limit: int = MAX_DEPTH) -> int:
    """How deeply `value`'s dicts, lists and tuples nest, counted without recursion; stops
    counting past `limit` (returns `limit + 1`), so a cyclic or absurd value costs little."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return limit + 1
        stack.extend((child, depth + 1) for child in children)
    return deepest


def load_json(text: str | bytes, limit: int = MAX_DEPTH) -> Any:
    """The JSON value in `text`, or `ValueError` (bad JSON, nested deeper than `limit`)."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"JSON nested more than {limit} levels deep") from None
    except (ValueError, TypeError) as exc:  # JSONDecodeError, UnicodeDecodeError, digits
        raise ValueError(f"not valid JSON: {clean(exc, 200)}") from None
    if nesting_depth(value, limit) > limit:
        raise ValueError(f"JSON nested more than {limit} levels deep")
    return value
