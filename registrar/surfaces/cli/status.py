"""`registrar status`: read a running agent's `/health` and say, for a person or as JSON,
whether it is registered. A plain HTTP client fits here: `requests`."""

from __future__ import annotations

import argparse
import json
import sys
import threading
from typing import Any
from urllib.parse import urlsplit

import requests

from ...core.errors import describe_exception
from ...core.machine import State
from ...core.redact import clean, redact_url
from ...core.untrusted import load_json
from .common import EXIT_NOT_REGISTERED, EXIT_OK, EXIT_UNREACHABLE, UsageError, answer

MAX_HEALTH_BYTES = 1024 * 1024
"""A health document is read up to this; a larger answer is not a registrar's."""


def _health_check(document: object) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document and its registration check's entries (one per registry), or ValueError:
    whatever the agent (or whatever answers in its place) sent, only a health document of the
    expected shape is read."""
    checks = document.get("checks") if isinstance(document, dict) else None
    entries = checks.get("registration:state") if isinstance(checks, dict) else None
    if not isinstance(document, dict) or not isinstance(entries, list) or not entries:
        raise ValueError("no registration:state check")
    if not all(isinstance(entry, dict) for entry in entries):
        raise ValueError("a registration:state entry is not an object")
    return document, entries


def _where(url: str) -> tuple[str, str]:
    """The health document's URL (`/health` unless a path is given) and how to show it."""
    shown = clean(redact_url(url), 200)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise UsageError(f"--health-url {shown!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--health-url must be an http(s) URL, got {shown!r}")
    path = parts.path if parts.path not in ("", "/") else "/health"
    target = f"{parts.scheme}://{parts.netloc}{path}"
    return target, clean(redact_url(target), 200)


class DeadlineError(Exception):
    """No complete answer within --timeout in all."""


def _get(target: str, timeout: float) -> bytes:
    with requests.get(target, timeout=timeout, stream=True) as response:
        body: bytes = response.raw.read(MAX_HEALTH_BYTES + 1, decode_content=True)
    return body


def _fetch(target: str, timeout: float) -> bytes:
    """The answer's body, read up to the cap (one more byte tells a larger one), within
    `timeout` seconds in all (requests bounds each read, not the whole answer: a server that
    trickles its headers would hold it for ever), or the exception that ended it."""
    found: dict[str, Any] = {}

    def run() -> None:
        try:
            found["body"] = _get(target, timeout)
        except Exception as exc:
            found["error"] = exc

    # A daemon thread: the command ends when the deadline passes, whatever the read does.
    reader = threading.Thread(target=run, name="registrar-status", daemon=True)
    reader.start()
    reader.join(timeout)
    if reader.is_alive():
        raise DeadlineError(f"no complete answer within the request deadline of {timeout:g} s")
    if "error" in found:
        raise found["error"]
    body: bytes = found["body"]
    return body


def cmd_status(args: argparse.Namespace) -> int:
    target, shown = _where(args.health_url.rstrip("/"))
    try:
        body = _fetch(target, args.timeout)
    except (requests.RequestException, OSError, DeadlineError) as exc:
        print(f"registrar: cannot reach {shown}: {describe_exception(exc)}", file=sys.stderr)
        return EXIT_UNREACHABLE
    try:
        if len(body) > MAX_HEALTH_BYTES:
            raise ValueError("answer too large")
        document, entries = _health_check(load_json(body.decode("utf-8", "replace")))
    except ValueError:
        print(f"registrar: {shown} is not a registrar health endpoint", file=sys.stderr)
        return EXIT_UNREACHABLE
    registered = all(e.get("observedValue") == State.REGISTERED.value for e in entries)
    outcome = EXIT_OK if registered else EXIT_NOT_REGISTERED
    if args.json:
        # The document as the agent sent it (parsed and re-encoded: valid JSON, one line).
        return answer([json.dumps(document, sort_keys=False)], outcome)
    lines: list[str] = []
    for number, check in enumerate(entries):
        if number:
            lines.append("")
        lines.extend(_registration_lines(document, check))
    if document.get("output"):
        lines.append(f"problem:      {_field(document, 'output')}")
    return answer(lines, outcome)


def _field(source: dict[str, Any], name: str, default: str = "") -> str:
    # The agent's text, escaped and capped: a health document is no licence to draw on the
    # terminal.
    value = source.get(name)
    return clean(value, 200) if value not in (None, "") else default


def _registration_lines(document: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """One registration (of one registry) for a person."""
    lines = [
        f"registration: {_field(check, 'observedValue')} ({_field(document, 'status')})"
        f" since {_field(check, 'since')}",
        f"bootstrap:    {_field(check, 'url')}",
        f"route:        {_field(check, 'route', 'not checked yet')}"
        f" (last check {_field(check, 'lastCheckAt', 'never')},"
        f" server reachable: {_field(check, 'serverReachable')})",
        f"attempts:     {_field(check, 'attemptsTotal')} sent, "
        f"{_field(check, 'registrations')} accepted, "
        f"{_plural(_field(check, 'reregistrations'), 're-registration')}",
        f"last success: {_field(check, 'lastSuccessAt', 'never')}",
    ]
    if check.get("nextAttemptAt"):
        lines.append(f"next attempt: {_field(check, 'nextAttemptAt')}")
    seen = check.get("diagnosis")
    if isinstance(seen, dict):
        lines.append(f"diagnosis:    {_field(seen, 'code')}: {clean(seen.get('sentence'), 400)}")
    return lines


def _plural(count: str, noun: str) -> str:
    return f"{count} {noun}" if count == "1" else f"{count} {noun}s"
