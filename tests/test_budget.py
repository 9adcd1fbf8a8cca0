"""The startup budget in time (`max_elapsed`) beside the one in attempts, on a fake clock."""

from __future__ import annotations

import pytest
from support import FakeClock, ScriptedTransport, accepted, retry

from registrar import Backoff, ConfigError, Registrar, State

PAYLOAD = {"service": "demo"}
# No jitter: delays 1, 2, 4, 8 ... s.
PLAIN = Backoff(initial=1.0, multiplier=2.0, maximum=60.0, jitter=0.0)


def make(registrars: list, outcomes: list, clock: FakeClock, **kwargs: object) -> Registrar:
    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=ScriptedTransport(outcomes),
        clock=clock,
        backoff=PLAIN,
        watch_interval=None,
        rng=lambda: 0.0,
        **kwargs,  # type: ignore[arg-type]
    )
    registrars.append(reg)
    return reg


def test_time_budget_spent_before_a_wait_that_would_overrun_it(registrars: list) -> None:
    clock = FakeClock()
    reg = make(registrars, [retry()], clock, max_attempts=None, max_elapsed=5.0, on_failure="stop")
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    # Attempts at t = 0, 1, 3; the next would start at 7 > 5: spent at t = 3, not at 7.
    assert reg.status().attempts_total == 3
    assert clock.waits == [1.0, 2.0]
    assert reg.status().next_attempt_at is None


def test_the_first_budget_spent_applies(registrars: list) -> None:
    clock = FakeClock()
    reg = make(registrars, [retry()], clock, max_attempts=2, max_elapsed=100.0, on_failure="stop")
    reg.start()
    assert reg.wait_for(State.FAILED, timeout=5)
    assert reg.status().attempts_total == 2


def test_within_the_time_budget_a_late_success_counts(registrars: list) -> None:
    clock = FakeClock()
    reg = make(
        registrars,
        [retry(), retry(), accepted()],
        clock,
        max_attempts=None,
        max_elapsed=5.0,
        on_failure="stop",
    )
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert reg.status().attempts_total == 3


def test_retry_policy_goes_on_in_the_background(registrars: list) -> None:
    clock = FakeClock()
    reg = make(
        registrars,
        [retry(), retry(), retry(), retry(), accepted()],
        clock,
        max_attempts=None,
        max_elapsed=2.0,
        on_failure="retry",
    )
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert reg.status().registrations == 1
    assert reg.status().attempts_total == 5


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "5", True])
def test_max_elapsed_must_be_positive_seconds(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_elapsed must be a positive number of seconds"):
        Registrar("http://127.0.0.1:8998", PAYLOAD, max_elapsed=bad)  # type: ignore[arg-type]
