"""Scenario 6: the router knows no worker but what the plugin tells it (docs/e2e.md).

The smg router starts with no static workers (`smg launch --pd-disaggregation` without
`--prefill`/`--decode`); the prefill and decode servers, with `REGISTRAR_GATEWAY` pointing at
it, register themselves once their `/ready` holds. The router is killed (-9) and started again
on the same port: the plugin adds both workers again, requests are served again, and no URL is
listed twice. Last each server gets SIGTERM (its main process, as Kubernetes sends it) and must
be gone from the router's list while its HTTP server still answers. The router's side of it is in
e2e_support/gateway.py.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import pytest
from e2e_support.deploy import Deployment, server_env, wait_http
from e2e_support.gateway import (
    DRAIN_TIMEOUT,
    LISTED_BOUND,
    checked,
    drain,
    no_duplicates,
    shown,
    wait_listed,
)
from e2e_support.lines import assert_plugin_lines
from e2e_support.scenarios import run
from e2e_support.stack import SERVE_TIMEOUT, Probe, Record
from support import process_port

pytestmark = pytest.mark.timeout(900)


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
    wait_listed(router.url, urls, SERVE_TIMEOUT)
    zero = time.monotonic()
    with Probe(router.url, zero) as probe:
        assert probe.wait_ok(LISTED_BOUND) is not None, f"not serving: {probe.samples[-3:]}"
        assert sorted(no_duplicates(router.url)) == sorted(urls)
        shown(router.url, (prefill, decode))

        router.kill()
        record.events["router killed"] = round(time.monotonic() - zero, 2)
        router = deploy.router(router_port)
        listening = router.started + wait_http(router, "/workers", 60)
        since = listening - zero
        record.events["router listening again"] = round(since, 2)
        listed = wait_listed(router.url, urls, LISTED_BOUND)
        record.figures["router_listening_to_both_listed_s"] = round(listed - listening, 2)
        first = probe.wait_ok(LISTED_BOUND, after=since)
        assert first is not None, f"not served after the restart: {probe.samples[-3:]}"
        record.figures["router_listening_to_served_s"] = round(first.done - since, 2)
        checked((prefill, decode))  # checks after the relisting: nothing is added twice
        assert sorted(no_duplicates(router.url)) == sorted(urls)
        shown(router.url, (prefill, decode))
    record.samples = [
        asdict(s) | {"t": round(s.t, 2), "done": round(s.done, 2)} for s in probe.samples
    ]
    drain(router.url, decode, record)
    drain(router.url, prefill, record)


def test_6_the_plugin_registers_with_a_restarted_router_and_drains(
    deploy: Deployment, results: Any
) -> None:
    run(results, "6", True, gateway_restart, deploy)
