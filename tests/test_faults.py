"""The fault matrix: each fault against the reference bootstrap server over real HTTP. Each
case ends REGISTERED (or FAILED exactly as the policy says), with attempts counted right and the
thread alive."""

from __future__ import annotations

import socket
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from bootstrap_lab import BootstrapLab, Fault
from support import Ports, sglang_payload, wait_until

from registrar import Backoff, Registrar, State

FAST = Backoff(initial=0.05, multiplier=2.0, maximum=0.4, jitter=0.25)


def start(registrars: list, url: str, **kwargs: object) -> Registrar:
    kwargs.setdefault("backoff", FAST)
    kwargs.setdefault("watch_interval", 0.2)
    reg = Registrar(url, sglang_payload(), **kwargs)  # type: ignore[arg-type]
    registrars.append(reg)
    return reg.start()


def puts(server: BootstrapLab) -> list[int | None]:
    return [r.status for r in server.records() if r.method == "PUT"]


def registered(reg: Registrar, attempts: int) -> None:
    assert reg.wait_for(State.REGISTERED, timeout=15)
    assert reg.status().attempts_total == attempts
    assert reg.running
    assert not reg.thread_died


def test_refused_until_the_server_listens(registrars: list, ports: Ports) -> None:
    server = BootstrapLab(sock=ports.reserve())
    try:
        reg = start(registrars, server.url, max_attempts=None)
        assert wait_until(lambda: reg.status().attempts_total >= 3)
        server.start()
        assert reg.wait_for(State.REGISTERED, timeout=15)
        assert puts(server) == [200]
        assert reg.status().registrations == 1
        assert reg.running
    finally:
        server.close()


def test_refused_with_stop_policy_fails_exactly(registrars: list, ports: Ports) -> None:
    reg = start(registrars, ports.refusing_url(), max_attempts=3, on_failure="stop")
    assert reg.wait_for(State.FAILED, timeout=15)
    assert wait_until(lambda: not reg.running)
    status = reg.status()
    assert status.attempts_total == 3
    assert status.last_error == "[Errno 111] Connection refused"
    assert not status.retrying
    assert not reg.thread_died


@pytest.mark.parametrize("kind", ["reset", "drop"])
def test_connection_cut_mid_answer(server: BootstrapLab, registrars: list, kind: str) -> None:
    server.inject(Fault(kind, method="PUT"))
    reg = start(registrars, server.url)
    registered(reg, 2)
    assert puts(server) == [None, 200]


def test_server_that_never_answers(
    server: BootstrapLab, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    server.inject(Fault("hang", count=2, method="PUT"))
    reg = start(registrars, server.url, timeout=(1.0, 0.3))
    registered(reg, 3)
    assert caplog.text.count("no answer within the read timeout of 0.3 s") == 2
    assert puts(server)[-1] == 200


@pytest.mark.parametrize(("delay", "attempts"), [(0.4, 1), (1.5, 2)], ids=["under", "over"])
def test_answers_around_the_timeout(
    server: BootstrapLab, registrars: list, delay: float, attempts: int
) -> None:
    server.inject(Fault("delay", seconds=delay, method="PUT"))
    reg = start(registrars, server.url, timeout=(1.0, 1.0))
    registered(reg, attempts)


@pytest.mark.parametrize("code", [500, 502, 503, 504])
def test_bursts_of_server_errors(server: BootstrapLab, registrars: list, code: int) -> None:
    server.fail_next(4, code, method="PUT")
    reg = start(registrars, server.url)
    registered(reg, 5)
    assert puts(server) == [code] * 4 + [200]


def test_burst_longer_than_the_budget_with_stop(server: BootstrapLab, registrars: list) -> None:
    server.fail_next(10, 503, method="PUT")
    reg = start(registrars, server.url, max_attempts=4, on_failure="stop")
    assert reg.wait_for(State.FAILED, timeout=15)
    assert wait_until(lambda: not reg.running)
    assert reg.status().attempts_total == 4
    assert puts(server) == [503] * 4


def _http_date(seconds_ahead: float) -> str:
    return format_datetime(datetime.now(UTC) + timedelta(seconds=seconds_ahead), usegmt=True)


@pytest.mark.parametrize("code", [429, 503])
@pytest.mark.parametrize("form", ["seconds", "http-date"])
def test_retry_after_is_honoured(
    server: BootstrapLab, registrars: list, code: int, form: str
) -> None:
    value = "1" if form == "seconds" else _http_date(2.0)
    server.fail_next(1, code, retry_after=value, method="PUT")
    reg = start(registrars, server.url, backoff=Backoff(initial=0.05, maximum=5.0))
    registered(reg, 2)
    first, second = [r.at for r in server.records() if r.method == "PUT"]
    # The backoff alone would have waited about 0.05 s.
    assert second - first >= 0.9


def test_retry_after_is_capped_by_max_retry_after(server: BootstrapLab, registrars: list) -> None:
    server.fail_next(1, 503, retry_after="3600", method="PUT")
    reg = start(
        registrars, server.url, backoff=Backoff(initial=0.05, maximum=0.1), max_retry_after=1.0
    )
    registered(reg, 2)
    first, second = [r.at for r in server.records() if r.method == "PUT"]
    assert second - first >= 0.9  # past the backoff's maximum, up to the cap


def test_html_error_page(server: BootstrapLab, registrars: list) -> None:
    page = "<html><body><h1>502 Bad Gateway</h1>\n<p>upstream  gone</p></body></html>"
    server.fail_next(1, 502, body=page, content_type="text/html", method="PUT")
    reg = start(registrars, server.url, max_attempts=1, on_failure="stop")
    assert reg.wait_for(State.FAILED, timeout=15)
    error = reg.status().last_error or ""
    assert error.startswith(f"502 Bad Gateway from {server.url}/route: <html>")
    assert "\n" not in error


def test_unparseable_route_check_is_not_a_reason_to_register_again(
    server: BootstrapLab, registrars: list
) -> None:
    reg = start(registrars, server.url)
    registered(reg, 1)
    server.fail_next(3, 200, body="}{ not json", method="GET")
    assert wait_until(lambda: reg.status().route == "undetermined")
    assert wait_until(lambda: reg.status().route == "present")
    assert puts(server) == [200]
    assert server.registered_count == 1


def test_unresolvable_host(registrars: list, monkeypatch: pytest.MonkeyPatch) -> None:
    # The name service is faked for *.invalid alone, so no DNS query leaves this machine;
    # requests, urllib3 and the sockets run for real.
    real = socket.getaddrinfo

    def getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if isinstance(host, str) and host.endswith(".invalid"):
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    reg = start(registrars, "http://bootstrap.invalid:8998", max_attempts=2, on_failure="stop")
    assert reg.wait_for(State.FAILED, timeout=15)
    assert wait_until(lambda: not reg.running)
    assert reg.status().attempts_total == 2
    error = "could not resolve bootstrap.invalid: [Errno -2] Name or service not known"
    assert reg.status().last_error == error


def test_restarts_in_a_row(server: BootstrapLab, registrars: list) -> None:
    reg = start(registrars, server.url, watch_interval=0.1)
    registered(reg, 1)
    for round_ in range(2, 6):
        server.restart(down_for=0.0 if round_ % 2 else 0.3)
        assert wait_until(lambda: reg.status().registrations == round_), round_  # noqa: B023
    status = reg.status()
    assert status.reregistrations == 4
    assert server.registered_count == 1
    assert reg.running


def test_restart_during_startup_backoff(server: BootstrapLab, registrars: list) -> None:
    server.fail_next(2, 503, method="PUT")
    reg = start(registrars, server.url)
    # The first PUT has met its 503 (a fault is spent as its request starts): the restart comes
    # during the startup backoff.
    assert wait_until(lambda: server.pending_faults <= 1)
    server.restart()
    assert reg.wait_for(State.REGISTERED, timeout=15)
    assert wait_until(lambda: server.registered_count == 1 and server.ready)
