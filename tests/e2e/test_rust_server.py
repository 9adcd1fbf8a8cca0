"""Scenario 8: SGLang's Rust-server mode (`SGLANG_RUST_SERVER=1`, 0.5.23) with the plugin in
prefill and decode (docs/e2e.md, docs/sglang.md "SGLang's Rust-server mode").

The Rust server inside rank 0's scheduler serves the API and the bootstrap registry on the
prefill's `--port` (the router gets that port as the bootstrap port); there is no Python HTTP
server or tokenizer manager. The plugin must register the rank with one accepted PUT, name in
its active line what it cannot run there (`/ready`, `/server_info`'s registrar fields and rank
rows, the gateway, the drain) and install none of it, serve a relaunched prefill again, and with
`REGISTRAR_STRICT=1` refuse to start with that list.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import pytest
import requests
from e2e_support.deploy import PD_FLAGS, Deployment, Process, server_env, wait_http
from e2e_support.lines import ACTIVE, assert_plugin_lines
from e2e_support.scenarios import RECOVER_BOUND, run
from e2e_support.stack import SERVE_TIMEOUT, Probe, Record
from support import process_port

from registrar.integrations.sglang._targets import RUST_SERVER, installed_version, parse_release

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        (parse_release(installed_version()) or RUST_SERVER) < RUST_SERVER,
        reason="SGLang has PD in its Rust-server mode from 0.5.23",
    ),
]

RUST = {"SGLANG_RUST_SERVER": "1"}
NOT_THERE = ("ready", "rank status", "server status", "gateway", "drain")
ACCEPTED = "registration: accepted (200)"  # REGISTRAR_VERBOSE=1's line per accepted PUT


def _prefill(deploy: Deployment, port: int, **extra: str) -> Process:
    flags = [*PD_FLAGS, "--disaggregation-mode", "prefill", "--disable-overlap-schedule"]
    env = server_env(plugin=True, REGISTRAR_VERBOSE="1", **RUST, **extra)
    return deploy.sglang("prefill", port, flags, env)


def _says_what_does_not_run(server: Process) -> None:
    """Each active line names the five features the mode loses, and counts the three left."""
    lines = [line for line in server.text().splitlines() if ACTIVE.search(line)]
    for line in lines:
        lost = line.split("; not with SGLANG_RUST_SERVER=1: ", 1)[1]
        assert [part.split(" (", 1)[0] for part in lost.split("; ")] == list(NOT_THERE), line
        assert "3 of 3 targets" in line, line


def _registered_once(prefill: Process) -> None:
    """One accepted PUT, no failed attempt: the registry listens before the rank registers."""
    deadline = time.monotonic() + 60
    while prefill.text().count(ACCEPTED) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    text = prefill.text()
    assert text.count(ACCEPTED) == 1, prefill.tail()
    assert "registration attempt" not in text, prefill.tail()


def rust_server(deploy: Deployment, record: Record) -> None:
    prefill_port, decode_port = process_port(), process_port()
    decode = deploy.decode(decode_port, server_env(plugin=True, **RUST))
    prefill = _prefill(deploy, prefill_port)
    for server in (prefill, decode):
        wait_http(server, "/health", SERVE_TIMEOUT)
    for server in (prefill, decode):
        assert_plugin_lines(server, plugin=True, rows=1 if server is prefill else 0)
        _says_what_does_not_run(server)
    _registered_once(prefill)
    # What the line says is not there, is not there: SGLang's Rust server answers both.
    assert requests.get(f"{prefill.url}/ready", timeout=10).status_code == 404
    info = requests.get(f"{prefill.url}/server_info", timeout=30).json()
    assert "registrar_bootstrap" not in info
    ranks = [state.get("registrar") for state in info.get("internal_states") or []]
    assert not any(ranks), ranks
    states = len(info.get("internal_states") or [])
    record.notes.append(f"/server_info: {states} internal states, none with `registrar`")
    router = deploy.router(process_port(), (prefill.url, prefill_port, decode.url))
    wait_http(router, "/readiness", 120)
    zero = time.monotonic()
    with Probe(router.url, zero) as probe:
        first = probe.wait_ok(RECOVER_BOUND)
        assert first is not None, f"not served: {probe.samples[-3:]}"
        record.figures["router ready to first success (s)"] = round(first.done, 2)
        prefill.kill()
        killed = time.monotonic() - zero
        record.events["prefill killed"] = round(killed, 2)
        prefill = _prefill(deploy, prefill_port)
        up = prefill.started + wait_http(prefill, "/health", SERVE_TIMEOUT) - zero
        record.events["prefill up again"] = round(up, 2)
        assert_plugin_lines(prefill, plugin=True, rows=1)
        _registered_once(prefill)
        again = probe.wait_ok(RECOVER_BOUND, after=up)
        assert again is not None, f"not served after the relaunch: {probe.samples[-3:]}"
        record.figures["prefill /health to first success (s)"] = round(again.done - up, 2)
    record.samples = [asdict(s) for s in probe.samples]
    # REGISTRAR_STRICT=1 refuses the mode at load, naming what would not run.
    strict = _prefill(deploy, process_port(), REGISTRAR_STRICT="1")
    assert strict.proc.wait(SERVE_TIMEOUT) != 0
    assert "cannot run with SGLANG_RUST_SERVER=1: ready (" in strict.text(), strict.tail()
    assert "REGISTRAR_STRICT=1: stopping" in strict.text()


def test_8_rust_server_mode_registers_says_what_it_cannot_and_strict_refuses(
    deploy: Deployment, results: Any
) -> None:
    run(results, "8", True, rust_server, deploy)
