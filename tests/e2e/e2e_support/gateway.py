"""The smg router's side of the gateway scenarios (6 and r1, docs/e2e.md): what it lists, each
server's gateway registration as its `/server_info` shows it, and a server drained by SIGTERM.

On releases before 0.5.22 `/server_info` carries no `registrar_gateway` (the plugin's target
table has no "server status" target there): the registrations' state is then read from the
router alone, and the point to look for duplicates is after two watch intervals instead.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from typing import Any

import requests

from registrar.core._backoff import WATCH_JITTER
from registrar.core._settings import DEFAULT_WATCH_INTERVAL

from .deploy import Process
from .release import has_feature
from .stack import Record

__all__ = [
    "DRAIN_TIMEOUT",
    "LISTED_BOUND",
    "checked",
    "drain",
    "listed",
    "no_duplicates",
    "shown",
    "wait_listed",
]

LISTED_BOUND = 120.0
"""Within this the router must list a worker that is ready (2 loaded cores)."""
DRAIN_TIMEOUT = 30.0


def listed(router: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{router}/workers", timeout=10)
    answer.raise_for_status()
    workers: list[dict[str, Any]] = answer.json()["workers"]
    return workers


def wait_listed(router: str, urls: set[str], timeout: float) -> float:
    """Until every URL is listed ready; the time it happened."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            seen = listed(router)
        except requests.RequestException:
            seen = []
        ready = {w["url"].rstrip("/") for w in seen if w.get("status") == "ready"}
        if urls <= ready:
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"the router does not list {sorted(urls)} ready in {timeout} s: {seen}")


def no_duplicates(router: str) -> list[str]:
    urls = [w["url"].rstrip("/") for w in listed(router)]
    twice = [url for url, n in Counter(urls).items() if n > 1]
    assert not twice, f"listed more than once: {twice} ({urls})"
    return urls


def shown(router: str, servers: tuple[Process, ...], timeout: float = 60.0) -> None:
    """Each server's /server_info shows its gateway registration, with the id the router
    lists it under now (where the release lets the plugin add it to /server_info)."""
    if not has_feature("server status"):
        return
    deadline = time.monotonic() + timeout
    while True:
        ids = {w["url"].rstrip("/"): w["id"] for w in listed(router)}
        shown = {
            s.url: requests.get(f"{s.url}/server_info", timeout=30).json().get("registrar_gateway")
            for s in servers
        }
        if all(
            g and g[0]["state"] == "registered" and g[0]["worker_id"] == ids.get(url)
            for url, g in shown.items()
        ):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"/server_info {shown} against the router's ids {ids}")
        time.sleep(0.5)


def checked(servers: tuple[Process, ...], times: int = 2, timeout: float = 60.0) -> None:
    """Wait until each server's gateway registration has checked the router `times` more times
    (`last_check_at` in /server_info moved on that often): each check was a chance to add the
    worker again. The point to look for duplicates at, instead of a sleep; where /server_info
    cannot show it (before 0.5.22), `times` of the longest watch intervals are waited out."""
    if not has_feature("server status"):
        time.sleep(times * DEFAULT_WATCH_INTERVAL * (1 + WATCH_JITTER) + 1)
        return
    seen: dict[str, list[Any]] = {s.url: [] for s in servers}
    deadline = time.monotonic() + timeout
    while True:
        for s in servers:
            info = requests.get(f"{s.url}/server_info", timeout=30).json()
            at = (info.get("registrar_gateway") or [{}])[0].get("last_check_at")
            if not seen[s.url] or at != seen[s.url][-1]:
                seen[s.url].append(at)
        if all(len(ats) > times for ats in seen.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the registrations did not check {times} times: {seen}")
        time.sleep(0.5)


def drain(router: str, server: Process, record: Record) -> None:
    """SIGTERM to the server's main process: the router stops listing it while it serves."""
    sent = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    deadline = sent + DRAIN_TIMEOUT + 30
    while time.monotonic() < deadline:
        if server.url not in no_duplicates(router):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{server.name} still listed {deadline - sent:.0f} s after SIGTERM")
    gone = time.monotonic()
    record.figures[f"drain_{server.name}_s"] = round(gone - sent, 2)
    # Asked once the router has let the server go: 503 from SIGTERM on (SGLang is shutting
    # down). On a loaded machine SGLang may have finished its shutdown before this look, so
    # the proof that the drain came first is the server's own: its drain line, written when it
    # saw itself gone from the router's list, before SGLang's watchdog stops serving.
    record.figures[f"{server.name}: /health once not listed"] = _health(server.url)
    server.proc.wait(120)
    text = server.text()
    assert "drained from 1 gateway in" in text, server.tail()
    assert "not every drain finished" not in text, server.tail()


def _health(url: str) -> str:
    try:
        return str(requests.get(f"{url}/health", timeout=10).status_code)
    except requests.RequestException as exc:
        return f"no answer ({type(exc).__name__}): SGLang's shutdown had begun"
