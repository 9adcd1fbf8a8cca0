"""The core against real HTTP servers on 127.0.0.1."""

from __future__ import annotations

import threading

from bootstrap_lab import BootstrapLab, Fault
from support import Ports, sglang_payload, wait_until

from registrar import Backoff, Registrar, State

FAST = Backoff(initial=0.2, multiplier=2.0, maximum=1.0, jitter=0.25)


def test_server_starts_two_seconds_late(registrars: list[Registrar], ports: Ports) -> None:
    server = BootstrapLab(sock=ports.reserve())
    reg = Registrar(
        server.url, sglang_payload(), backoff=FAST, max_attempts=None, watch_interval=None
    )
    registrars.append(reg)
    reg.start()
    starter = threading.Timer(2.0, server.start)
    starter.start()
    try:
        assert reg.wait_for(State.REGISTERED, timeout=15)
        status = reg.status()
        assert status.attempts_total >= 2
        assert status.registrations == 1
        assert server.routes() == {(0, 0, 0, 0): {"rank_ip": "127.0.0.1", "rank_port": 20000}}
    finally:
        starter.cancel()
        starter.join()
        server.close()


def test_refused_attempts_log_the_root_cause(
    registrars: list[Registrar], caplog, ports: Ports
) -> None:
    reg = Registrar(
        ports.refusing_url(),
        sglang_payload(),
        backoff=FAST,
        max_attempts=2,
        on_failure="stop",
        watch_interval=None,
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=10)
    assert reg.status().last_error == "[Errno 111] Connection refused"
    assert "Max retries" not in caplog.text
    assert "[Errno 111] Connection refused" in caplog.text


def test_503_then_200(server: BootstrapLab, registrars: list[Registrar]) -> None:
    server.fail_next(1, 503, body="warming up", method="PUT")
    reg = Registrar(server.url, sglang_payload(), backoff=FAST, watch_interval=None)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert reg.status().attempts_total == 2
    assert [r.status for r in server.records() if r.method == "PUT"] == [503, 200]


def test_server_that_never_answers_times_out_then_succeeds(
    server: BootstrapLab, registrars: list[Registrar], caplog
) -> None:
    server.inject(Fault("hang", method="PUT"))
    reg = Registrar(
        server.url, sglang_payload(), backoff=FAST, timeout=(1.0, 0.5), watch_interval=None
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert reg.status().attempts_total == 2
    assert "no answer within the read timeout of 0.5 s" in caplog.text


def test_stop_with_request_in_flight_returns_within_timeout(
    server: BootstrapLab, registrars: list[Registrar]
) -> None:
    server.inject(Fault("hang", method="PUT"))
    reg = Registrar(server.url, sglang_payload(), timeout=(1.0, 1.0), watch_interval=None)
    registrars.append(reg)
    reg.start()
    # The server took the PUT: the fault is spent when a request starts, and it hangs there.
    assert wait_until(lambda: server.pending_faults == 0, timeout=10)
    assert reg.stop(timeout=5) is True
    assert reg.state is State.STOPPED
    # True means the thread has ended: nothing can be sent from now on. The hung PUT is
    # recorded once the server lets it go; it is the only request there ever was.
    assert not reg.running
    server.stop()
    assert wait_until(lambda: any(r.method == "PUT" for r in server.records()), timeout=10)
    # The look before it (the server not ready yet) and the PUT: nothing else, ever.
    assert [(r.method, r.status) for r in server.records()] == [("GET", 503), ("PUT", None)]
