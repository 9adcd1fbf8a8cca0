"""The reference server's ports: a server that is down holds its port, refusing connections,
until it is closed, so a test that restarts it (or starts it late) keeps its port under xdist."""

from __future__ import annotations

import socket

import pytest
import requests
from support import Ports

from registrar.devtools.bootstrap_server import BootstrapServer


def refused(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def taken(port: int) -> bool:
    """True when nobody else can bind the port (as a port-0 bind of another test could)."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def test_a_server_on_a_reserved_socket_refuses_until_it_starts(ports: Ports) -> None:
    server = BootstrapServer(sock=ports.reserve())
    try:
        assert refused(server.port)
        assert taken(server.port)
        server.start()
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
    finally:
        server.close()
    assert not taken(server.port)


@pytest.mark.parametrize("how", ["stop", "restart"])
def test_a_stopped_server_keeps_its_port_until_closed(how: str) -> None:
    server = BootstrapServer().start()
    port = server.port
    try:
        if how == "stop":
            server.stop()
        else:
            server.restart(down_for=0.01)
            server.stop()
        assert refused(port)
        assert taken(port)
        server.start()
        assert server.port == port
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
    finally:
        server.close()
    assert not taken(port)


def test_a_socket_without_reuseport_is_taken_over_too() -> None:
    """A plain bound socket: the server listens on it; stopped, it binds the port again."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = BootstrapServer(sock=sock).start()
    try:
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
        server.stop()
        assert refused(server.port)
        server.start()
        assert requests.get(f"{server.url}/health", timeout=5).status_code == 200
    finally:
        server.close()


def test_the_instance_id_knob_names_each_lifetime_on_every_answer() -> None:
    # Upstream PR #34289 (not in 0.5.23), behind a knob: off, no header, as 0.5.23 answers.
    header = "X-SGLang-Disaggregation-Instance-ID"
    with BootstrapServer() as plain:
        assert header not in requests.get(f"{plain.url}/health", timeout=5).headers
    with BootstrapServer(instance_id=True) as server:
        first = requests.get(f"{server.url}/health", timeout=5).headers[header]
        again = requests.get(f"{server.url}/route?prefill_dp_rank=0", timeout=5)
        assert again.status_code == 400
        assert again.headers[header] == first == server.instance_id
        server.restart()
        after = requests.get(f"{server.url}/health", timeout=5).headers[header]
    assert after != first
