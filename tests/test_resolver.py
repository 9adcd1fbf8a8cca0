"""The resolver's arithmetic, on a fake lookup and a fake clock: a lookup past its deadline is a
failed attempt with its own error, one lookup at most is in flight per name (later callers wait
on it, each within its own deadline), the last good answer is used while the resolver fails or
stalls and a changed answer is taken at once, and a stop ends the wait.

The waits are real (`threading.Event`), so the bounds asserted on time are generous: they
catch a wait that did not end, never a speed."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from support import FakeClock as VirtualClock
from support import (
    ScriptedTransport,
    accepted,
    lookups_in_flight,
    sglang_payload,
    wait_until,
)

from registrar import RegisterOutcome, Registrar, Route, RouteCheck, State, Verdict
from registrar.protocols._deadline import Watchdog
from registrar.protocols._resolver import FRESH, STALE_WAIT, Resolver, Unresolved, seconds

HANG = 10.0
"""Only catches a wait that did not end."""


class FakeClock:
    """The resolver's monotonic clock: moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeLookup:
    """`getaddrinfo` for names in `answers`: blocks while `held`, raises `error` when set."""

    def __init__(self) -> None:
        self.answers: dict[str, str] = {}
        self.error: OSError | None = None
        self.calls: list[str] = []
        self.released = threading.Event()
        self.released.set()
        self.lock = threading.Lock()

    def hold(self) -> None:
        self.released.clear()

    def release(self) -> None:
        self.released.set()

    def __call__(self, host: str, *args: Any) -> Sequence[tuple[Any, ...]]:
        with self.lock:
            self.calls.append(host)
        self.released.wait(HANG)
        if self.error is not None:
            raise self.error
        if host not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        ip = self.answers[host]
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (ip, 0))]


@pytest.fixture
def lookup() -> Iterator[FakeLookup]:
    made = FakeLookup()
    try:
        yield made
    finally:
        made.release()  # no worker is left waiting


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def resolver(lookup: FakeLookup, clock: FakeClock) -> Resolver:
    return Resolver(lookup, clock)


def ips(resolver: Resolver, host: str, timeout: float = 1.0) -> list[str]:
    return [a[3][0] for a in resolver.resolve(host, 8998, timeout).addresses]


def test_an_ip_literal_is_never_looked_up(resolver: Resolver, lookup: FakeLookup) -> None:
    lookup.hold()  # a lookup would block
    assert ips(resolver, "127.0.0.1") == ["127.0.0.1"]
    assert resolver.resolve("[::1]", 80, 1.0).addresses[0][3][:2] == ("::1", 80)
    assert lookup.calls == []


def test_the_port_is_the_callers(resolver: Resolver, lookup: FakeLookup) -> None:
    lookup.answers["a.test"] = "10.0.0.1"
    assert resolver.resolve("a.test", 1234, 1.0).addresses[0][3] == ("10.0.0.1", 1234)
    assert resolver.resolve("a.test", 80, 1.0).addresses[0][3] == ("10.0.0.1", 80)
    assert lookup.calls == ["a.test"]  # one name, one lookup, whatever the port


def test_a_lookup_past_the_deadline_is_its_own_error(
    resolver: Resolver, lookup: FakeLookup
) -> None:
    lookup.hold()
    started = time.monotonic()
    with pytest.raises(Unresolved) as raised:
        resolver.resolve("bootstrap.slow.test", 8998, 0.2)
    assert time.monotonic() - started < HANG
    assert str(raised.value) == "could not resolve bootstrap.slow.test within 0.2 s"
    assert isinstance(raised.value, OSError)  # a failed connection, retried as one


def test_a_failed_lookup_says_what_the_resolver_said(
    resolver: Resolver, lookup: FakeLookup
) -> None:
    lookup.error = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    with pytest.raises(Unresolved) as raised:
        resolver.resolve("servfail.test", 8998, 1.0)
    assert str(raised.value) == (
        "could not resolve servfail.test: [Errno -3] Temporary failure in name resolution"
    )


def test_one_lookup_in_flight_per_name(resolver: Resolver, lookup: FakeLookup) -> None:
    lookup.hold()
    before = set(threading.enumerate())
    errors: list[str] = []

    def lookup_threads() -> int:
        # Only the resolver's own threads: another test's thread ending meanwhile must not count.
        now = threading.enumerate()
        return sum(t not in before and t.name == "registrar-resolve" for t in now)

    def attempt() -> None:
        try:
            resolver.resolve("bootstrap.slow.test", 8998, 0.05)
        except Unresolved as exc:
            errors.append(str(exc))

    # Twenty attempts at once, then forty more at a probe's cadence: one lookup, one thread.
    crowd = [threading.Thread(target=attempt) for _ in range(20)]
    for thread in crowd:
        thread.start()
    for thread in crowd:
        thread.join(HANG)
    highest = 0
    for _ in range(40):
        attempt()
        highest = max(highest, lookup_threads())
    assert len(errors) == 60
    assert lookup.calls == ["bootstrap.slow.test"]
    assert lookups_in_flight(resolver) == 1
    assert highest == 1  # the one lookup's thread
    lookup.release()
    assert wait_until(lambda: lookups_in_flight(resolver) == 0)


def test_waiters_share_the_answer(resolver: Resolver, lookup: FakeLookup) -> None:
    lookup.hold()
    lookup.answers["shared.test"] = "10.0.0.7"
    found: list[list[str]] = []
    waiters = [
        threading.Thread(target=lambda: found.append(ips(resolver, "shared.test", HANG)))
        for _ in range(3)
    ]
    for thread in waiters:
        thread.start()
    assert wait_until(lambda: len(lookup.calls) == 1)
    lookup.release()
    for thread in waiters:
        thread.join(HANG)
    assert found == [["10.0.0.7"]] * 3
    assert lookup.calls == ["shared.test"]


def test_answers_and_failures_are_reused_while_fresh(
    resolver: Resolver, lookup: FakeLookup, clock: FakeClock
) -> None:
    lookup.answers["a.test"] = "10.0.0.1"
    for _ in range(5):
        ips(resolver, "a.test")
    assert lookup.calls == ["a.test"]
    clock.now += FRESH
    ips(resolver, "a.test")
    assert lookup.calls == ["a.test"] * 2
    for _ in range(3):
        with pytest.raises(Unresolved):
            ips(resolver, "missing.test")
    assert lookup.calls.count("missing.test") == 1


def test_the_last_good_answer_while_the_resolver_stalls(
    resolver: Resolver, lookup: FakeLookup, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lookup.answers["bootstrap.test"] = "10.0.0.1"
    assert ips(resolver, "bootstrap.test") == ["10.0.0.1"]
    lookup.hold()
    clock.now += 5.0
    # The first caller waits a little for the lookup it started, then takes the last answer.
    started = time.monotonic()
    stale = resolver.resolve("bootstrap.test", 8998, 5.0)
    assert stale.stale
    assert stale.hosts == {"10.0.0.1"}
    assert time.monotonic() - started < STALE_WAIT + HANG
    assert resolver.describe("bootstrap.test") is None  # slow for now, not stalled
    clock.now += 2.0
    with caplog.at_level(logging.INFO, logger="registrar"):
        for _ in range(3):  # no wait at all once it is stalled
            assert resolver.resolve("bootstrap.test", 8998, 5.0).stale
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        "bootstrap.test did not resolve (no answer); using its last good address 10.0.0.1 "
        "until the resolver answers again"
    ]
    assert resolver.describe("bootstrap.test") == (
        "resolving bootstrap.test (no answer for 2 s); using its last good address 10.0.0.1"
    )
    assert lookup.calls == ["bootstrap.test"] * 2


def test_a_changed_answer_is_taken_as_soon_as_the_resolver_answers(
    resolver: Resolver, lookup: FakeLookup, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lookup.answers["moving.test"] = "10.0.0.1"
    ips(resolver, "moving.test")
    lookup.hold()
    clock.now += 5.0
    assert resolver.resolve("moving.test", 80, 1.0).stale
    lookup.answers["moving.test"] = "10.0.0.2"
    with caplog.at_level(logging.INFO, logger="registrar"):
        lookup.release()
        assert wait_until(lambda: lookups_in_flight(resolver) == 0)
    assert ips(resolver, "moving.test") == ["10.0.0.2"]
    assert [r.getMessage() for r in caplog.records] == [
        "moving.test now resolves to 10.0.0.2 (was 10.0.0.1)"
    ]


def test_the_last_good_answer_while_the_resolver_fails(
    resolver: Resolver, lookup: FakeLookup, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    lookup.answers["flaky.test"] = "10.0.0.1"
    ips(resolver, "flaky.test")
    lookup.error = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
    with caplog.at_level(logging.INFO, logger="registrar"):
        for _ in range(3):
            clock.now += FRESH
            assert resolver.resolve("flaky.test", 80, 1.0).stale
        assert resolver.describe("flaky.test") == (
            "flaky.test did not resolve ([Errno -3] Temporary failure in name resolution); "
            "using its last good address 10.0.0.1"
        )
        lookup.error = None
        clock.now += FRESH
        assert not resolver.resolve("flaky.test", 80, 1.0).stale
    assert resolver.describe("flaky.test") is None
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert caplog.records[1].getMessage() == "flaky.test resolves again: 10.0.0.1"


def test_a_stop_ends_the_wait(resolver: Resolver, lookup: FakeLookup) -> None:
    lookup.hold()
    watchdog = Watchdog()
    watchdog.begin(HANG * 3)
    timer = threading.Timer(0.2, watchdog.fire)
    timer.start()
    started = time.monotonic()
    try:
        with pytest.raises(Unresolved):
            resolver.resolve("stopped.test", 80, HANG * 3, watchdog)
    finally:
        timer.cancel()
        watchdog.end()
    assert time.monotonic() - started < HANG


def test_seconds_as_messages_show_them() -> None:
    assert [seconds(s) for s in (1, 1.0, 0.25, 12)] == ["1.0", "1.0", "0.25", "12.0"]


@pytest.mark.parametrize(("unsent", "looks"), [(True, 0), (False, 2)])
def test_an_attempt_that_never_left_is_not_looked_for(
    registrars: list[Registrar], unsent: bool, looks: int
) -> None:
    """An attempt whose name did not resolve cannot have reached the server: it is counted
    and backed off like any other, with no look for it before the next (one whose answer was
    lost is looked for: the contrast)."""
    failed = RegisterOutcome(
        Verdict.RETRY, error="could not resolve bootstrap.slow.test within 1.0 s", unsent=unsent
    )
    missing = RouteCheck(Route.MISSING, 404, "not there")
    transport = Looks([failed, failed, accepted()], checks=[missing])
    transport.before = missing
    reg = Registrar(
        "http://bootstrap.slow.test:8998",
        sglang_payload(),
        transport=transport,
        clock=VirtualClock(),
        rng=lambda: 0.0,
        watch_interval=None,
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=HANG)
    assert reg.status().attempts_total == 3
    assert transport.looked == 1  # the one look before the first attempt
    assert transport.between == looks  # after a failed attempt, before the next


class Looks(ScriptedTransport):
    """Counts the checks made between the first attempt and the accepted one; the route is
    missing until then, present after."""

    between = 0

    def check(self, payload: Any) -> RouteCheck | None:
        if len(self.registered) >= 3:
            return RouteCheck(Route.PRESENT, 200, "ours")
        if self.registered:
            self.between += 1
        return super().check(payload)
