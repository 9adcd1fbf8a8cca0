"""The loop's promises under pressure: stop(timeout) keeps its timeout whatever listeners do, a
snapshot is never half-updated, fatal errors go through the failure policy, and reports of a
missing route are coalesced into a bounded number of checks and log lines."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from support import (
    FakeClock,
    ScriptedTransport,
    Watched,
    accepted,
    fatal,
    retry,
    route,
    sglang_payload,
    wait_until,
)

from registrar import Backoff, RegisterOutcome, Registrar, Route, State, Status, Verdict
from registrar.core._board import RequestEvent
from registrar.core._decide import REPORT_CHECK_INTERVAL
from registrar.core._settings import EXIT_CODE
from registrar.surfaces.health import health_app

PAYLOAD = {"service": "demo", "port": 20000}
CAP = Backoff(initial=1.0, multiplier=2.0, maximum=30.0, jitter=0.25)


def make(registrars: list[Registrar], transport: ScriptedTransport, **kwargs: Any) -> Registrar:
    kwargs.setdefault("watch_interval", None)
    kwargs.setdefault("clock", FakeClock())
    reg = Registrar("http://127.0.0.1:8998", PAYLOAD, transport=transport, **kwargs)
    registrars.append(reg)
    return reg


def call_app(reg: Registrar, path: str) -> tuple[str, bytes]:
    app = health_app(reg)
    answer: list[str] = []
    body = b"".join(
        app({"REQUEST_METHOD": "GET", "PATH_INFO": path}, lambda s, h: answer.append(s))
    )
    return answer[0], body


# ----------------------------------------------------------------- stop() and listeners


def test_slow_listener_does_not_stretch_stop(registrars: list[Registrar]) -> None:
    heard: list[State] = []
    release = threading.Event()
    returned = threading.Event()

    def slow(old: State, new: State, status: Status) -> None:
        heard.append(new)
        if new is State.REGISTERED:
            release.wait(60)  # until the test releases it (60 s only if the test fails)
            returned.set()

    reg = make(registrars, ScriptedTransport([accepted()]))
    reg.add_listener(slow)
    reg.start()
    assert wait_until(lambda: State.REGISTERED in heard)
    ended = reg.stop(timeout=1)
    # The order of events, not a time: stop() returned while the listener still held.
    assert not returned.is_set(), "stop(timeout=1) waited for the listener"
    release.set()
    assert ended is False  # honest: the thread was still in the listener
    assert reg.state is State.STOPPED
    # The stop is still delivered, by the registrar's thread, once the listener returns.
    assert wait_until(lambda: heard[-1] is State.STOPPED, timeout=10)
    assert wait_until(lambda: not reg.running, timeout=10)


def test_slow_listener_holds_neither_start_nor_stop_before_start(
    registrars: list[Registrar],
) -> None:
    release = threading.Event()
    returned = threading.Event()
    callers: list[str] = []

    def slow(old: State, new: State, status: Status) -> None:
        callers.append(threading.current_thread().name)
        release.wait(60)  # until the test releases it (60 s only if the test fails)
        returned.set()

    idle = make(registrars, ScriptedTransport([accepted()]))
    idle.add_listener(slow)
    assert idle.stop(timeout=1) is True  # never started: no thread to wait for
    # The order of events, not a time: stop() and start() return while the listener holds.
    assert not returned.is_set(), "stop() before start() waited for a listener"

    reg = make(registrars, ScriptedTransport([accepted()]))
    reg.add_listener(slow)
    reg.start()
    assert not returned.is_set(), "start() waited for a listener"
    release.set()
    assert wait_until(lambda: len(callers) >= 2)
    assert threading.current_thread().name not in callers
    assert set(callers) <= {"registrar", "registrar-events"}


def test_stop_from_a_listener_on_the_start_transition(registrars: list[Registrar]) -> None:
    transport = ScriptedTransport([accepted()])
    reg = make(registrars, transport)
    seen: list[State] = []

    def stop_at_start(old: State, new: State, status: Status) -> None:
        seen.append(new)
        if new is State.REGISTERING:
            assert reg.stop(timeout=1) is True  # from the registrar's own thread

    reg.add_listener(stop_at_start)
    assert reg.start() is reg  # nothing raised inside start()
    assert reg.wait_for(State.STOPPED, timeout=5)
    assert wait_until(lambda: not reg.running)
    assert seen == [State.REGISTERING, State.STOPPED]
    assert transport.registered == []  # stopped before the first request


def test_stop_racing_the_loop_never_leaves_a_schedule(registrars: list[Registrar]) -> None:
    """Many stops at random moments of a loop that fails, waits and retries as fast as virtual
    time allows, two stoppers at once: every STOPPED snapshot, the published one and the ones
    listeners heard, has nothing scheduled."""
    rng = random.Random(11)
    bad: list[Status] = []
    # A fixed number of rounds (however long a loaded machine takes; ~1 s when idle), not as
    # many as fit in a time.
    for _ in range(100):
        transport = ScriptedTransport([retry()] * 3 + [accepted()], checks=[route(Route.MISSING)])
        reg = make(
            registrars,
            transport,
            backoff=Backoff(initial=0.01, maximum=0.05),
            max_attempts=None,
            watch_interval=0.01,
            rng=lambda: 0.5,
            # Past 5 virtual seconds the loop parks instead of spinning: a spinning loop held
            # the GIL and made each round take ~0.3 s, too few rounds on a loaded machine.
            clock=FakeClock(horizon=5.0),
        )

        def watch(old: State, new: State, status: Status) -> None:
            if new is State.STOPPED and (status.retrying or status.next_attempt_at):
                bad.append(status)

        reg.add_listener(watch)
        reg.start()
        time.sleep(rng.random() * 0.003)
        results: list[bool] = []

        def stop(reg: Registrar = reg, results: list[bool] = results) -> None:
            results.append(reg.stop(timeout=5))

        stoppers = [threading.Thread(target=stop) for _ in range(2)]
        for stopper in stoppers:
            stopper.start()
        for stopper in stoppers:
            stopper.join(10)
        assert results == [True, True]
        status = reg.status()
        if status.retrying or status.next_attempt_at or status.state is not State.STOPPED:
            bad.append(status)
    assert bad == []


# ----------------------------------------------------------------- never half-updated


def test_dead_thread_is_never_seen_without_its_reason(registrars: list[Registrar]) -> None:
    """Readers racing the thread's death: every answer that says dead also says why."""

    # A transport that raises is classified by the loop; a bug in its own machinery (here its
    # clock) still ends the thread.
    class BrokenClock(FakeClock):
        def wait(self, event: object, timeout: float | None) -> bool:  # type: ignore[override]
            raise RuntimeError("clock bug")

    problems: list[str] = []
    for _ in range(30):
        reg = make(registrars, ScriptedTransport([retry()]), clock=BrokenClock())
        done = threading.Event()
        after: list[int] = [0]  # the reader's reads that saw the thread dead

        def read(
            reg: Registrar = reg, done: threading.Event = done, after: list[int] = after
        ) -> None:
            while not done.is_set():
                status = reg.status()
                after[0] += status.thread_died
                if status.thread_died and "clock bug" not in (status.last_error or ""):
                    problems.append(f"snapshot: {status}")
                code, body = call_app(reg, "/livez")
                if code.startswith("503") and b"clock bug" not in body:
                    problems.append(f"/livez: {body!r}")

        reader = threading.Thread(target=read)
        reader.start()
        reg.start()
        assert wait_until(lambda reg=reg: reg.thread_died)
        assert wait_until(lambda after=after: after[0] >= 3)  # the reader raced the death
        done.set()
        reader.join(10)
        code, body = call_app(reg, "/livez")
        assert code.startswith("503")
        assert b"clock bug" in body
        code, body = call_app(reg, "/readyz")
        assert code.startswith("503")
    assert problems == []


@pytest.mark.parametrize("policy", ["retry", "callable"])
def test_failed_with_retry_is_never_seen_unscheduled(
    registrars: list[Registrar], policy: str
) -> None:
    """With on_failure="retry" (or a callable answering it) no reader ever sees FAILED with
    nothing scheduled: liveness never flaps while the policy decides."""

    def decide(status: Status) -> str:
        time.sleep(0.2)  # an alerting call: widens any window a reader could fall into
        return "retry"

    on_failure: str | Callable[[Status], str] = decide if policy == "callable" else "retry"
    clock = FakeClock(horizon=50)
    reg = make(registrars, ScriptedTransport([retry()]), clock=clock, on_failure=on_failure)
    reg.add_listener(lambda old, new, status: None)
    seen: list[Status] = []
    done = threading.Event()

    def read() -> None:
        while not done.is_set():
            status = reg.status()
            if status.state is State.FAILED:
                seen.append(status)

    reader = threading.Thread(target=read)
    reader.start()
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    assert wait_until(lambda: clock.parked, timeout=10)
    assert wait_until(lambda: len(seen) > 100, timeout=10)  # the reader had its turns
    done.set()
    reader.join(10)
    # Scheduled, or the attempt is in flight: never "failed, nothing will happen".
    assert all(s.retrying for s in seen)
    assert call_app(reg, "/livez")[0].startswith("200")


def test_a_lost_route_publishes_its_rejoin_with_the_transition(
    registrars: list[Registrar],
) -> None:
    heard: list[Status] = []
    # Lost right after our own PUT: the rejoin waits (the window grows with each such loss).
    transport = ScriptedTransport(
        [accepted()], checks=[route(Route.MISSING, "404"), route(Route.PRESENT)]
    )
    reg = make(registrars, transport, watch_interval=5.0, rng=lambda: 0.5)
    reg.add_listener(lambda old, new, status: heard.append(status))
    reg.start()
    assert wait_until(lambda: reg.status().registrations == 2)
    lost = next(s for s in heard if s.state is State.REGISTERING and s.reregistrations == 1)
    assert lost.route == "missing"
    assert lost.next_attempt_at is not None
    assert lost.retrying


# ----------------------------------------------------------------- fatal errors and the policy


def test_fatal_with_exit_exits(registrars: list[Registrar]) -> None:
    codes: list[int] = []
    transport = ScriptedTransport([fatal()])
    reg = make(registrars, transport, on_failure="exit", exit=codes.append).start()
    assert reg.wait_for(State.FAILED, timeout=5)
    assert wait_until(lambda: not reg.running)
    assert codes == [EXIT_CODE]
    assert len(transport.registered) == 1


@pytest.mark.parametrize("answer", ["stop", "retry"])
def test_fatal_calls_the_callable(registrars: list[Registrar], answer: str) -> None:
    given: list[Status] = []

    def alert(status: Status) -> str:
        given.append(status)
        return answer

    clock = FakeClock(horizon=200)
    transport = ScriptedTransport([fatal(), fatal(), fatal(), accepted()])
    reg = make(registrars, transport, clock=clock, backoff=CAP, on_failure=alert).start()
    if answer == "stop":
        assert reg.wait_for(State.FAILED, timeout=5)
        assert wait_until(lambda: not reg.running)
        assert len(transport.registered) == 1
    else:
        assert reg.wait_for(State.REGISTERED, timeout=5)
        assert len(transport.registered) == 4
        # Slowly, at the cap: a fixed server configuration is picked up, nothing is hammered.
        assert len(clock.waits) == 3
        assert all(30.0 * 0.75 <= wait <= 30.0 for wait in clock.waits)
    assert len(given) == 1  # once, on entering failed
    assert given[0].state is State.FAILED
    assert "401" in (given[0].last_error or "")


def test_fatal_with_retry_is_alive_and_scheduled(registrars: list[Registrar]) -> None:
    clock = FakeClock(horizon=10)  # parks in the first slow wait
    reg = make(registrars, ScriptedTransport([fatal()]), clock=clock, backoff=CAP)
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    status = reg.status()
    assert status.retrying
    assert status.next_attempt_at is not None
    assert status.next_attempt_at - clock.time() >= 30.0 * 0.75
    assert call_app(reg, "/livez")[0].startswith("200")
    assert call_app(reg, "/readyz")[0].startswith("503")


def test_fatal_after_a_loss_applies_the_policy(registrars: list[Registrar]) -> None:
    codes: list[int] = []
    transport = ScriptedTransport([accepted(), fatal()], checks=[route(Route.MISSING, "404")])
    reg = make(registrars, transport, on_failure="exit", exit=codes.append, watch_interval=1.0)
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    assert wait_until(lambda: codes == [EXIT_CODE])


def test_wrong_token_and_wrong_url_reach_the_policy_over_http(registrars: list[Registrar]) -> None:
    given: list[str] = []
    with BootstrapLab(token="right-token") as server:
        for url, token in ((server.url, "wrong-token"), (f"{server.url}/nope", "right-token")):
            reg = Registrar(
                url,
                sglang_payload(),
                token=token,
                watch_interval=None,
                on_failure=lambda status: given.append(status.last_error or "") or "stop",
            )
            registrars.append(reg)
            reg.start()
            assert reg.wait_for(State.FAILED, timeout=10)
            assert wait_until(lambda reg=reg: not reg.running)
    assert len(given) == 2
    assert "401" in given[0]
    assert "404" in given[1]
    assert all("right-token" not in text and "wrong-token" not in text for text in given)


# ----------------------------------------------------------------- report_route_missing()


def test_reports_are_coalesced_into_bounded_checks_and_lines(
    server: BootstrapLab, registrars: list[Registrar], caplog: pytest.LogCaptureFixture
) -> None:
    """A decode failing every transfer reports ~1000 times a second: the server sees at most
    one check per REPORT_CHECK_INTERVAL, the log at most one line for all of them."""
    caplog.set_level(logging.WARNING, logger="registrar")
    transport = Watched(server.url)
    reg = Registrar(server.url, sglang_payload(), watch_interval=3600, transport=transport)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert wait_until(transport.idle)  # registered, checked, and idle for the hour
    gets_before = sum(1 for r in server.records() if r.method == "GET")
    reports = 0
    began = time.monotonic()
    # A flood of at least 1000 reports over at least 3 s, however slowly a loaded machine
    # runs this loop (the bound below is on checks per second of flood).
    while reports < 1000 or time.monotonic() - began < 3.0:
        last = transport.mark()
        reg.report_route_missing()
        reports += 1
        time.sleep(0.001)
    took = time.monotonic() - began
    # The last report was taken: the loop is back in its hour-long wait with none pending, so
    # the last coalesced check has run and no other is coming.
    assert wait_until(lambda: transport.idle(since=last), timeout=10)
    gets = sum(1 for r in server.records() if r.method == "GET") - gets_before
    lines = [r for r in caplog.records if "reported missing" in r.getMessage()]
    assert 1 <= gets <= took / REPORT_CHECK_INTERVAL + 2, gets
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert "times" in lines[0].getMessage()
    assert server.registered_count == 1  # verified, never re-PUT
    # A report that is true is still acted on promptly, and once.
    server.forget()
    forgotten = transport.mark()
    for _ in range(500):
        reg.report_route_missing()
    assert wait_until(lambda: reg.status().registrations == 2, timeout=10)
    # Back in the hour-long wait after the PUT and its check: one PUT for 500 reports.
    assert wait_until(lambda: transport.idle(since=forgotten), timeout=10)
    assert transport.count("PUT", since=forgotten) == 1
    assert server.registered_count == 1


# ----------------------------------------------------------------- an answer lost on the way


def test_an_unanswered_attempt_is_looked_for_before_it_is_sent_again(
    registrars: list[Registrar],
) -> None:
    """A PUT whose answer was lost (a deadline, a reset after sending) may have been counted:
    the route is looked for first, and found there, it is not sent again."""
    lost = retry(code=None, error="no complete answer within the request deadline of 1 s")
    transport = ScriptedTransport([lost, accepted()], checks=[route(Route.PRESENT)])
    reg = make(registrars, transport, watch_interval=None)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 1  # sent once, found there, not sent again
    assert reg.status().registrations == 1


def test_a_refused_or_answered_attempt_is_sent_again_without_a_look(
    registrars: list[Registrar],
) -> None:
    refused = RegisterOutcome(Verdict.RETRY, error="[Errno 111] Connection refused", refused=True)
    transport = ScriptedTransport([refused, retry(503), accepted()], checks=[])
    reg = make(registrars, transport, watch_interval=None)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 3
    assert transport.looked == 1  # the startup look only
    assert transport.checked == 1  # the check after the PUT


def test_reports_while_the_server_is_down_keep_the_probe_cadence(
    server: BootstrapLab, registrars: list[Registrar]
) -> None:
    """Refused checks are probed again every ~0.15 s; a flood of reports must not turn that
    into a loop of connection attempts."""
    checks: list[RequestEvent] = []
    reg = Registrar(server.url, sglang_payload(), watch_interval=3600)
    reg.add_request_listener(lambda event: checks.append(event) if event.kind == "check" else None)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    server.stop()
    reg.report_route_missing()
    assert wait_until(lambda: reg.status().server_reachable is False, timeout=10)
    before = len(checks)
    began = time.monotonic()
    reports = 0
    # At least 500 reports over at least 2 s, however slowly a loaded machine runs this loop.
    while reports < 500 or time.monotonic() - began < 2.0:
        reg.report_route_missing()
        reports += 1
        time.sleep(0.001)
    made = len(checks) - before
    took = time.monotonic() - began
    assert made <= took / 0.075 + 3, made  # the fastest probe cadence, not the report rate
