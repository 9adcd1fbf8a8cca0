"""Keep secrets out of every text registrar produces.

URLs may carry `user:password@`; those are used for the request and never shown. Tokens are
scrubbed from any free text (an exception message may echo a header).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact_text", "redact_url"]


def redact_url(url: str) -> str:
    """`url` with any credentials replaced by `***`."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<invalid URL>"
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"***@{host}" + (f":{port}" if port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def redact_text(text: str, secrets: tuple[str, ...]) -> str:
    """`text` with every non-empty secret replaced by `***`."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text
