"""No answer ends the loop: hostile Retry-After values, route answers of any shape, a CA bundle
that vanished, and even a transport that breaks its contract each become a failed attempt or an
undetermined check with a clear error, and the thread goes on (hostile server on 127.0.0.1)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest
from hostile_server import HostileServer, answer
from hypothesis import given
from hypothesis import strategies as st
from support import ScriptedTransport, accepted, route, sglang_payload, wait_until

from registrar import Backoff, HttpSettings, Registrar, State
from registrar.core._runner import UNEXPECTED
from registrar.core._transport import Route
from registrar.protocols._httpvalues import RETRY_AFTER_CEILING, parse_retry_after
from registrar.protocols._sglang import SGLangTransport

NOW = 1_800_000_000.0
FAST = Backoff(initial=0.05, maximum=0.1)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("30", 30.0),
        (" \t30 ", 30.0),
        ("0", 0.0),
        ("\u00b2", None),  # str.isdigit() says yes, float() says no
        ("\u0663", None),  # an Arabic-Indic three: not ASCII
        ("1e3", None),
        ("-5", None),
        ("30s", None),
        ("3 0", None),
        ("", None),
        ("9" * 5000, RETRY_AFTER_CEILING),  # int() refuses over 4300 digits
        ("Fri, 31 Dec 99999 23:59:59 GMT", None),  # a year no calendar function accepts
        ("Fri, 31 Dec 9999 23:59:59 GMT", RETRY_AFTER_CEILING),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),  # in the past: now
        ("Wed, 15 Jan 2027 08:00:30 GMT", 30.0),
        ("not a date", None),
    ],
)
def test_retry_after_is_parsed_as_urllib3_does(value: str, expected: float | None) -> None:
    now = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC
    assert parse_retry_after(value, now) == expected


@given(st.text(max_size=60))
def test_no_retry_after_raises(value: str) -> None:
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or 0 <= seconds <= RETRY_AFTER_CEILING


@pytest.mark.parametrize("value", ["\u00b2", "Fri, 31 Dec 99999 23:59:59 GMT", "9" * 5000])
def test_a_hostile_retry_after_is_a_failed_attempt(registrars: list, value: str) -> None:
    with HostileServer(answer(429, "slow down", [("Retry-After", value)]), answer(200, "")) as srv:
        reg = Registrar(
            srv.url,
            sglang_payload(),
            protocol="http",
            backoff=FAST,
            max_retry_after=0.5,
            watch_interval=None,
        )
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
    assert reg.status().attempts_total == 2
    assert not reg.thread_died


def test_a_long_retry_after_waits_past_the_backoff_maximum(registrars: list) -> None:
    # A 429 asking for 2 s is not retried after the backoff's 0.1 s.
    with HostileServer(answer(429, "", [("Retry-After", "2")]), answer(200, "")) as server:
        reg = Registrar(
            server.url, sglang_payload(), protocol="http", backoff=FAST, watch_interval=None
        )
        registrars.append(reg)
        started = time.monotonic()
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=20)
    assert time.monotonic() - started >= 1.9


@pytest.mark.parametrize(
    "body",
    [
        '{"rank_ip": "127.0.0.1", "rank_port": 1e999}',
        '{"rank_ip": "127.0.0.1", "rank_port": 20000.5}',
        '{"rank_ip": "127.0.0.1", "rank_port": true}',
        '{"rank_ip": ["127.0.0.1"], "rank_port": 20000}',
        '{"rank_ip": "127.0.0.1", "rank_port": ' + "9" * 5000 + "}",
        "[null]",
        "null",
        '"text"',
        "[" * 60_000 + "]" * 60_000,  # nested 60 000 deep, within the read cap
        "[" * 100_000,  # 100 000 deep, over the cap
        '{"rank_ip": "127.0.0.1", "rank_port": 20000',
        b"\xff\xfe\x00garbage".decode("latin-1"),
    ],
    ids=lambda body: body[:40],
)
def test_a_route_answer_of_any_shape_is_undetermined(body: str) -> None:
    with HostileServer(answer(200, body.encode("latin-1", "replace"))) as server:
        transport = SGLangTransport(HttpSettings(server.url))
        try:
            check = transport.check(sglang_payload())
        finally:
            transport.close()
    assert check.route is Route.UNDETERMINED
    assert "\n" not in check.evidence
    assert len(check.evidence) < 1_000


def test_hostile_route_answers_leave_the_registrar_registered(registrars: list) -> None:
    answers = [
        '{"rank_ip": "127.0.0.1", "rank_port": 1e999}',
        "[" * 60_000 + "]" * 60_000,
        "[null]",
    ]
    with HostileServer(answer(200, ""), *(answer(200, a) for a in answers)) as server:
        reg = Registrar(server.url, sglang_payload(), backoff=FAST, watch_interval=0.05)
        registrars.append(reg)
        reg.start()
        assert wait_until(lambda: len(server.requests) >= 6, timeout=10)
        assert reg.state is State.REGISTERED
        assert reg.running
        # Read while the server is up: closing it ends the idle connection, and the check that
        # follows at once finds nothing listening.
        route_seen = reg.status().route
    assert [r.method for r in server.requests].count("PUT") == 1
    assert route_seen == "undetermined"


def test_a_ca_bundle_deleted_after_construction_is_a_failed_attempt(
    registrars: list, tmp_path: Path
) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("not really a certificate\n")
    with HostileServer(answer(200, "")) as server:
        reg = Registrar(
            f"https://127.0.0.1:{server.port}",
            sglang_payload(),
            verify=str(bundle),
            backoff=FAST,
            max_attempts=2,
            on_failure="stop",
        )
        registrars.append(reg)
        bundle.unlink()
        reg.start()
        assert reg.wait_for(State.FAILED, timeout=10)
    status = reg.status()
    assert status.attempts_total == 2
    assert "CA certificate bundle" in (status.last_error or "")
    assert not reg.thread_died


class Raising(ScriptedTransport):
    """Breaks the transport contract: raises on the first `times` calls."""

    def __init__(self, times: int, **kwargs: Any) -> None:
        super().__init__([accepted()], **kwargs)
        self.times = times

    def register(self, payload: Any) -> Any:
        if self.times > 0:
            self.times -= 1
            raise RuntimeError("a transport bug with a secret: Bearer s3cr3t")
        return super().register(payload)

    def check(self, payload: Any) -> Any:
        if self.checks is not None and self.times > 0:
            self.times -= 1
            raise KeyError("check bug")
        return super().check(payload)


@pytest.mark.unexpected_errors
def test_a_transport_that_raises_is_a_failed_attempt_logged_once(
    registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="registrar")
    seen: list[str | None] = []
    reg = Registrar(
        "http://127.0.0.1:8998",
        sglang_payload(),
        transport=Raising(3),
        backoff=FAST,
        watch_interval=None,
    )
    reg.add_listener(lambda old, new, status: seen.append(status.last_error))
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert reg.status().attempts_total == 4
    marked = [r for r in caplog.records if getattr(r, UNEXPECTED, False)]
    assert len(marked) == 1  # once, with its traceback
    assert marked[0].exc_info is not None
    failures = [r.getMessage() for r in caplog.records if "attempt" in r.getMessage()]
    assert any("unexpected RuntimeError in the transport's register" in m for m in failures)
    assert "s3cr3t" not in json.dumps([r.getMessage() for r in caplog.records])


@pytest.mark.unexpected_errors
def test_a_check_that_raises_is_undetermined(registrars: list) -> None:
    transport = Raising(0, checks=[route(Route.PRESENT)])
    transport.times = 0
    reg = Registrar(
        "http://127.0.0.1:8998",
        sglang_payload(),
        transport=transport,
        backoff=FAST,
        watch_interval=0.01,
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    transport.times = 2
    assert wait_until(lambda: transport.times == 0 and transport.checked >= 2)
    assert reg.state is State.REGISTERED
    assert reg.running
    assert len(transport.registered) == 1


class RaisingIdle(ScriptedTransport):
    """An idle watcher whose wait raises: the loop must wait on its clock instead."""

    def __init__(self) -> None:
        super().__init__([accepted()], checks=[route(Route.PRESENT)])
        self.idle_calls = 0

    def wait_idle(self, timeout: float, waker: Any) -> bool:
        self.idle_calls += 1
        raise OSError("idle watch bug")


@pytest.mark.unexpected_errors
def test_an_idle_wait_that_raises_falls_back_to_the_clock(
    registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    transport = RaisingIdle()
    reg = Registrar(
        "http://127.0.0.1:8998", sglang_payload(), transport=transport, watch_interval=0.05
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    # Checks go on at the interval, each wait falling back to the clock.
    assert wait_until(lambda: transport.checked >= 4 and transport.idle_calls >= 3)
    assert reg.running
    assert len([r for r in caplog.records if getattr(r, UNEXPECTED, False)]) == 1
