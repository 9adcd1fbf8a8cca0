"""Registering within a blink of the server appearing (issue 10), proved without timing:

- refused connections are probed at a short cadence, and the startup budget still spans the
  backoff schedule (fake clock, scripted transport);
- a server restart is noticed through the idle kept-alive connection, long before a 60 s watch
  interval (real reference server on loopback);
- a server that closes every connection does not turn that into a loop of checks (counted);
- `stop()` still ends a wait on the socket.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from support import (
    FakeClock,
    Ports,
    ScriptedTransport,
    accepted,
    retry,
    route,
    settled,
    sglang_payload,
    wait_until,
)

from registrar import (
    Backoff,
    HttpSettings,
    RegisterOutcome,
    Registrar,
    Route,
    RouteCheck,
    State,
    Verdict,
)
from registrar.core._backoff import PROBE_PERIOD, probe_period
from registrar.core._decide import MAX_BROKEN_CHECKS
from registrar.protocols._http import MAX_HARMLESS_CLOSES
from registrar.protocols._sglang import SGLangTransport

REFUSED = RegisterOutcome(Verdict.RETRY, error="[Errno 111] Connection refused", refused=True)
CHECK_REFUSED = RouteCheck(
    Route.UNREACHABLE, evidence="[Errno 111] Connection refused", refused=True
)
UPSTREAM_5 = Backoff(initial=1.0, multiplier=2.0, maximum=5.0, jitter=0.25)


class Fleet(ScriptedTransport):
    """A scripted transport that says how many clients share its server."""

    def __init__(self, size: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.size = size

    def fleet_size(self, payload: Mapping[str, Any]) -> int:
        return self.size


def _start(registrars: list[Registrar], transport: Any, clock: FakeClock, **kw: Any) -> Registrar:
    reg = Registrar("http://127.0.0.1:1", {}, transport=transport, clock=clock, **kw)
    registrars.append(reg)
    return reg.start()


# ----------------------------------------------------------------- refused: probe, budget


def test_refused_attempts_are_probed_at_a_short_cadence(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = ScriptedTransport([REFUSED] * 40 + [accepted()], checks=None)
    reg = _start(registrars, transport, clock, backoff=UPSTREAM_5, max_attempts=None)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert len(transport.registered) == 41
    waits = clock.waits[:40]
    assert all(0.5 * PROBE_PERIOD <= w <= 1.5 * PROBE_PERIOD for w in waits), waits


def test_a_live_server_still_gets_the_backoff(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = ScriptedTransport([retry(503)] * 3 + [accepted()], checks=None)
    reg = _start(
        registrars, transport, clock, backoff=UPSTREAM_5, max_attempts=None, rng=lambda: 0.0
    )
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert clock.waits[:3] == [0.75, 1.5, 3.0]


def test_refused_probes_do_not_spend_the_budget_faster_than_the_backoff(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    """max_attempts counts attempts on the backoff schedule: the probes between two scheduled
    attempts are free, so five attempts still span 0.75 + 1.5 + 3 + 3.75 s at the lowest draw."""
    transport = ScriptedTransport([REFUSED], checks=None)
    reg = _start(
        registrars,
        transport,
        clock,
        backoff=UPSTREAM_5,
        max_attempts=5,
        on_failure="stop",
        rng=lambda: 0.0,
    )
    assert reg.wait_for(State.FAILED, timeout=10)
    assert wait_until(lambda: not reg.running)
    elapsed = clock.now - clock.start
    assert elapsed >= 0.75 + 1.5 + 3.0 + 3.75
    assert elapsed < 0.75 + 1.5 + 3.0 + 3.75 + 1.5 * PROBE_PERIOD
    # Many more probes than counted attempts; the status counts the budget's attempts only.
    assert len(transport.registered) > 5 * 5
    assert reg.status().attempt == 5
    assert reg.status().attempts_total == 5


def test_a_refusal_then_a_live_answer_backs_off_from_there(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = ScriptedTransport([REFUSED, REFUSED, retry(503), accepted()], checks=None)
    reg = _start(
        registrars, transport, clock, backoff=UPSTREAM_5, max_attempts=None, rng=lambda: 0.0
    )
    assert reg.wait_for(State.REGISTERED, timeout=10)
    # Probe, probe, then the live server's 503 is attempt 2 of the schedule: 1.5 s at u = 0.
    assert clock.waits[:2] == pytest.approx([0.5 * PROBE_PERIOD] * 2)
    assert clock.waits[2] == pytest.approx(1.5)


def test_a_large_fleet_probes_slower_so_its_arrival_fits_the_server(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = Fleet(1000, [REFUSED] * 5 + [accepted()], checks=None)
    reg = _start(registrars, transport, clock, backoff=UPSTREAM_5, max_attempts=None)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    period = probe_period(1000)
    assert period > PROBE_PERIOD
    assert all(0.5 * period <= w <= 1.5 * period for w in clock.waits[:5])


def test_a_refused_check_is_probed_again_soon_not_after_the_interval(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    checks = [route(Route.PRESENT), route(Route.PRESENT), CHECK_REFUSED, CHECK_REFUSED]
    checks += [route(Route.MISSING), route(Route.PRESENT)]
    transport = ScriptedTransport([accepted()], checks=checks)
    reg = _start(registrars, transport, clock, watch_interval=60.0)
    assert wait_until(lambda: reg.status().registrations == 2)
    # The first regular check after an interval, then probes, then an immediate PUT.
    waits = clock.waits
    assert waits[0] >= 30.0  # present right after the PUT, then after an interval
    assert waits[1] >= 30.0
    assert all(w <= 1.5 * PROBE_PERIOD for w in waits[2:4]), waits  # refused twice: probes
    assert len(transport.registered) == 2
    assert reg.status().reregistrations == 1


# ----------------------------------------------------------------- the idle connection


@pytest.fixture
def reference() -> Iterator[BootstrapLab]:
    srv = BootstrapLab("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("down_for", [0.0, 0.5])
def test_a_server_restart_is_noticed_on_the_idle_connection(
    reference: BootstrapLab, registrars: list[Registrar], down_for: float
) -> None:
    """A 60 s watch interval would not fire within this test: only the closed connection can
    make the registrar check, find the route gone, and register again."""
    reg = Registrar(reference.url, sglang_payload(), watch_interval=60.0)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    # The look before the first PUT, the PUT and its check.
    assert wait_until(lambda: len(reference.records()) == 3)
    reference.restart(down_for=down_for)
    assert wait_until(lambda: reg.status().registrations == 2, timeout=30)
    assert wait_until(lambda: len(reference.routes()) == 1)
    assert reference.registered_count == 1  # exactly one PUT in the new lifetime
    assert reg.status().reregistrations == 1


class _Closing(BaseHTTPRequestHandler):
    """An SGLang-like server that closes every connection: HTTP/1.0, or HTTP/1.1 that says
    keep-alive and closes anyway (a proxy with no idle keep-alive)."""

    requests: list[str]
    lock = threading.Lock()

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, body: bytes, status: int = 200) -> None:
        with self.lock:
            self.requests.append(self.command)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def do_PUT(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.payload = json.loads(self.rfile.read(length))
        self._answer(b"OK")

    def do_GET(self) -> None:
        if "PUT" not in self.requests:  # the look before the first registration
            self._answer(b"Prefill server not fully registered yet (0 workers registered).", 503)
            return
        self._answer(json.dumps({"rank_ip": "127.0.0.1", "rank_port": 20000}).encode())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", ["HTTP/1.0", "HTTP/1.1"])
def test_a_server_closing_every_connection_does_not_make_a_check_loop(
    registrars: list[Registrar], version: str
) -> None:
    handler = type("Handler", (_Closing,), {"protocol_version": version, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        reg = Registrar(url, sglang_payload(), watch_interval=60.0)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert wait_until(lambda: len(handler.requests) >= 2)
        # Let the registrar sit idle: a loop shows as a count of requests that never settles
        # (a loop driven by the server's closes sends one every few ms). The harmless-close
        # checks may come late on a loaded machine, so wait for 1.5 s without a request.
        seen = settled(lambda: len(handler.requests), quiet=1.5, timeout=20.0)
        # One PUT for this server's lifetime. A PUT sent on the connection the server was
        # closing gets no answer and is looked for again before it is sent again: what comes
        # before the PUT is looks only, at most one per attempt (how many sends a loaded
        # machine loses that way is not the point; a second PUT would be).
        assert handler.requests.count("PUT") == 1
        put_at = handler.requests.index("PUT")
        assert set(handler.requests[:put_at]) == {"GET"}
        assert 1 <= put_at <= reg.status().attempts_total
        # After the PUT: its check, and for HTTP/1.1 (watched) at most MAX_HARMLESS_CLOSES more
        # checks, after which the transport knows this server closes connections on its own.
        after_put = 1 if version == "HTTP/1.0" else 1 + MAX_HARMLESS_CLOSES
        assert seen - (put_at + 1) <= after_put
        # And that is all it ever sent: once stop() returns True its thread has ended, so the
        # count below is final, not a look a second later.
        assert reg.stop(timeout=5) is True
        assert len(handler.requests) - (put_at + 1) <= after_put
        assert handler.requests.count("PUT") == 1
        assert reg.status().registrations == 1
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.timeout(60)
def test_stop_is_prompt_while_waiting_on_the_socket(
    reference: BootstrapLab, registrars: list[Registrar]
) -> None:
    reg = Registrar(reference.url, sglang_payload(), watch_interval=3600.0)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert wait_until(lambda: len(reference.records()) == 3)  # look, PUT, check
    assert reg.stop(timeout=5)
    assert not reg.running


@pytest.mark.timeout(60)
def test_a_refused_startup_sends_the_live_server_only_its_put_and_check(
    registrars: list[Registrar], ports: Ports
) -> None:
    """Probes are bare connects: the server, once up, sees one PUT and one GET, not the
    probes, and the probe's connection is the one the PUT goes over."""
    server = BootstrapLab(sock=ports.reserve())
    try:
        reg = Registrar(server.url, sglang_payload(), watch_interval=60.0, max_attempts=None)
        registrars.append(reg)
        reg.start()
        assert wait_until(lambda: reg.status().attempts_total >= 2)
        server.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert wait_until(lambda: len(server.records()) == 2)
        assert [r.method for r in server.records()] == ["PUT", "GET"]
        assert reg.status().registrations == 1
    finally:
        server.close()


def test_max_elapsed_bounds_the_probes_too(clock: FakeClock, registrars: list[Registrar]) -> None:
    transport = ScriptedTransport([REFUSED], checks=None)
    reg = _start(
        registrars,
        transport,
        clock,
        backoff=UPSTREAM_5,
        max_attempts=None,
        max_elapsed=2.0,
        on_failure="stop",
    )
    assert reg.wait_for(State.FAILED, timeout=10)
    assert wait_until(lambda: not reg.running)
    # Probes until the next one would start past 2 s, and none after.
    assert 2.0 - 1.5 * PROBE_PERIOD <= clock.now - clock.start <= 2.0
    assert len(transport.registered) > 5


def test_a_check_whose_connection_broke_is_retried_soon_a_few_times(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    """A reset while the server goes away (its dying process accepted the connection) is a
    sign like a refusal: look again at the probe cadence, but only MAX_BROKEN_CHECKS times
    before the interval applies again."""
    broken = RouteCheck(Route.UNREACHABLE, evidence="[Errno 104] Connection reset", broken=True)
    checks = [route(Route.PRESENT), *[broken] * (MAX_BROKEN_CHECKS + 1), route(Route.PRESENT)]
    transport = ScriptedTransport([accepted()], checks=checks)
    reg = _start(registrars, transport, clock, watch_interval=60.0)
    assert wait_until(lambda: transport.checked >= MAX_BROKEN_CHECKS + 3)
    waits = clock.waits
    assert waits[0] >= 30.0  # the first regular check: broken
    soon = waits[1 : 1 + MAX_BROKEN_CHECKS]
    assert all(w <= 1.5 * PROBE_PERIOD for w in soon), waits
    assert waits[1 + MAX_BROKEN_CHECKS] >= 0.8 * 60.0  # then the interval again
    assert reg.status().registrations == 1


def test_the_sglang_fleet_is_the_topology_size() -> None:
    """The herd the SGLang transport spreads for: every rank of the topology registers with
    the same server (dp from system_dp_size when it is > 1, else attn_dp_size)."""
    transport = SGLangTransport(HttpSettings("http://127.0.0.1:1"))
    try:
        assert transport.fleet_size(sglang_payload()) == 1
        big = sglang_payload(tp_size=4, attn_dp_size=2, pp_size=2, attn_cp_size=3)
        assert transport.fleet_size(big) == 4 * 2 * 2 * 3
        system = sglang_payload(tp_size=2, attn_dp_size=2, system_dp_size=8, system_dp_rank=1)
        assert transport.fleet_size(system) == 2 * 8
    finally:
        transport.close()
