"""Properties: random outcome sequences never leave the transition table, any JSON payload
reaches the server unchanged, and every invalid option is refused with ValueError."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FakeClock, ScriptedTransport, accepted, fatal, retry, route, wait_until

from registrar import Backoff, Registrar, Route, State
from registrar.core._board import TRANSITIONS

ALLOWED = {(s, d) for s, _, d in TRANSITIONS}
OUTCOMES = st.sampled_from([accepted(), retry(), retry(429, "429", retry_after=2.0), fatal()])
CHECKS = st.sampled_from([route(r) for r in Route])
SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@SETTINGS
@given(
    outcomes=st.lists(OUTCOMES, min_size=1, max_size=12),
    checks=st.lists(CHECKS, min_size=1, max_size=12),
    max_attempts=st.one_of(st.none(), st.integers(1, 4)),
    policy=st.sampled_from(["retry", "stop"]),
    report=st.booleans(),
)
def test_random_outcomes_never_leave_the_table(
    outcomes: list, checks: list, max_attempts: int | None, policy: str, report: bool
) -> None:
    transport = ScriptedTransport(outcomes, checks=checks)
    clock = FakeClock(horizon=500)
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"x": 1},
        transport=transport,
        clock=clock,
        watch_interval=1.0,
        max_attempts=max_attempts,
        on_failure=policy,
        rng=lambda: 0.3,
    )  # type: ignore[arg-type]
    seen: list[tuple[State, State]] = []
    reg.add_listener(lambda old, new, status: seen.append((old, new)))
    reg.start()
    if report:
        reg.report_route_missing()
    # Run until the thread ended or has nothing left to do for a long virtual while.
    assert wait_until(lambda: not reg.running or clock.parked, timeout=10)
    assert reg.stop(timeout=5)
    assert not reg.thread_died
    assert seen[0] == (State.UNREGISTERED, State.REGISTERING)
    assert seen[-1][1] is State.STOPPED
    for pair in seen:
        assert pair in ALLOWED, pair
    status = reg.status()
    assert status.attempts_total == len(transport.registered)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.dictionaries(st.text(max_size=10), JSON, max_size=6))
def test_any_json_payload_reaches_the_server_unchanged(
    server: BootstrapLab, payload: dict[str, Any]
) -> None:
    before = len(server.records())
    reg = Registrar(
        server.url, payload, protocol="http", max_attempts=1, on_failure="stop", watch_interval=None
    )
    reg.start()
    try:
        assert wait_until(lambda: len(server.records()) > before, timeout=10)
    finally:
        reg.stop()
    received = json.loads(server.records()[before].body)
    assert received == payload
    assert json.dumps(received, sort_keys=True) == json.dumps(payload, sort_keys=True)


INVALID: dict[str, st.SearchStrategy[Any]] = {
    "url": st.sampled_from(
        [
            "",
            "ftp://127.0.0.1",
            "127.0.0.1:8998",
            "http://",
            "http://[::1",
            "http://127.0.0.1:0",
            "http://127.0.0.1:99999",
            None,
            8998,
        ]
    ),
    "max_attempts": st.one_of(st.integers(max_value=0), st.sampled_from([1.5, "5", True])),
    "on_failure": st.text(max_size=8).filter(lambda s: s not in ("retry", "stop", "exit")),
    "watch_interval": st.one_of(st.floats(max_value=0), st.sampled_from([math.inf, math.nan, "5"])),
    "timeout": st.one_of(
        st.floats(max_value=0), st.just((1.0, -1.0)), st.just((1.0,)), st.just("5")
    ),
    "max_payload_bytes": st.one_of(st.integers(max_value=0), st.just(1.5)),
    "backoff": st.sampled_from([None, 1.0, {"initial": 1}]),
    "protocol": st.text(max_size=6).filter(lambda s: s not in ("sglang", "http")),
    "token": st.sampled_from(["a\nb", 5]),
}


@SETTINGS
@given(data=st.data(), option=st.sampled_from(sorted(INVALID)))
def test_every_invalid_option_is_refused(data: st.DataObject, option: str) -> None:
    value = data.draw(INVALID[option])
    kwargs: dict[str, Any] = {"url": "http://127.0.0.1:8998", option: value}
    url = kwargs.pop("url")
    with pytest.raises(ValueError, match=option.split("_", maxsplit=1)[0]):
        Registrar(url, {"x": 1}, protocol=kwargs.pop("protocol", "http"), **kwargs)


@SETTINGS
@given(
    initial=st.floats(-10, 0),
    maximum=st.floats(-10, 0),
    jitter=st.floats(1.0001, 10),
)
def test_invalid_backoff_is_refused(initial: float, maximum: float, jitter: float) -> None:
    for kwargs in ({"initial": initial}, {"maximum": maximum}, {"jitter": jitter}):
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            Backoff(**kwargs)
