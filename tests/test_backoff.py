from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registrar import Backoff, ConfigError
from registrar.core._backoff import (
    ACCEPT_RATE,
    PROBE_PERIOD,
    contact_delay,
    first_watch_delay,
    probe_delay,
    probe_period,
    rejoin_delay,
    retry_delay,
    watch_delay,
)
from registrar.core._settings import DEFAULT_BACKOFF

UPSTREAM = Backoff(initial=1.0, multiplier=2.0, maximum=30.0, jitter=0.25)


def test_upstream_schedule_with_lowest_draw() -> None:
    assert [UPSTREAM.delay(a, 0.0) for a in range(4)] == [0.75, 1.5, 3.0, 6.0]


def test_cap_applies_before_jitter() -> None:
    assert UPSTREAM.delay(5, 0.0) == pytest.approx(22.5)
    assert UPSTREAM.delay(50, 0.999999) < 30.0


def test_huge_attempt_does_not_overflow() -> None:
    assert UPSTREAM.base(10**9) == 30.0
    assert Backoff(initial=1e-9, multiplier=1e6, maximum=1e9).base(10**6) == 1e9


def test_multiplier_one_is_constant() -> None:
    assert [
        Backoff(initial=2.0, multiplier=1.0, maximum=5.0, jitter=0).delay(a, 0.5) for a in range(3)
    ] == [2.0, 2.0, 2.0]


def test_initial_above_maximum_is_capped() -> None:
    assert Backoff(initial=50.0, maximum=30.0, jitter=0).delay(0, 0.3) == 30.0


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"initial": 0}, "initial"),
        ({"initial": -1}, "initial"),
        ({"maximum": 0}, "maximum"),
        ({"multiplier": 0.5}, "multiplier"),
        ({"jitter": -0.1}, "jitter"),
        ({"jitter": 1.5}, "jitter"),
        ({"initial": math.inf}, "initial"),
        ({"maximum": math.nan}, "maximum"),
        ({"initial": "1"}, "initial"),
        ({"jitter": True}, "jitter"),
    ],
)
def test_invalid_parameters_name_the_field(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        Backoff(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("u", [-0.1, 1.0, 2.0])
def test_draw_outside_unit_interval_is_refused(u: float) -> None:
    with pytest.raises(ConfigError, match="draw"):
        UPSTREAM.delay(0, u)


def test_negative_attempt_is_refused() -> None:
    with pytest.raises(ConfigError, match="attempt"):
        UPSTREAM.delay(-1, 0.0)


@given(
    initial=st.floats(min_value=1e-6, max_value=1e4),
    multiplier=st.floats(min_value=1.0, max_value=100.0),
    maximum=st.floats(min_value=1e-6, max_value=1e5),
    jitter=st.floats(min_value=0.0, max_value=1.0),
    attempt=st.integers(min_value=0, max_value=10**12),
    u=st.floats(min_value=0.0, max_value=1.0, exclude_max=True),
)
def test_delay_always_within_bounds(
    initial: float, multiplier: float, maximum: float, jitter: float, attempt: int, u: float
) -> None:
    policy = Backoff(initial=initial, multiplier=multiplier, maximum=maximum, jitter=jitter)
    delay = policy.delay(attempt, u)
    base = policy.base(attempt)
    assert base <= maximum
    assert min(initial, maximum) <= base <= policy.base(attempt + 1)
    if attempt <= 30:
        assert base == pytest.approx(min(initial * multiplier**attempt, maximum))
    assert base * (1 - jitter) - 1e-9 <= delay <= base + 1e-9
    assert math.isfinite(delay)
    assert delay >= 0


def test_retry_delay_honours_retry_after_within_its_own_cap() -> None:
    assert retry_delay(UPSTREAM, 1, 0.0, None) == 0.75
    assert retry_delay(UPSTREAM, 1, 0.0, 10.0) == 10.0
    # Its own cap (60 s by default), not the backoff's maximum.
    assert retry_delay(UPSTREAM, 1, 0.0, 45.0) == 45.0
    assert retry_delay(DEFAULT_BACKOFF, 1, 0.0, 30.0) == 30.0
    assert retry_delay(UPSTREAM, 1, 0.0, 365 * 86400.0) == 60.0
    assert retry_delay(UPSTREAM, 1, 0.0, 600.0, max_retry_after=120.0) == 120.0
    assert retry_delay(UPSTREAM, 1, 0.0, 600.0, max_retry_after=0.0) == 0.75
    assert retry_delay(UPSTREAM, 3, 0.0, 0.1) == 3.0
    assert retry_delay(UPSTREAM, 1, 0.0, float("nan")) == 0.75


def test_watch_delay_jitter() -> None:
    assert watch_delay(5.0, 0.0) == 4.0
    assert watch_delay(5.0, 0.5) == 5.0
    assert watch_delay(5.0, 0.999999) == pytest.approx(6.0)


def test_first_watch_delay_spreads_over_a_whole_interval() -> None:
    assert first_watch_delay(5.0, 0.0) == 2.5
    assert first_watch_delay(5.0, 0.5) == 5.0
    assert first_watch_delay(5.0, 0.999999) == pytest.approx(7.5)


def test_rejoin_delay_is_immediate_then_backs_off() -> None:
    # The check that found the route missing was already the spread first contact.
    assert rejoin_delay(UPSTREAM, 0, 0.5) == 0.0
    assert rejoin_delay(UPSTREAM, 0, 0.999) == 0.0
    assert rejoin_delay(UPSTREAM, 3, 0.5) == 4.0
    assert rejoin_delay(UPSTREAM, 100, 0.5) == 15.0


def test_probe_period_is_short_for_a_small_fleet_and_grows_with_a_large_one() -> None:
    assert probe_period(1) == PROBE_PERIOD
    assert probe_period(0) == PROBE_PERIOD
    assert probe_period(100) == PROBE_PERIOD
    assert probe_period(1000) == pytest.approx(1000 / ACCEPT_RATE)


@pytest.mark.parametrize("fleet", [1, 200, 1000, 5000])
def test_probes_of_a_fleet_arrive_no_faster_than_the_accept_rate(fleet: int) -> None:
    # Mean delay = the period, so `fleet` clients probe at fleet / period per second.
    lo, mid, hi = (probe_delay(fleet, u) for u in (0.0, 0.5, 0.999999))
    assert lo == pytest.approx(0.5 * probe_period(fleet))
    assert mid == pytest.approx(probe_period(fleet))
    assert hi == pytest.approx(1.5 * probe_period(fleet))
    assert fleet / mid <= max(ACCEPT_RATE, 1 / PROBE_PERIOD)


def test_contact_delay_spreads_a_fleet_over_fleet_over_accept_rate() -> None:
    assert contact_delay(1000, 0.0) == 0.0
    assert contact_delay(1000, 0.5) == pytest.approx(0.5 * 1000 / ACCEPT_RATE)
    assert contact_delay(200, 0.999999) == pytest.approx(200 / ACCEPT_RATE, rel=1e-5)
    assert contact_delay(1, 0.999999) < 0.01
