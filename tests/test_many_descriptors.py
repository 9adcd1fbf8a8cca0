"""A fleet of registrars in one process holds thousands of descriptors (a connection, its
duplicate for the deadline thread, a probe, a waker pair each). Every wait of the transport
must take descriptors numbered 1024 and above, which `select()` refuses with a ValueError: that
once failed 719 of 1000 registrars in one process at their first probe, and made the check of
a kept-alive connection re-open it every time (false evidence of a restart, a PUT each)."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from support import Ports, Watched, sglang_payload, wait_until

from registrar import Registrar, State
from registrar.devtools.bootstrap_server import BootstrapServer

FILLERS = 1100


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Hold FILLERS descriptors, so every socket opened meanwhile is numbered above 1024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = FILLERS + 200
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this machine allows {hard} open descriptors per process, {need} needed")
    if soft != resource.RLIM_INFINITY and soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(FILLERS)]
    try:
        yield
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.timeout(60)
def test_probing_watching_and_reusing_above_descriptor_1024(
    high_descriptors: None, registrars: list[Registrar], ports: Ports
) -> None:
    with socket.socket() as probe:
        assert probe.fileno() > 1024
    server = BootstrapServer(sock=ports.reserve())
    transport = Watched(server.url)
    reg = Registrar(server.url, sglang_payload(), watch_interval=60.0, transport=transport)
    registrars.append(reg)
    reg.start()
    # Refused: the registrar probes with non-blocking connects meanwhile.
    assert wait_until(lambda: reg.status().attempts_total >= 1)
    with server:
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert server.registered_count == 1
        # Idle on its kept-alive connection: only the connection's close (watched with poll)
        # can bring it back before the 60 s watch interval.
        assert wait_until(transport.idle, timeout=10)
        restarted = transport.mark()
        server.restart(down_for=0.3)
        assert wait_until(lambda: reg.status().registrations == 2, timeout=10)
        assert server.registered_count == 1  # one PUT in the new lifetime
        # Back in its 60 s idle wait after the new PUT and its check: nothing more to come.
        assert wait_until(lambda: transport.idle(since=restarted), timeout=10)
        assert reg.stop(timeout=5) is True
    # One sign (the restart's close), one PUT, its check: no false evidence from poll.
    assert transport.count("sign", since=restarted) == 1, transport.events[restarted:]
    assert transport.count("PUT", since=restarted) == 1
    assert reg.status().registrations == 2
    assert not reg.thread_died


_SERVER = """
import sys
from registrar.devtools.bootstrap_server import BootstrapServer
server = BootstrapServer("127.0.0.1", 0).start()
print(server.url, flush=True)
sys.stdin.read()
server.close()
"""


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.timeout(120)
def test_at_most_two_descriptors_per_registrar(registrars: list[Registrar]) -> None:
    """Registered and idle on its kept-alive connection, a registrar holds its connection and
    its waker's descriptor: two. It held four (a duplicate of the connection for the deadline
    thread, a socket pair for the waker), and 500 registrars in one process went past the
    usual limit of 1024. The server runs in another process, so only the registrars' own
    descriptors are counted here."""
    fleet = 100
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        before = _open_descriptors()
        made = [
            Registrar(
                url,
                sglang_payload(tp_rank=i, tp_size=fleet, port=20000 + i),
                watch_interval=600.0,
            )
            for i in range(fleet)
        ]
        registrars.extend(made)
        for reg in made:
            reg.start()
        assert wait_until(lambda: all(r.status().route is not None for r in made), timeout=60)
        # Each now waits on its idle connection, which makes its waker's descriptor.
        assert wait_until(lambda: _open_descriptors() - before >= 2 * fleet, timeout=10)
        time.sleep(0.2)
        held = _open_descriptors() - before
        assert held == 2 * fleet, f"{held / fleet:.2f} descriptors per registrar"
        assert all(r.state is State.REGISTERED for r in made)
    finally:
        for reg in registrars:
            reg.stop(timeout=5)
        assert server.stdin is not None
        server.stdin.close()
        server.wait(timeout=10)
        server.stdout.close()
