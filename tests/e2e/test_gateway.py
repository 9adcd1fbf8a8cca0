"""Scenario 6: the router knows no worker but what the plugin tells it (docs/e2e.md).

The smg router starts with no static workers (`smg launch --pd-disaggregation` without
`--prefill`/`--decode`); the prefill and decode servers, with `REGISTRAR_GATEWAY` pointing at
it, register themselves once their `/ready` holds. The router is killed (-9) and started again
on the same port: the plugin adds both workers again, requests are served again, and no URL is
listed twice. Last each server gets SIGTERM (its main process, as Kubernetes sends it) and must
be gone from the router's list while its HTTP server still answers.

On releases before 0.5.22 `/server_info` carries no `registrar_gateway` (the plugin's target
table has no "server status" target there): the registrations' state is then read from the
router alone, and the point to look for duplicates is after two watch intervals instead.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from dataclasses import asdict
from typing import Any

import pytest
import requests
from e2e_support.deploy import Deployment, Process, server_env, wait_http
from e2e_support.lines import assert_plugin_lines
from e2e_support.release import has_feature
from e2e_support.scenarios import run
from e2e_support.stack import SERVE_TIMEOUT, Probe, Record
from support import process_port

from registrar.core._backoff import WATCH_JITTER
from registrar.core._settings import DEFAULT_WATCH_INTERVAL

pytestmark = pytest.mark.timeout(900)

LISTED_BOUND = 120.0
"""Within this the router must list a worker that is ready (2 loaded cores)."""
DRAIN_TIMEOUT = 30.0


def _listed(router: str) -> list[dict[str, Any]]:
    answer = requests.get(f"{router}/workers", timeout=10)
    answer.raise_for_status()
    workers: list[dict[str, Any]] = answer.json()["workers"]
    return workers


def _wait_listed(router: str, urls: set[str], timeout: float) -> float:
    """Until every URL is listed ready; the time it happened."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            seen = _listed(router)
        except requests.RequestException:
            seen = []
        ready = {w["url"].rstrip("/") for w in seen if w.get("status") == "ready"}
        if urls <= ready:
            return time.monotonic()
        time.sleep(0.2)
    raise AssertionError(f"the router does not list {sorted(urls)} ready in {timeout} s: {seen}")


def _no_duplicates(router: str) -> list[str]:
    urls = [w["url"].rstrip("/") for w in _listed(router)]
    twice = [url for url, n in Counter(urls).items() if n > 1]
    assert not twice, f"listed more than once: {twice} ({urls})"
    return urls


def _shown(router: str, servers: tuple[Process, ...], timeout: float = 60.0) -> None:
    """Each server's /server_info shows its gateway registration, with the id the router
    lists it under now (where the release lets the plugin add it to /server_info)."""
    if not has_feature("server status"):
        return
    deadline = time.monotonic() + timeout
    while True:
        ids = {w["url"].rstrip("/"): w["id"] for w in _listed(router)}
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


def _checked(servers: tuple[Process, ...], times: int = 2, timeout: float = 60.0) -> None:
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


def _drain(router: str, server: Process, record: Record) -> None:
    """SIGTERM to the server's main process: the router stops listing it while it serves."""
    sent = time.monotonic()
    os.kill(server.proc.pid, signal.SIGTERM)
    deadline = sent + DRAIN_TIMEOUT + 30
    while time.monotonic() < deadline:
        if server.url not in _no_duplicates(router):
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"{server.name} still listed {deadline - sent:.0f} s after SIGTERM")
    gone = time.monotonic()
    # The drain came first: the server still answers HTTP once the router has let it go
    # (its /health says 503 from SIGTERM on: SGLang is shutting down).
    assert requests.get(f"{server.url}/health", timeout=10).status_code in (200, 503)
    assert server.alive()
    record.figures[f"drain_{server.name}_s"] = round(gone - sent, 2)
    server.proc.wait(120)
    assert "drained from 1 gateway in" in server.text(), server.tail()


def gateway_restart(deploy: Deployment, record: Record) -> None:
    router_port = process_port()
    router = deploy.router(router_port)
    wait_http(router, "/workers", 60)
    env = server_env(
        plugin=True,
        REGISTRAR_GATEWAY=router.url,
        REGISTRAR_DRAIN_TIMEOUT=str(DRAIN_TIMEOUT),
    )
    prefill = deploy.prefill(process_port(), process_port(), env)
    decode = deploy.decode(process_port(), env)
    urls = {prefill.url, decode.url}
    for server in (prefill, decode):
        wait_http(server, "/health", SERVE_TIMEOUT)
    for server in (prefill, decode):  # what docs/sglang.md tells an operator to find
        assert_plugin_lines(server, plugin=True, rows=1 if server is prefill else 0)
        offering = f"offering {server.url} ({server.name}) to the gateway "
        assert server.text().count(offering) == 1, server.tail()
    _wait_listed(router.url, urls, SERVE_TIMEOUT)
    zero = time.monotonic()
    with Probe(router.url, zero) as probe:
        assert probe.wait_ok(LISTED_BOUND) is not None, f"not serving: {probe.samples[-3:]}"
        assert sorted(_no_duplicates(router.url)) == sorted(urls)
        _shown(router.url, (prefill, decode))

        router.kill()
        record.events["router killed"] = round(time.monotonic() - zero, 2)
        router = deploy.router(router_port)
        listening = router.started + wait_http(router, "/workers", 60)
        since = listening - zero
        record.events["router listening again"] = round(since, 2)
        listed = _wait_listed(router.url, urls, LISTED_BOUND)
        record.figures["router_listening_to_both_listed_s"] = round(listed - listening, 2)
        first = probe.wait_ok(LISTED_BOUND, after=since)
        assert first is not None, f"not served after the restart: {probe.samples[-3:]}"
        record.figures["router_listening_to_served_s"] = round(first.done - since, 2)
        _checked((prefill, decode))  # checks after the relisting: nothing is added twice
        assert sorted(_no_duplicates(router.url)) == sorted(urls)
        _shown(router.url, (prefill, decode))
    record.samples = [
        asdict(s) | {"t": round(s.t, 2), "done": round(s.done, 2)} for s in probe.samples
    ]
    _drain(router.url, decode, record)
    _drain(router.url, prefill, record)


def test_6_the_plugin_registers_with_a_restarted_router_and_drains(
    deploy: Deployment, results: Any
) -> None:
    run(results, "6", True, gateway_restart, deploy)
