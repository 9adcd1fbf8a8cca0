"""`registrar status`: read a running agent's `/health` and say, for a person or as JSON,
whether it is registered. The registrar's own HTTP transport reads it: one deadline bounds the
whole request, the name lookup included, and the answer is read up to a cap."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any
from urllib.parse import urlsplit

from ...core._board import State
from ...core._errors import describe_exception
from ...core._redact import clean, load_json, redact_url
from ...core._settings import HttpSettings
from ...protocols._http import HttpTransport
from . import EXIT_NOT_REGISTERED, EXIT_OK, EXIT_UNREACHABLE, UsageError, answer

MAX_HEALTH_BYTES = 1024 * 1024  # a larger answer is not a registrar's


def _health_check(document: object) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document and its registration check's entries (one per registry), or ValueError:
    only a health document of the expected shape is read, whatever answered."""
    checks = document.get("checks") if isinstance(document, dict) else None
    entries = checks.get("registration:state") if isinstance(checks, dict) else None
    if not isinstance(document, dict) or not isinstance(entries, list) or not entries:
        raise ValueError("no registration:state check")
    if not all(isinstance(entry, dict) for entry in entries):
        raise ValueError("a registration:state entry is not an object")
    return document, entries


def _where(url: str) -> tuple[str, str, str]:
    """The agent's URL, the document's path (`/health` unless one is given), how to show both."""
    shown = clean(redact_url(url), 200)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise UsageError(f"--health-url {shown!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--health-url must be an http(s) URL, got {shown!r}")
    path = parts.path if parts.path not in ("", "/") else "/health"
    base = f"{parts.scheme}://{parts.netloc}"
    return base, path, clean(redact_url(base + path), 200)


def _fetch(base: str, path: str, timeout: float) -> str:
    """The answer's text, or `OSError` saying what ended it; `ValueError` for one over the cap."""
    with contextlib.closing(HttpTransport(HttpSettings(base, timeout=timeout))) as http:
        result = http.send("GET", path, limit=MAX_HEALTH_BYTES)
    if result.error is not None:
        raise OSError(http.describe_error(result.error))
    if not result.complete:
        raise ValueError("answer too large")
    return result.text


def cmd_status(args: argparse.Namespace) -> int:
    base, path, shown = _where(args.health_url.rstrip("/"))
    try:
        document, entries = _health_check(load_json(_fetch(base, path, args.timeout)))
    except OSError as exc:
        print(f"registrar: cannot reach {shown}: {describe_exception(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except ValueError:
        print(f"registrar: {shown} is not a registrar health endpoint", file=sys.stderr)
        return EXIT_UNREACHABLE
    registered = all(e.get("observedValue") == State.REGISTERED.value for e in entries)
    outcome = EXIT_OK if registered else EXIT_NOT_REGISTERED
    if args.json:
        # The document as the agent sent it (parsed and re-encoded: valid JSON, one line).
        return answer([json.dumps(document, sort_keys=False)], outcome)
    # One block per registry, a blank line between.
    lines = ["\n\n".join("\n".join(_registration_lines(document, c)) for c in entries)]
    if document.get("output"):
        lines.append(f"problem:      {_field(document, 'output')}")
    return answer(lines, outcome)


def _field(source: dict[str, Any], name: str, default: str = "") -> str:
    # The agent's text, escaped and capped: a health document is no licence to draw on screen.
    value = source.get(name)
    return clean(value, 200) if value not in (None, "") else default


def _registration_lines(document: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """One registration (of one registry) for a person."""
    again = _field(check, "reregistrations")
    lines = [
        f"registration: {_field(check, 'observedValue')} ({_field(document, 'status')})"
        f" since {_field(check, 'since')}",
        f"bootstrap:    {_field(check, 'url')}",
        f"route:        {_field(check, 'route', 'not checked yet')}"
        f" (last check {_field(check, 'lastCheckAt', 'never')},"
        f" server reachable: {_field(check, 'serverReachable')})",
        f"attempts:     {_field(check, 'attemptsTotal')} sent, "
        f"{_field(check, 'registrations')} accepted, "
        f"{again} re-registration{'' if again == '1' else 's'}",
        f"last success: {_field(check, 'lastSuccessAt', 'never')}",
    ]
    if check.get("nextAttemptAt"):
        lines.append(f"next attempt: {_field(check, 'nextAttemptAt')}")
    if isinstance(seen := check.get("diagnosis"), dict):
        lines.append(f"diagnosis:    {_field(seen, 'code')}: {clean(seen.get('sentence'), 400)}")
    if check.get("resolution"):
        lines.append(f"resolver:     {_field(check, 'resolution')}")
    return lines
