"""The diagnosis, unit by unit: `diagnose` from evidence to words (pure), and the watcher that
states it once after the threshold and clears it when the server answers, driven by a fake
clock and a scripted transport (no network, no sleeps)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

import pytest
from support import FakeClock, ScriptedTransport, accepted, route, wait_until

from registrar import Registrar, State
from registrar.core._diagnosis import (
    Code,
    Evidence,
    Knock,
    Seen,
    diagnose,
    port_problem,
    port_text,
)
from registrar.core._settings import DEFAULT_DIAGNOSE_AFTER, LoopSettings
from registrar.core._transport import RegisterOutcome, Route, RouteCheck, Verdict

HOST = "10.0.0.5"


def _seen(seen: Seen | None, port: str = "8998", **more: Any) -> Evidence:
    return Evidence(f"http://{HOST}:{port}", HOST, port, seen=seen, **more)


@pytest.mark.parametrize(
    ("evidence", "code", "words"),
    [
        (_seen(None, "None"), Code.PORT_MISSING, "(':None')"),
        (_seen(None, "0"), Code.PORT_MISSING, "(':0')"),
        (
            Evidence("http://x.invalid:8998", "x.invalid", "8998", resolved=False, detail="gone"),
            Code.UNRESOLVED,
            "the name x.invalid does not resolve (gone)",
        ),
        (
            _seen(Seen.OTHER, "30000", http_port=30000, detail="GET /route answered 404"),
            Code.HTTP_PORT,
            "10.0.0.5:30000 is the rank's own HTTP port",
        ),
        (
            _seen(Seen.NOTHING, others=(Knock(30000, "the prefill HTTP port", True, True),)),
            Code.REFUSED_HOST_UP,
            "nothing listens on 10.0.0.5:8998; 10.0.0.5:30000 (the prefill HTTP port) answers "
            "HTTP: the host is up; is --disaggregation-bootstrap-port the same on every node?",
        ),
        (
            _seen(Seen.NOTHING, others=(Knock(30000, "the prefill HTTP port", False, False),)),
            Code.REFUSED,
            "10.0.0.5:30000 (the prefill HTTP port) does not answer either",
        ),
        (_seen(Seen.NOTHING), Code.REFUSED, "no other port of that host is known"),
        (_seen(Seen.SILENCE, detail="no answer within 2 s"), Code.NO_ANSWER, "does not answer"),
        (_seen(Seen.TLS), Code.TLS_ON_PLAIN, "speaks TLS but the bootstrap URL says http://"),
        (_seen(Seen.PLAIN), Code.PLAIN_ON_TLS, "answers plain HTTP but the bootstrap URL says"),
        (_seen(Seen.TLS_FAILED), Code.TLS_FAILED, "the TLS handshake with 10.0.0.5:8998 fails"),
        (_seen(Seen.GATEWAY), Code.GATEWAY, "answers as a gateway"),
        (_seen(Seen.DENIED), Code.DENIED, "refuses the request without the right credential"),
        (_seen(Seen.HTML), Code.NOT_BOOTSTRAP, "answers with an HTML page"),
        (
            _seen(Seen.OTHER, detail="GET /route answered 404"),
            Code.NOT_BOOTSTRAP,
            "(GET /route answered 404): check the bootstrap URL: this server does not take "
            "registrations there",
        ),
    ],
)
def test_each_kind_of_evidence_has_its_own_diagnosis(
    evidence: Evidence, code: Code, words: str
) -> None:
    found = diagnose(evidence)
    assert found is not None
    assert found.code == code
    assert words in found.sentence


def test_a_bootstrap_server_answering_is_no_diagnosis() -> None:
    assert diagnose(_seen(Seen.BOOTSTRAP)) is None
    # SGLang's rust server serves the bootstrap routes on the HTTP port: not a mistake there.
    assert diagnose(_seen(Seen.BOOTSTRAP, "30000", http_port=30000)) is None


@pytest.mark.parametrize(
    ("netloc", "port"),
    [("h:8998", "8998"), ("h", ""), ("h:None", "None"), ("[::1]:8998", "8998"), ("[::1]", "")],
)
def test_the_port_is_read_as_the_url_writes_it(netloc: str, port: str) -> None:
    assert port_text(netloc) == port
    assert port_text(f"user:pass@{netloc}") == port


def test_a_port_never_filled_in_is_seen_in_the_url_alone() -> None:
    assert port_problem("http://10.0.0.5:8998") is None
    assert port_problem("http://10.0.0.5") is None  # the scheme's port
    assert port_problem("http://[::1") is None  # not a URL: its own error says so
    for url in (
        "http://10.0.0.5:None",
        "http://10.0.0.5:0",
        "http://10.0.0.5:",
        "http://[::1]:None",
    ):
        found = port_problem(url)
        assert found is not None
        assert found.code == "port-missing"
        assert type(found.code) is str
    hidden = port_problem("http://user:s3cret@10.0.0.5:None")
    assert hidden is not None
    assert "s3cret" not in hidden.sentence


def test_the_threshold_is_a_setting_with_a_default_of_a_few_tens_of_seconds() -> None:
    assert 10 <= DEFAULT_DIAGNOSE_AFTER <= 60
    assert LoopSettings().diagnose_after == DEFAULT_DIAGNOSE_AFTER
    assert LoopSettings(diagnose_after=None).diagnose_after is None


REFUSED = RegisterOutcome(Verdict.RETRY, error="connection refused", refused=True)
UNREACHABLE = RouteCheck(Route.UNREACHABLE, evidence="connection refused", refused=True)


class Probed(ScriptedTransport):
    """Refused until `up_at` (virtual time), accepted after; `evidence()` says nothing listens
    while refused. It records the virtual time of each probe."""

    def __init__(self, clock: FakeClock, up_at: float | None) -> None:
        super().__init__([accepted()], [route(Route.PRESENT)], before=UNREACHABLE)
        self.clock = clock
        self.up_at = up_at
        self.probes: list[float] = []

    def up(self) -> bool:
        return self.up_at is not None and self.clock.now >= self.up_at

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        return super().register(payload) if self.up() else REFUSED

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        if not self.up():
            return UNREACHABLE
        return route(Route.PRESENT) if self.registered else route(Route.MISSING)

    def evidence(self, payload: Mapping[str, Any]) -> Evidence:
        self.probes.append(self.clock.now)
        if self.up():
            return _seen(Seen.BOOTSTRAP)
        return _seen(Seen.NOTHING, others=(Knock(30000, "the prefill HTTP port", True, True),))


def _registrar(
    transport: Probed, clock: FakeClock, after: float | None = 30.0, **options: Any
) -> Registrar:
    options.setdefault("max_attempts", None)
    return Registrar(
        "http://127.0.0.1:1",
        {"a": 1},
        transport=transport,
        clock=clock,
        diagnose_after=after,
        watch_interval=60,
        **options,
    )


def test_a_diagnosis_is_stated_once_after_the_threshold_and_retrying_goes_on(
    clock: FakeClock, registrars: list[Registrar], caplog: pytest.LogCaptureFixture
) -> None:
    transport = Probed(clock, up_at=None)
    reg = _registrar(transport, clock)
    seen: list[tuple[float, Any]] = []
    lock = threading.Lock()

    def record(event: Any) -> None:
        with lock:
            seen.append((clock.now, reg.status().diagnosis))

    reg.add_request_listener(record)
    registrars.append(reg)
    with caplog.at_level(logging.WARNING, logger="registrar"):
        reg.start()
        assert wait_until(lambda: reg.status().diagnosis is not None)
        attempts = reg.status().attempts_total
        assert wait_until(lambda: reg.status().attempts_total > attempts + 3)
        reg.stop()
    diagnosis = reg.status().diagnosis
    assert diagnosis is not None
    assert diagnosis.code == Code.REFUSED_HOST_UP
    first = seen[0][0]
    assert all(at - first >= 30.0 for at, shown in seen if shown is not None)
    assert len(transport.probes) == 1
    assert transport.probes[0] - first >= 30.0
    stated = [r for r in caplog.records if "[diagnosis refused-host-up]" in r.getMessage()]
    assert len(stated) == 1
    assert stated[0].levelno == logging.WARNING
    assert "still trying" in stated[0].getMessage()
    assert reg.status().to_dict()["diagnosis"] == {
        "code": "refused-host-up",
        "sentence": diagnosis.sentence,
    }


def test_a_server_that_is_merely_late_gets_no_diagnosis(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = Probed(clock, up_at=clock.now + 20.0)
    reg = _registrar(transport, clock)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert reg.status().diagnosis is None
    assert transport.probes == []


def test_the_diagnosis_clears_once_the_server_answers(
    clock: FakeClock, registrars: list[Registrar], caplog: pytest.LogCaptureFixture
) -> None:
    transport = Probed(clock, up_at=None)
    reg = _registrar(transport, clock, after=5.0)
    registrars.append(reg)
    with caplog.at_level(logging.INFO, logger="registrar"):
        reg.start()
        assert wait_until(lambda: reg.status().diagnosis is not None)
        transport.up_at = clock.now
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert wait_until(lambda: reg.status().diagnosis is None)
    assert any("diagnosis refused-host-up cleared" in r.getMessage() for r in caplog.records)


def test_off_means_no_probe_at_all(clock: FakeClock, registrars: list[Registrar]) -> None:
    transport = Probed(clock, up_at=None)
    reg = _registrar(transport, clock, after=None)
    registrars.append(reg)
    reg.start()
    assert wait_until(lambda: clock.now - clock.start > 120)
    reg.stop()
    assert transport.probes == []
    assert reg.status().diagnosis is None


def test_giving_up_for_good_diagnoses_at_once(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = Probed(clock, up_at=None)
    reg = _registrar(transport, clock, after=3600, max_attempts=2, on_failure="stop")
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=10)
    assert wait_until(lambda: reg.status().diagnosis is not None)
    assert len(transport.probes) == 1
