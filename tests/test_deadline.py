"""Every request ends by its deadline and reads a bounded amount, whatever the server does:
bytes trickled one at a time (in the headers, the body, the TLS handshake), endless chunked
bodies and `100 Continue` answers, compression bombs and huge error pages (tests/hostile_server.py
plays each one on 127.0.0.1)."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Iterator

import pytest
from hostile_server import (
    Behaviour,
    Conn,
    HostileServer,
    answer,
    big_page,
    bomb,
    endless_chunks,
    endless_continue,
    silence,
    trickle_body,
    trickle_headers,
)
from support import sglang_payload, wait_until

from registrar import Backoff, HttpSettings, Registrar, State
from registrar.core._transport import Route, Verdict
from registrar.protocols._deadline import DeadlineExceeded
from registrar.protocols._deadline import Watchdog as _Watchdog
from registrar.protocols._http import EXCERPT_BYTES, HttpTransport
from registrar.protocols._httpconn import ReadTimeout
from registrar.protocols._httpvalues import DEFAULT_MAX_ANSWER_BYTES
from registrar.protocols._sglang import SGLangTransport

DEADLINE = 1.0
HANG = 25.0
"""Only catches a hang, never a speed target: far past every deadline these tests arm (1 s),
yet short of the 30 s and 60 s ones they must not wait for. Which mechanism ended a request is
checked by its error; a loaded machine runs late, it does not run this late."""


@pytest.fixture
def transport_for() -> Iterator[list[HttpTransport]]:
    made: list[HttpTransport] = []
    yield made
    for transport in made:
        transport.close()


@pytest.mark.parametrize(
    "behaviour",
    [
        pytest.param(trickle_headers(0.2), id="headers-one-byte-at-a-time"),
        pytest.param(trickle_body(0.2), id="body-one-byte-at-a-time"),
        pytest.param(endless_chunks(interval=0.2, size=8), id="endless-slow-chunks"),
        pytest.param(endless_continue(0.1), id="endless-100-continue"),
        pytest.param(silence(), id="silence"),
    ],
)
def test_a_request_ends_by_its_deadline(
    behaviour: Behaviour, transport_for: list[HttpTransport]
) -> None:
    # The per-read timeout (30 s) is never reached by a server sending a byte every 0.2 s;
    # only the deadline on the whole request ends it.
    with HostileServer(behaviour) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=DEADLINE))
        transport_for.append(transport)
        started = time.monotonic()
        result = transport.send("PUT", "/route", json={"a": 1})
        elapsed = time.monotonic() - started
        outcome = transport.classify_registration(result)
    assert isinstance(result.error, DeadlineExceeded)
    assert elapsed < HANG  # a hang only (the per-read timeout, 30 s, would be later still)
    assert outcome.verdict is Verdict.RETRY
    assert outcome.error == "no complete answer within the request deadline of 1 s"
    assert not result.reconnected  # our own cut is no evidence of a server restart


def test_a_silent_server_is_reported_at_the_deadline_however_late_its_thread_is(
    transport_for: list[HttpTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A float timeout is both the request's deadline and each read's timeout, so a silent
    server reaches both together; what is reported must not depend on which one a loaded
    machine notices first. Here the deadline thread never ends the request: the read timeout
    does, after the request was due."""
    monkeypatch.setattr(_Watchdog, "expire", lambda self: None)
    with HostileServer(silence()) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=DEADLINE))
        transport_for.append(transport)
        result = transport.send("PUT", "/route", json={"a": 1})
        outcome = transport.classify_registration(result)
    assert isinstance(result.error, DeadlineExceeded)
    assert outcome.error == "no complete answer within the request deadline of 1 s"


def test_a_read_timeout_before_the_deadline_is_reported_as_such(
    transport_for: list[HttpTransport],
) -> None:
    with HostileServer(silence()) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=(30.0, 0.5)))
        transport_for.append(transport)
        result = transport.send("PUT", "/route", json={"a": 1})
        outcome = transport.classify_registration(result)
    assert isinstance(result.error, ReadTimeout)
    assert outcome.error == "no answer within the read timeout of 0.5 s"


def test_a_pair_bounds_the_whole_request_by_its_sum(transport_for: list[HttpTransport]) -> None:
    with HostileServer(trickle_headers(0.1)) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=(0.5, 0.5)))
        transport_for.append(transport)
        assert transport.deadline == 1.0
        started = time.monotonic()
        result = transport.send("GET", "/route")
    assert isinstance(result.error, DeadlineExceeded)
    assert time.monotonic() - started < HANG  # a hang only: each read alone never times out


def test_a_tls_handshake_trickled_byte_by_byte_ends_by_the_deadline(
    transport_for: list[HttpTransport],
) -> None:
    def handshake(conn: Conn) -> None:
        # A TLS record header announcing 16 KiB of handshake, then one byte every 0.2 s.
        if conn.send(b"\x16\x03\x03\x40\x00"):
            conn.drip(iter(lambda: b"\x00", None), 0.2)

    with HostileServer(greet=handshake) as server:
        transport = HttpTransport(
            HttpSettings(f"https://127.0.0.1:{server.port}", timeout=DEADLINE)
        )
        transport_for.append(transport)
        started = time.monotonic()
        result = transport.send("PUT", "/route", json={})
        outcome = transport.classify_registration(result)
    assert isinstance(result.error, DeadlineExceeded)
    assert time.monotonic() - started < HANG  # a hang only: the handshake never completes
    # A handshake cut by our deadline is not a certificate problem: retried, not fatal.
    assert outcome.verdict is Verdict.RETRY


def test_a_connection_cut_by_the_deadline_is_not_reused(
    transport_for: list[HttpTransport],
) -> None:
    with HostileServer(trickle_body(0.2), answer(200, "ok")) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=DEADLINE))
        transport_for.append(transport)
        assert isinstance(transport.send("GET", "/a").error, DeadlineExceeded)
        second = transport.send("GET", "/b")
    assert second.status_code == 200
    assert second.text == "ok"
    assert not second.reconnected
    assert server.connections == 2


def test_an_answer_read_whole_keeps_its_connection(transport_for: list[HttpTransport]) -> None:
    with HostileServer(answer(200, "a"), answer(503, "b"), answer(200, "c")) as server:
        transport = HttpTransport(HttpSettings(server.url))
        transport_for.append(transport)
        texts = [transport.send("GET", "/").text for _ in range(3)]
    assert texts == ["a", "b", "c"]
    assert server.connections == 1


@pytest.mark.parametrize(
    ("behaviour", "limit"),
    [
        pytest.param(
            endless_chunks(interval=0.001, size=4096), DEFAULT_MAX_ANSWER_BYTES, id="chunks"
        ),
        pytest.param(bomb(200, encoding="gzip"), DEFAULT_MAX_ANSWER_BYTES, id="gzip-bomb"),
        pytest.param(bomb(200, encoding="deflate"), DEFAULT_MAX_ANSWER_BYTES, id="deflate-bomb"),
        pytest.param(bomb(503), EXCERPT_BYTES, id="gzip-bomb-error"),
        pytest.param(big_page(503), EXCERPT_BYTES, id="8MB-error-page"),
        pytest.param(big_page(200), DEFAULT_MAX_ANSWER_BYTES, id="8MB-answer"),
    ],
)
def test_answers_are_read_and_decoded_up_to_a_cap(
    behaviour: Behaviour, limit: int, transport_for: list[HttpTransport]
) -> None:
    with HostileServer(behaviour, answer(200, "next")) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=30))
        transport_for.append(transport)
        gc.collect()
        tracemalloc.start()
        try:
            result = transport.send("GET", "/route")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        after = transport.send("GET", "/route")
    assert result.error is None
    assert not result.complete
    assert len(result.text.encode()) <= limit
    # 100 MB inflated or 8 MB sent: what the process holds stays near the cap.
    assert peak < 4 * DEFAULT_MAX_ANSWER_BYTES + 1024 * 1024, f"peak {peak} bytes"
    # The connection cut at the cap is closed, not reused half-read; re-opening it is ours.
    assert after.text == "next"
    assert not after.reconnected


def test_an_unknown_content_encoding_is_an_error_not_garbage(
    transport_for: list[HttpTransport],
) -> None:
    with HostileServer(answer(503, b"\x00\x01", [("Content-Encoding", "br\r")])) as server:
        transport = HttpTransport(HttpSettings(server.url))
        transport_for.append(transport)
        outcome = transport.register({"a": 1})
    assert outcome.verdict is Verdict.RETRY
    assert "unsupported Content-Encoding 'br'" in (outcome.error or "")


def test_a_route_answer_cut_at_the_cap_is_undetermined(
    transport_for: list[HttpTransport],
) -> None:
    huge = json.dumps({"rank_ip": "127.0.0.1", "rank_port": 20000, "pad": "x" * 100_000})
    with HostileServer(answer(200, huge)) as server:
        transport = SGLangTransport(HttpSettings(server.url))
        transport_for.append(transport)
        check = transport.check(sglang_payload())
    assert check.route is Route.UNDETERMINED
    assert "too large" in check.evidence


def test_stop_ends_a_request_in_flight(registrars: list) -> None:
    # A deadline of a minute is no reason for stop() to wait a minute.
    with HostileServer(trickle_headers(0.2)) as server:
        reg = Registrar(server.url, sglang_payload(), timeout=60.0)
        registrars.append(reg)
        reg.start()
        assert wait_until(lambda: len(server.requests) == 1)
        # Half the request's deadline: only a stop() that waited for the deadline misses it.
        assert reg.stop(timeout=30)
    assert not reg.running


def test_a_trickling_server_does_not_hold_the_registrar(registrars: list) -> None:
    # Attempts go on at the backoff's pace, each cut at its deadline, and the status says why.
    with HostileServer(trickle_headers(0.1), answer(200, "")) as server:
        reg = Registrar(
            server.url,
            sglang_payload(),
            protocol="http",
            timeout=0.5,
            backoff=Backoff(initial=0.05, maximum=0.1),
            watch_interval=None,
        )
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=20)
    assert reg.status().attempts_total == 2


def test_status_command_keeps_its_timeout() -> None:
    # `registrar status --timeout 1` against a health server that trickles its headers.
    with HostileServer(trickle_headers(0.2)) as server:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "registrar",
                "status",
                "--health-url",
                server.url,
                "--timeout",
                "1",
            ],
            capture_output=True,
            text=True,
            timeout=60,  # a hang only: the message below says which limit ended the request
            check=False,
        )
    assert done.returncode == 4  # the agent cannot be reached (see registrar --help)
    assert "request deadline of 1 s" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_aborted_request_says_so(transport_for: list[HttpTransport]) -> None:
    with HostileServer(trickle_headers(0.2)) as server:
        transport = HttpTransport(HttpSettings(server.url, timeout=60.0))
        transport_for.append(transport)
        timer = threading.Timer(0.5, transport.abort)
        timer.start()
        try:
            started = time.monotonic()
            result = transport.send("GET", "/route")
        finally:
            timer.join()
    assert isinstance(result.error, DeadlineExceeded)
    assert str(result.error) == "request abandoned: stopping"
    assert time.monotonic() - started < HANG  # a hang only: the 60 s deadline is not what ended it


def test_a_sooner_deadline_armed_after_a_later_one_is_kept(
    transport_for: list[HttpTransport],
) -> None:
    """One deadline thread serves every transport: a short request that starts while a long
    one is waiting must be ended at its own deadline, not the long one's. The short one is
    answered a byte at a time, so no socket read times out: only its deadline can end it."""
    with HostileServer(silence(), trickle_headers(0.05)) as server:
        slow = HttpTransport(HttpSettings(server.url, timeout=(5.0, 30.0)))
        quick = HttpTransport(HttpSettings(server.url, timeout=1.0))
        transport_for += [slow, quick]
        results: list[object] = []
        first = threading.Thread(target=lambda: results.append(slow.send("GET", "/a")))
        first.start()
        assert wait_until(lambda: server.connections >= 1)
        started = time.monotonic()
        second = quick.send("GET", "/b")
        took = time.monotonic() - started
        slow.abort()
        first.join(10)
    assert isinstance(second.error, DeadlineExceeded)
    # Not a speed target: well short of the slow request's deadline (35 s), which is when a
    # deadline thread that kept only the later deadline would have ended the quick one.
    assert took < HANG
    assert not first.is_alive()
    assert len(results) == 1


def test_one_deadline_thread_serves_every_registrar() -> None:
    with HostileServer(*[answer(200, "OK")] * 40) as server:
        regs = [Registrar(server.url, sglang_payload(port=20000 + i)) for i in range(8)]
        try:
            for reg in regs:
                reg.start()
            assert all(reg.wait_for(State.REGISTERED, timeout=20) for reg in regs)
            names = [t.name for t in threading.enumerate()]
            assert names.count("registrar-deadline") == 1
        finally:
            for reg in regs:
                reg.stop()
