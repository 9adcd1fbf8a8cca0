"""The loop, driven by a fake clock and a scripted transport: minutes of backoff in
milliseconds, exact delays, every failure policy."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from freezegun import freeze_time
from support import FakeClock, ScriptedTransport, accepted, fatal, retry, route, wait_until

from registrar import Backoff, Registrar, Route, State, StateError, Status
from registrar.core._settings import DEFAULT_BACKOFF, EXIT_CODE

PAYLOAD = {"service": "demo", "port": 20000}
UPSTREAM = Backoff(initial=1.0, multiplier=2.0, maximum=30.0, jitter=0.25)


def test_default_schedule_is_upstream_capped_at_five_seconds() -> None:
    assert DEFAULT_BACKOFF == Backoff() == Backoff(1.0, 2.0, 5.0, 0.25)
    assert [DEFAULT_BACKOFF.delay(a, 0.0) for a in range(5)] == [0.75, 1.5, 3.0, 3.75, 3.75]


def make(
    registrars: list[Registrar],
    transport: ScriptedTransport,
    clock: FakeClock,
    **kwargs: Any,
) -> Registrar:
    kwargs.setdefault("watch_interval", None)
    kwargs.setdefault("rng", lambda: 0.0)
    reg = Registrar("http://127.0.0.1:8998", PAYLOAD, transport=transport, clock=clock, **kwargs)
    registrars.append(reg)
    return reg


def test_first_attempt_succeeds(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport([accepted()])
    reg = make(registrars, transport, clock).start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 1
    assert transport.registered[0] == PAYLOAD
    assert clock.waits == []
    status = reg.status()
    assert (status.attempts_total, status.registrations, status.attempt) == (1, 1, 0)
    assert status.last_success_at == clock.time()


def test_two_failures_then_success(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport([retry(), retry(), accepted()])
    reg = make(registrars, transport, clock).start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 3
    assert clock.waits == [0.75, 1.5]
    assert reg.status().attempts_total == 3
    assert reg.status().last_error is None


def test_always_503_gives_up_once(
    registrars: list[Registrar], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="registrar")
    transport = ScriptedTransport([retry()])
    reg = make(registrars, transport, clock, on_failure="stop", backoff=UPSTREAM).start()
    assert reg.wait_for(State.FAILED, timeout=5)
    reg._thread.join(5)  # type: ignore[union-attr]
    assert len(transport.registered) == 5
    assert clock.waits == [0.75, 1.5, 3.0, 6.0]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "after 5 attempts" in errors[0].getMessage()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert [w.split(" to ")[0] for w in warnings] == [
        f"registration attempt {k}/5" for k in range(1, 5)
    ]
    assert "next attempt in 0.75 s" in warnings[0]
    status = reg.status()
    assert status.next_attempt_at is None
    assert not status.retrying
    assert status.last_error == "503 Service Unavailable"


def test_retry_policy_keeps_trying_in_background(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    transport = ScriptedTransport([retry()] * 6 + [accepted()])
    seen: list[tuple[State, State]] = []
    reg = make(registrars, transport, clock, backoff=UPSTREAM)
    reg.add_listener(lambda old, new, status: seen.append((old, new)))
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    # Listeners hear a transition from the registrar's thread after the state is set.
    assert wait_until(lambda: len(seen) >= 3, timeout=5)
    assert seen == [
        (State.UNREGISTERED, State.REGISTERING),
        (State.REGISTERING, State.FAILED),
        (State.FAILED, State.REGISTERED),
    ]
    # The schedule continues where the startup budget stopped, up to its cap.
    assert clock.waits == [0.75, 1.5, 3.0, 6.0, 12.0, 22.5]
    assert reg.status().attempts_total == 7


def test_failed_with_retry_has_next_attempt_scheduled(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    clock.horizon = clock.now + 20  # park in the wait after the budget is spent
    transport = ScriptedTransport([retry()])
    reg = make(registrars, transport, clock, backoff=UPSTREAM).start()
    assert reg.wait_for(State.FAILED, timeout=5)
    deadline = time.monotonic() + 5
    while reg.status().next_attempt_at is None and time.monotonic() < deadline:
        time.sleep(0.01)
    status = reg.status()
    assert status.retrying
    assert status.next_attempt_at == pytest.approx(clock.time() + 12.0)


def test_exit_policy_ends_the_process(registrars: list[Registrar], clock: FakeClock) -> None:
    codes: list[int] = []
    transport = ScriptedTransport([retry()])
    reg = make(registrars, transport, clock, max_attempts=2, exit=codes.append, on_failure="exit")
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    reg._thread.join(5)  # type: ignore[union-attr]
    assert codes == [EXIT_CODE]
    assert len(transport.registered) == 2


@pytest.mark.parametrize(
    ("answer", "attempts_after"),
    [("retry", True), (None, False), ("stop", False), ("bogus", False)],
)
def test_callable_policy_decides(
    registrars: list[Registrar], clock: FakeClock, answer: Any, attempts_after: bool
) -> None:
    given: list[Status] = []

    def policy(status: Status) -> Any:
        given.append(status)
        return answer

    transport = ScriptedTransport([retry()] * 3 + [accepted()])
    reg = make(registrars, transport, clock, max_attempts=3, on_failure=policy).start()
    if attempts_after:
        assert reg.wait_for(State.REGISTERED, timeout=5)
        assert len(transport.registered) == 4
    else:
        assert reg.wait_for(State.FAILED, timeout=5)
        reg._thread.join(5)  # type: ignore[union-attr]
        assert len(transport.registered) == 3
    assert len(given) == 1
    assert given[0].state is State.FAILED
    assert given[0].attempts_total == 3


def test_fatal_is_not_retried_with_stop(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport([fatal()])
    reg = make(registrars, transport, clock, on_failure="stop").start()
    assert reg.wait_for(State.FAILED, timeout=5)
    reg._thread.join(5)  # type: ignore[union-attr]
    assert len(transport.registered) == 1
    assert clock.waits == []
    assert "check the auth token" in (reg.status().last_error or "")
    assert not reg.status().retrying


@pytest.mark.parametrize(
    ("retry_after", "cap", "expected"),
    [
        (10.0, 60.0, 10.0),
        (45.0, 60.0, 45.0),
        (1e9, 60.0, 60.0),
        (100.0, 90.0, 90.0),
        (100.0, 0.0, 0.75),
        (0.1, 60.0, 0.75),
    ],
)
def test_retry_after_is_honoured_and_capped(
    registrars: list[Registrar], clock: FakeClock, retry_after: float, cap: float, expected: float
) -> None:
    transport = ScriptedTransport([retry(429, "429", retry_after=retry_after), accepted()])
    reg = make(registrars, transport, clock, backoff=UPSTREAM, max_retry_after=cap).start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert clock.waits == [expected]


def test_jitter_bounds_over_many_draws(registrars: list[Registrar], clock: FakeClock) -> None:
    draws = iter([0.999999, 0.0, 0.5] * 100)
    transport = ScriptedTransport([retry()] * 30 + [accepted()])
    reg = make(registrars, transport, clock, max_attempts=None, rng=lambda: next(draws))
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    policy = DEFAULT_BACKOFF
    assert len(clock.waits) == 30
    for attempt, wait in enumerate(clock.waits):
        base = policy.base(attempt)
        assert 0.75 * base <= wait < base + 1e-9


def test_stop_during_long_wait(registrars: list[Registrar]) -> None:
    transport = ScriptedTransport([retry()])
    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=transport,
        backoff=Backoff(initial=600, maximum=600),
        watch_interval=None,
    )
    registrars.append(reg)
    reg.start()
    assert wait_until(lambda: reg.status().next_attempt_at is not None, timeout=5)
    # Waiting, and its next wake is ten minutes away: only stop() can end this wait in time.
    assert reg.status().next_attempt_at - time.time() > 400  # 600 s less jitter
    assert reg.stop(timeout=5) is True
    assert reg.state is State.STOPPED
    # stop() returned True: the thread has ended, so nothing can be sent later; the one attempt
    # is all there was, and none came after the transport was closed.
    assert not reg.running
    assert len(transport.registered) == 1
    assert transport.closed
    assert transport.calls_after_close == 0


def test_start_twice_is_harmless_and_restart_after_stop_is_refused(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    reg = make(registrars, ScriptedTransport([accepted()]), clock)
    reg.start()
    thread = reg._thread
    reg.start()
    assert reg._thread is thread
    assert reg.wait_for(State.REGISTERED, timeout=5)
    reg.stop()
    with pytest.raises(StateError, match="create a new one"):
        reg.start()
    assert [t.name for t in threading.enumerate()].count("registrar") == 0


def test_stop_before_start(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport([accepted()])
    reg = make(registrars, transport, clock)
    assert reg.stop() is True
    assert reg.state is State.STOPPED
    assert transport.registered == []


def test_context_manager_stops(clock: FakeClock) -> None:
    transport = ScriptedTransport([accepted()])
    with Registrar(
        "http://127.0.0.1:8998", PAYLOAD, transport=transport, clock=clock, watch_interval=None
    ) as reg:
        assert reg.wait_for(State.REGISTERED, timeout=5)
    assert reg.state is State.STOPPED


def test_listener_errors_are_contained(
    registrars: list[Registrar], clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[State] = []

    def broken(old: State, new: State, status: Status) -> None:
        raise RuntimeError("listener bug")

    reg = make(registrars, ScriptedTransport([accepted()]), clock)
    reg.add_listener(broken)
    reg.add_listener(lambda old, new, status: seen.append(new))
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    reg.stop()
    assert seen == [State.REGISTERING, State.REGISTERED, State.STOPPED]
    assert "listener bug" in caplog.text
    assert reg.status().last_error is None


def test_listener_runs_outside_the_lock_and_may_stop(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    reg = make(registrars, ScriptedTransport([accepted()]), clock)
    order: list[State] = []

    def listener(old: State, new: State, status: Status) -> None:
        order.append(new)
        assert reg.status().state in (new, State.STOPPED)  # status() does not block here
        if new is State.REGISTERED:
            reg.stop()

    reg.add_listener(listener)
    reg.start()
    assert reg.wait_for(State.STOPPED, timeout=5)
    reg._thread.join(5)  # type: ignore[union-attr]
    assert order == [State.REGISTERING, State.REGISTERED, State.STOPPED]


def test_route_missing_registers_again(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport(
        [accepted()],
        checks=[route(Route.PRESENT), route(Route.MISSING, "404"), route(Route.PRESENT)],
    )
    reg = make(registrars, transport, clock, watch_interval=5.0)
    reg.start()
    deadline = time.monotonic() + 5
    while reg.status().registrations < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    status = reg.status()
    assert (status.registrations, status.reregistrations) == (2, 1)
    assert len(transport.registered) == 2
    # check right after PUT (no wait), the first watch wait spread over [0.5, 1.5) intervals
    # (u=0 -> 2.5 s), the missing check, the jittered first re-attempt (u=0 -> 0 s, skipped),
    # then the check right after the new PUT and the spread first wait again.
    assert clock.waits[:2] == [pytest.approx(2.5), pytest.approx(2.5)]


def test_watch_interval_is_jittered_within_20_percent(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    draws = iter([0.0, 0.999] * 1000)
    clock.horizon = clock.now + 200
    transport = ScriptedTransport([accepted()], checks=[])
    reg = make(registrars, transport, clock, watch_interval=10.0, rng=lambda: next(draws))
    reg.start()
    deadline = time.monotonic() + 5
    while len(clock.waits) < 10 and time.monotonic() < deadline:
        time.sleep(0.01)
    first, *steady = clock.waits
    assert first == 5.0  # the first wait after registering spreads over [0.5, 1.5) intervals
    assert all(8.0 <= w <= 12.0 for w in steady)
    assert min(steady) == 8.0
    assert max(steady) > 11.9
    assert len(transport.registered) == 1  # a present route is never PUT again


@freeze_time("2026-01-02 03:04:05")
def test_wall_clock_fields_use_real_time_by_default() -> None:
    reg = Registrar("http://127.0.0.1:8998", PAYLOAD, transport=ScriptedTransport([accepted()]))
    data = reg.status().to_dict()
    assert data["since"] == "2026-01-02T03:04:05.000Z"
    assert data["state"] == "unregistered"
    assert set(data) >= {
        "state",
        "since",
        "attempt",
        "attempts_total",
        "last_error",
        "last_success_at",
        "next_attempt_at",
        "registrations",
        "reregistrations",
        "url",
    }
    reg.stop()


def test_status_is_a_frozen_snapshot(registrars: list[Registrar], clock: FakeClock) -> None:
    reg = make(registrars, ScriptedTransport([accepted()]), clock)
    before = reg.status()
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert before.state is State.UNREGISTERED
    with pytest.raises(AttributeError):
        before.state = State.REGISTERED  # type: ignore[misc]


def test_route_lost_right_after_each_put_backs_off(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    # A server that accepts the PUT but never shows the route: every re-registration waits a
    # growing window, never a tight PUT loop.
    transport = ScriptedTransport([accepted()], checks=[route(Route.MISSING, "404")])
    clock.horizon = clock.now + 30
    reg = make(registrars, transport, clock, watch_interval=5.0, rng=lambda: 0.5)
    reg.start()
    assert wait_until(lambda: clock.parked, timeout=5)
    # windows base(1..)=2, 4, 5, 5 s (capped) times the draw 0.5
    assert clock.waits[:4] == [1.0, 2.0, 2.5, 2.5]
    assert len(transport.registered) == len(clock.waits) + 1


class ClosingGate(ScriptedTransport):
    """A `Gated` transport whose served process stops being ready after the first attempt,
    until the test opens the gate again."""

    ready_interval = 1.0

    def __init__(self) -> None:
        super().__init__([retry(), accepted()], checks=[route(Route.PRESENT)])
        self.closed_gate = False

    def not_ready(self) -> str | None:
        return "loading" if self.closed_gate else None

    def register(self, payload: Any) -> Any:
        self.closed_gate = not self.registered  # closes after the first attempt
        return super().register(payload)


def test_a_held_attempt_is_not_published_as_in_flight(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    gate = ClosingGate()
    reg = make(registrars, gate, clock, max_attempts=None)
    reg.start()
    assert wait_until(lambda: reg.status().last_error == "not offered yet: loading")
    status = reg.status()
    # The second attempt was decided, then held: nothing sent, no counter moved.
    assert (status.attempt, status.attempts_total, len(gate.registered)) == (1, 1, 1)
    gate.closed_gate = False
    assert reg.wait_for(State.REGISTERED, 5)
    assert reg.status().attempts_total == 2
