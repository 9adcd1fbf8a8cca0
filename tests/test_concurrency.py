"""Public methods called from 8 threads while transitions happen as fast as virtual time allows:
no deadlock, every snapshot consistent, and stop() wins over everything."""

from __future__ import annotations

import threading
import time

import pytest
from support import FakeClock, ScriptedTransport, accepted, route, wait_until

from registrar import Registrar, Route, State, Status


def consistent(status: Status) -> str | None:
    """What is wrong with a snapshot, or None. Each accepted PUT and each loss land in the same
    snapshot as their state change, so the counters pin the state down."""
    if status.state is State.REGISTERED:
        if status.registrations != status.reregistrations + 1:
            return "registered with counters out of step"
        if status.last_success_at is None or status.next_attempt_at is not None:
            return "registered without a success, or with an attempt scheduled"
    if status.state is State.REGISTERING and status.registrations != status.reregistrations:
        return "registering with counters out of step"
    if status.attempts_total < status.registrations:
        return "more registrations than attempts"
    return None


@pytest.mark.timeout(60)
def test_eight_threads_while_transitions_happen() -> None:
    flips = [route(Route.PRESENT), route(Route.MISSING, "gone")] * 2000
    transport = ScriptedTransport([accepted()], checks=flips)
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"x": 1},
        transport=transport,
        clock=FakeClock(horizon=10**9),
        watch_interval=1.0,
        rng=lambda: 0.5,
    )
    seen: list[tuple[State, State]] = []
    after_stop: list[State] = []
    stopped = threading.Event()
    problems: list[str] = []
    errors: list[BaseException] = []

    def record(old: State, new: State, status: Status) -> None:
        seen.append((old, new))
        if stopped.is_set() and old is State.STOPPED:
            after_stop.append(new)

    reg.add_listener(record)

    def hammer(kind: int) -> None:
        try:
            end = time.monotonic() + 30  # a guard; `stopped` normally ends it
            while time.monotonic() < end and not stopped.is_set():
                if kind == 0:
                    problem = consistent(reg.status())
                    if problem:
                        problems.append(problem)
                elif kind == 1:
                    assert reg.state in State
                elif kind == 2:
                    reg.wait_for(State.REGISTERED, timeout=0.01)
                elif kind == 3:
                    reg.report_route_missing()
                elif kind == 4:
                    reg.add_listener(lambda old, new, status: None)
                    time.sleep(0.01)
                else:
                    problem = consistent(reg.status())
                    if problem:
                        problems.append(problem)
                    reg.status().to_dict()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    reg.start()
    threads = [threading.Thread(target=hammer, args=(i % 6,)) for i in range(7)]
    for thread in threads:
        thread.start()
    # Let the flipping run under the callers' fire; on a loaded machine that takes longer.
    assert wait_until(lambda: len(seen) >= 50, timeout=20), "too few transitions to mean anything"

    stopper_result: list[bool] = []
    stopper = threading.Thread(target=lambda: stopper_result.append(reg.stop(timeout=5)))
    stopper.start()  # the eighth thread
    stopper.join(10)
    stopped.set()
    for thread in threads:
        thread.join(10)
    assert not stopper.is_alive(), "stop() deadlocked"
    assert not any(t.is_alive() for t in threads), "a caller deadlocked"
    assert stopper_result == [True]
    assert errors == []
    assert problems == []
    assert reg.state is State.STOPPED
    assert not reg.running
    transitions_seen = len(seen)
    assert seen[-1][1] is State.STOPPED
    assert [new for _, new in seen].count(State.STOPPED) == 1
    assert after_stop == []
    # stop() returned once nothing was left to deliver: none is queued, no thread delivers, and
    # a second stop() (which waits for delivery too) delivers nothing more.
    assert not reg._board._pending
    assert reg._board.deliverer is None
    assert reg.stop(timeout=5) is True
    assert len(seen) == transitions_seen
    assert reg.status().state is State.STOPPED
