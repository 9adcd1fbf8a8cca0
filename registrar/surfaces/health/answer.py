"""One request to the health endpoints answered, independent of WSGI or ASGI: the probe paths
and their one-check paths, `?exclude=` and `?verbose`, plain-text 404 and 405 for anything else.
`/metrics` is left to the caller (it is prometheus-client's)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from urllib.parse import parse_qs

from ...core.redact import clean
from .document import (
    HEALTH_CONTENT_TYPE,
    PROBES,
    HealthGroup,
    HealthSource,
    described_checks,
    render_probe,
    snapshot,
    verbose_text,
)
from .options import DEFAULT_OPTIONS, HealthOptions, ProbeQuery

__all__ = ["TEXT_CONTENT_TYPE", "Answer", "answer_health", "no_metrics"]

TEXT_CONTENT_TYPE = "text/plain; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    """One HTTP answer, independent of WSGI or ASGI."""

    code: int
    headers: tuple[tuple[str, str], ...]
    body: bytes


def _answer(code: int, content_type: str, body: bytes, *extra: tuple[str, str]) -> Answer:
    headers = (
        ("Content-Type", content_type),
        ("Content-Length", str(len(body))),
        ("Cache-Control", "no-store"),
        *extra,
    )
    return Answer(code, headers, body)


def _text(code: int, text: str, *extra: tuple[str, str]) -> Answer:
    return _answer(code, TEXT_CONTENT_TYPE, text.encode(), *extra)


def answer_health(
    source: HealthSource | HealthGroup,
    method: str,
    path: str,
    query: str,
    options: HealthOptions = DEFAULT_OPTIONS,
) -> Answer | None:
    """The answer to one request, or None for `/metrics` (served by the caller). Unknown paths
    and methods answer plain text, not health documents; `options` are the app's."""
    path = path or "/"
    if path == "/metrics":
        return None if method in ("GET", "HEAD") else _not_allowed()
    probe, _, only = path.lstrip("/").partition("/")
    if probe not in PROBES or (only and only not in PROBES[probe]) or path.endswith("/"):
        # The client's path, escaped and capped: an answer is no place to reflect raw bytes.
        asked = clean(path, 100)
        return _text(404, f"404 not found: {asked}; try /readyz, /livez or /health\n")
    if method not in ("GET", "HEAD"):
        return _not_allowed()
    params = parse_qs(query, keep_blank_values=True)
    exclude = [n for value in params.get("exclude", []) for n in value.split(",") if n]
    members = list(source.members()) if isinstance(source, HealthGroup) else [source]
    snapshots = [snapshot(member) for member in members]
    every, description = described_checks(snapshots, group=isinstance(source, HealthGroup))
    if "verbose" in params:
        names = [only] if only else list(PROBES[probe])
        shown = [every[n] for n in names if n not in exclude]
        excluded = [n for n in names if n in exclude]
        unknown = [n for n in exclude if n not in every]
        code, text = verbose_text(shown, excluded, unknown, probe)
        return _text(code, text)
    wanted = ProbeQuery(probe, only or None, tuple(exclude))
    code, document = render_probe(
        every,
        description,
        wanted,
        members[0].payload,
        options,
    )
    return _answer(code, HEALTH_CONTENT_TYPE, json.dumps(document, indent=2).encode() + b"\n")


def _not_allowed() -> Answer:
    return _text(405, "405 method not allowed: use GET or HEAD\n", ("Allow", "GET, HEAD"))


def no_metrics() -> Answer:
    return _text(
        404, "404 not found: /metrics needs the extra: pip install 'sglang-registrar[metrics]'\n"
    )
