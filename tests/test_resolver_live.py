"""Name resolution inside the deadline, in this process: `socket.getaddrinfo` made to hang for
one test name (the issue's reproduction), everything else real (urllib3, sockets, the
reference bootstrap server, the smg gateway). The faults met by glibc's own resolver are in
tests/test_resolver_netns.py."""

from __future__ import annotations

import argparse
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from smg_support import Gateway, gateway_binary, workers
from support import lookups_in_flight, sglang_payload, wait_until

from registrar import HttpSettings, HttpTransport, Registrar, State, smg_registrar
from registrar.core._backoff import Backoff
from registrar.integrations.sglang._rows import rank_summary
from registrar.protocols._resolver import FRESH, RESOLVER
from registrar.surfaces.cli import EXIT_NOT_REGISTERED
from registrar.surfaces.cli._status import cmd_status
from registrar.surfaces.health import render_health, start_health_server

HANG = 30.0
"""Only catches a hang, never a speed target."""


class Names:
    """`getaddrinfo` for `*.hang.test`: the address in `answers`, or a wait of up to 12 s
    (the issue's) while `stalled`; every other name goes to the real one."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.moving = threading.Event()
        self.moving.set()
        self.real = socket.getaddrinfo

    def __call__(self, host: Any, *args: Any, **kw: Any) -> Any:
        if not (isinstance(host, str) and host.endswith(".hang.test")):
            return self.real(host, *args, **kw)
        self.moving.wait(12.0)
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        port = args[0] if args and args[0] is not None else 0
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.answers[host], port))]

    def stall(self) -> None:
        self.moving.clear()

    def resume(self) -> None:
        self.moving.set()


@pytest.fixture
def names(monkeypatch: pytest.MonkeyPatch) -> Iterator[Names]:
    made = Names()
    monkeypatch.setattr(socket, "getaddrinfo", made)
    try:
        yield made
    finally:
        made.resume()  # the lookups in flight end
        assert wait_until(lambda: lookups_in_flight(RESOLVER) == 0, timeout=HANG)


def test_a_stalled_lookup_is_a_failed_attempt_and_stop_holds_its_bound(
    names: Names, capsys: pytest.CaptureFixture[str]
) -> None:
    names.stall()
    reg = Registrar("http://bootstrap.hang.test:8998", sglang_payload(), timeout=1.0)
    reg.start()
    try:
        assert wait_until(lambda: reg.status().attempts_total >= 1, timeout=HANG)
        status = reg.status()
        assert status.last_error == "could not resolve bootstrap.hang.test within 1.0 s"
        assert status.retrying
        assert status.server_reachable is False
        assert wait_until(lambda: reg.status().resolution is not None, timeout=HANG)
        resolution = reg.status().resolution
        assert resolution is not None
        assert resolution.startswith("resolving bootstrap.hang.test (no answer for ")
        # The health document says so (an operator tells a stalled resolver from a silent
        # server), and so does /server_info's registrar summary.
        _, document = render_health(reg.status())
        entry = document["checks"]["registration:state"][0]
        assert entry["resolution"].startswith("resolving bootstrap.hang.test")
        manager = SimpleNamespace(_registrar_rows={("url", (0, 0, 0, 0)): reg})
        row = rank_summary(manager)["rows"][0]
        assert row["resolution"].startswith("resolving bootstrap.hang.test")
        # `registrar status` shows it to a person too.
        health = start_health_server(reg, port=0)
        try:
            args = argparse.Namespace(health_url=health.url, timeout=5.0, json=False)
            assert cmd_status(args) == EXIT_NOT_REGISTERED
        finally:
            health.stop()
        shown = capsys.readouterr().out
        assert "resolver:     resolving bootstrap.hang.test (no answer for " in shown
    finally:
        started = time.monotonic()
        ended = reg.stop(timeout=5.0)
        took = time.monotonic() - started
    assert ended
    assert took < 5.0  # its documented bound, whatever the resolver does


def test_an_ip_literal_is_never_looked_up(names: Names) -> None:
    names.stall()  # any lookup would hang; a literal needs none
    assert RESOLVER.resolve("127.0.0.1", 80, 0.01).hosts == {"127.0.0.1"}


@pytest.mark.timeout(240)
def test_the_drain_holds_its_bound_on_the_last_good_address(names: Names, tmp_path: Path) -> None:
    gateway_binary()
    gateway = Gateway(tmp_path / "gw").start()
    try:
        names.answers["gateway.hang.test"] = "127.0.0.1"
        with workers(1) as (worker,):
            reg = smg_registrar(
                f"http://gateway.hang.test:{gateway.port}",
                worker.url,
                worker.worker_type,
                timeout=1.0,
                drain_timeout=10.0,  # the gateway removes a worker 5 s after its DELETE
                backoff=Backoff(initial=0.2, maximum=1.0),
                max_attempts=None,
            ).start()
            assert reg.wait_for(State.REGISTERED, HANG)
            names.stall()
            time.sleep(2 * FRESH)  # the next request asks the resolver, which stalls
            started = time.monotonic()
            assert reg.stop(timeout=30.0)
            took = time.monotonic() - started
            assert gateway.workers() == []  # the DELETE went to the last good address
            assert took < 30.0
    finally:
        gateway.kill()


def test_moves_are_counted_once_per_move(names: Names, servers: Callable[..., Any]) -> None:
    """The HTTP transport's evidence: a request whose name moved reports itself reconnected."""
    first = servers("127.0.0.2")
    second = servers("127.0.0.3", first.port)
    names.answers["moved.hang.test"] = "127.0.0.2"
    http = HttpTransport(HttpSettings(f"http://moved.hang.test:{first.port}", timeout=2.0))
    try:
        assert not http.send("PUT", "/route", json=sglang_payload()).reconnected
        names.answers["moved.hang.test"] = "127.0.0.3"
        time.sleep(FRESH)
        moved = http.send("GET", "/route?engine_rank=0")
        assert moved.reconnected
        assert not http.send("GET", "/route?engine_rank=0").reconnected
    finally:
        http.close()
    assert [r.method for r in first.records()] == ["PUT"]
    assert [r.method for r in second.records()] == ["GET", "GET"]


@pytest.fixture
def servers() -> Iterator[Callable[..., Any]]:
    made: list[BootstrapLab] = []

    def make(host: str, port: int = 0) -> BootstrapLab:
        server = BootstrapLab(host, port).start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.close()
