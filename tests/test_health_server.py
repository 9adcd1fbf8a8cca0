"""The health server under probes, over real sockets: many simultaneous probes are answered,
idle and half-sent connections neither pin threads nor keep a fresh probe out, and the number
of threads stays fixed."""

from __future__ import annotations

import contextlib
import resource
import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from support import FakeClock, ScriptedTransport, accepted, wait_until

from registrar import Registrar, State
from registrar.surfaces._httpserver import HEAD_TIMEOUT, MAX_PENDING, WORKERS
from registrar.surfaces.health import HealthServer, start_health_server


def demo_registrar(registrars: list[Registrar]) -> Registrar:
    """A registrar that registers at its first attempt and never checks again (not started)."""
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"service": "demo"},
        transport=ScriptedTransport([accepted()]),
        clock=FakeClock(),
        watch_interval=None,
    )
    registrars.append(reg)
    return reg


@pytest.fixture
def health(registrars: list[Registrar]) -> Iterator[HealthServer]:
    reg = demo_registrar(registrars)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    server = start_health_server(reg, metrics=False)
    try:
        yield server
    finally:
        server.stop()


def probe(port: int, path: str = "/readyz", timeout: float = 10.0) -> tuple[int, float, int]:
    """One request on a new connection, as a kubelet sends it: (status code, seconds, segments
    the client had to send again)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
        resent = retransmitted(sock)
    took = time.monotonic() - started
    return int(answer.split(b" ", 2)[1]), took, resent


def retransmitted(sock: socket.socket) -> int:
    """The connection's `tcpi_total_retrans` (Linux `struct tcp_info`, the u32 at byte 100): on
    loopback nothing is lost, so a segment sent again means the listener dropped it (its
    backlog was full: a SYN or the handshake's last ACK dropped, resent after 1 s or more)."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("I", info, 100)[0])


@contextlib.contextmanager
def open_sockets(port: int, count: int, send: bytes = b"") -> Iterator[list[socket.socket]]:
    socks: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            if send:
                sock.sendall(send)
            socks.append(sock)
        yield socks
    finally:
        for sock in socks:
            sock.close()


def health_threads(port: int) -> list[str]:
    """The threads of the health server on `port`."""
    name = f"registrar-health-{port}"
    return [t.name for t in threading.enumerate() if t.name.split("-")[:3] == name.split("-")]


def test_200_simultaneous_probes_are_all_answered(
    health: HealthServer, record_property: pytest.RecordProperty
) -> None:
    barrier = threading.Barrier(200)
    results: list[tuple[int, float]] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(10)
            results.append(probe(health.port))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(200)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert [code for code, _, _ in results] == [200] * 200
    took = sorted(t for _, t, _ in results)
    figures = (
        f"health server: 200 simultaneous /readyz on new connections, all 200 OK; "
        f"median {statistics.median(took) * 1000:.0f} ms, slowest {took[-1] * 1000:.0f} ms"
    )
    record_property("figures", figures)
    # The backlog held them all: not one connection had a segment dropped and sent again (a
    # count, not a time; the times above are reported, a loaded machine only makes them longer).
    assert [resent for _, _, resent in results] == [0] * 200


def test_idle_and_half_sent_connections_do_not_keep_a_probe_out(health: HealthServer) -> None:
    before = health_threads(health.port)
    with (
        open_sockets(health.port, 300) as idle,
        open_sockets(health.port, 100, b"GET /readyz HTTP/1.1\r\nHost: x\r\n") as half,
    ):
        code, _, _ = probe(health.port, timeout=5)
        assert code == 200
        # No thread per connection: the reader and the fixed pool, nothing more.
        assert health_threads(health.port) == before
        assert len(before) == 1 + WORKERS
        # Each of them is closed by the server (an end of stream, or a reset), which only its
        # head deadline does. The socket timeout only catches a server that never closes them
        # (a hang, not a speed target): a deadline missed by 30 s is no matter of load.
        for sock in (idle[0], idle[-1], half[0], half[-1]):
            sock.settimeout(HEAD_TIMEOUT + 30)
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(100) == b""
    assert probe(health.port)[0] == 200


def test_more_open_connections_than_the_cap_still_let_a_probe_in(health: HealthServer) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = 2 * (MAX_PENDING + 200) + 100
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            pytest.skip(f"needs {needed} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    try:
        with open_sockets(health.port, MAX_PENDING + 200):
            code, _, _ = probe(health.port, timeout=5)
            assert code == 200
            assert len(health_threads(health.port)) == 1 + WORKERS
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_an_oversized_request_head_is_refused(health: HealthServer) -> None:
    with socket.create_connection(("127.0.0.1", health.port), timeout=10) as sock:
        sock.sendall(b"GET /readyz HTTP/1.1\r\n" + b"X-Filler: " + b"a" * 40_000 + b"\r\n")
        answer = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                answer += chunk
    assert answer.startswith(b"HTTP/1.0 431")
    assert probe(health.port)[0] == 200


def test_stop_closes_open_connections_and_ends_the_threads(
    registrars: list[Registrar],
) -> None:
    reg = demo_registrar(registrars)
    server = start_health_server(reg, metrics=False)
    with open_sockets(server.port, 20) as idle:
        server.stop()
        assert wait_until(lambda: health_threads(server.port) == [], timeout=10)
        idle[0].settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            assert idle[0].recv(10) == b""
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2)


def test_the_log_line_names_an_ipv6_address_in_brackets(
    registrars: list[Registrar], caplog: pytest.LogCaptureFixture
) -> None:
    reg = demo_registrar(registrars)
    with caplog.at_level("INFO", logger="registrar"):
        server = start_health_server(reg, host="::1", metrics=False)
    try:
        line = f"health endpoints on http://[::1]:{server.port} (/livez /readyz /health)"
        assert line in caplog.messages
        socket.create_connection(("::1", server.port), timeout=5).close()
    finally:
        server.stop()
