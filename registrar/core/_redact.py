"""Keep secrets out of every text registrar produces (`Secrets`: every form an error text may
spell them in), and make text a peer chose safe to show (`clean`: control characters escaped,
length capped), so it cannot forge a log line (docs/reliability.md); read JSON a peer chose with
nesting bounded (a `ValueError`, never a `RecursionError`); check the payload at construction."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import quote, quote_plus, unquote, urlsplit, urlunsplit

from ._errors import ConfigError

MAX_SHOWN = 300  # characters of untrusted text shown in one log line or status field, at most

MASK = "***"

# C0 and C1 controls, DEL, the Unicode line and paragraph separators, zero-width and invisible
# format characters (word joiner, invisible operators) and bidirectional overrides: anything
# that can end a log line or disguise what follows. A URL holding one is refused (`rules.url`).
UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u206f\ufeff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def redact_url(url: str) -> str:
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = None
    with suppress(ValueError):
        port = parts.port
    netloc = f"{MASK}@{host}" + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _forms(secret: str) -> set[str]:
    """Every way an error text may spell `secret`."""
    forms = {secret, unquote(secret)}
    for value in (secret, unquote(secret)):
        for quoted in (quote(value, safe=""), quote(value), quote_plus(value)):
            forms.add(quoted)
            forms.add(re.sub("%[0-9A-F]{2}", lambda m: m.group().lower(), quoted))
        forms.add(repr(value)[1:-1])
        forms.add(json.dumps(value)[1:-1])
        forms.add(repr(value.encode("utf-8", "backslashreplace"))[2:-1])
        forms.add(value.encode("unicode_escape").decode("ascii"))
        forms.add(base64.b64encode(value.encode("utf-8", "replace")).decode("ascii"))
    return {form for form in forms if form}


@dataclass(frozen=True)
class Secrets:
    """The credentials one transport holds, in every form they may take in an error text."""

    forms: tuple[str, ...] = field(default=(), repr=False)
    """Longest first, so a longer form is masked before a shorter one inside it."""

    @classmethod
    def of(
        cls, values: Iterable[str | None] = (), *, basic: tuple[str, str] | None = None
    ) -> Secrets:
        """The secrets `values` (None and empty ones skipped), and a Basic-auth pair, whose
        header (`base64(user:password)`) is a secret of its own."""
        forms: set[str] = set().union(*(_forms(value) for value in values if value))
        if basic is not None:
            user, password = (unquote(part) for part in basic)
            for raw in (f"{user}:{password}", f"{basic[0]}:{basic[1]}"):
                for encoding in ("latin-1", "utf-8"):
                    with suppress(UnicodeEncodeError):
                        forms.add(base64.b64encode(raw.encode(encoding)).decode("ascii"))
            forms |= _forms(user) | _forms(password)
        return cls(tuple(sorted(forms, key=len, reverse=True)))

    def redact(self, text: str, cut: bool = False) -> str:
        """`text` with every form masked. With `cut` (the text was truncated, possibly in the
        middle of a secret), a tail of 4 or more characters that begins a form is masked too
        (3 characters of a secret tell nothing, and masking less would maim most texts)."""
        for form in self.forms:
            text = text.replace(form, MASK)
        if cut:
            for form in self.forms:
                for size in range(min(len(form) - 1, len(text)), 3, -1):
                    if text.endswith(form[:size]):
                        text = text[:-size] + MASK
                        break
        return text


def clean(
    text: object, limit: int = MAX_SHOWN, secrets: Secrets = Secrets(), cut: bool = False
) -> str:
    """`text` as one safe line: secrets masked, control characters escaped (`\\x0a`), at most
    `limit` characters, then " ..."; `cut`: `text` begins a longer one (a body read up to a cap)."""
    text = text if isinstance(text, str) else str(text)
    # Look at no more than can be shown: a multi-megabyte text costs what its start costs. The
    # margin is wide enough that a secret starting before the limit is masked whole.
    window = limit + max(map(len, secrets.forms), default=0)
    more = len(text) > window
    shown = UNSAFE.sub(_escape, secrets.redact(text[:window], cut=cut or more))
    if len(shown) > limit or more:
        shown = shown[:limit].rstrip() + " ..."
    return shown


MAX_DEPTH = 64
"""Deepest nesting of objects and arrays accepted; registration payloads are one level deep."""


def _too_deep(value: object) -> bool:
    """Whether `value`'s dicts, lists and tuples nest deeper than `MAX_DEPTH`, counted without
    recursion and stopping there, so a cyclic or absurd value costs little."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list | tuple):
            continue
        if depth > MAX_DEPTH:
            return True
        children = item.values() if isinstance(item, dict) else item
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
    # Counted first, without recursion, to say what is wrong (json.dumps would only recurse).
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
    return cast(dict[str, Any], json.loads(encoded))
