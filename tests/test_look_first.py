"""The first registration looks before it registers: a server that counts every registration
(SGLang's) must not count a route that is already there (the runtime's own registration, a rank
restarted under a live server, a role switched back).

Present at our address: adopted without a registration. Present at another address: registered
with a warning that the server counts it twice. Missing: registered. A protocol that cannot
check: registered without a look."""

from __future__ import annotations

import logging
from typing import Any

import requests
from bootstrap_lab import BootstrapLab
from support import (
    FakeClock,
    ScriptedTransport,
    accepted,
    retry,
    route,
    sglang_payload,
    wait_until,
)

from registrar import Registrar, Route, RouteCheck, State

PAYLOAD = sglang_payload()


def make(
    registrars: list[Registrar], transport: ScriptedTransport, clock: FakeClock, **kwargs: Any
) -> Registrar:
    kwargs.setdefault("watch_interval", None)
    url = "http://127.0.0.1:8998"
    reg = Registrar(url, PAYLOAD, transport=transport, clock=clock, rng=lambda: 0.0, **kwargs)
    registrars.append(reg)
    return reg.start()


# ----------------------------------------------------------------- unit (scripted transport)


def test_a_route_already_present_is_adopted_without_a_registration(
    registrars: list[Registrar], clock: FakeClock, caplog: Any
) -> None:
    caplog.set_level(logging.INFO, logger="registrar")
    transport = ScriptedTransport([accepted()], checks=[], before=route(Route.PRESENT, "ours"))
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert transport.registered == []
    assert transport.looked >= 1  # the look, then the watch's first check
    status = reg.status()
    assert (status.attempts_total, status.registrations, status.route) == (0, 0, "present")
    assert status.last_success_at is not None
    assert "adopted without registering again" in caplog.text


def test_a_route_present_at_another_address_is_registered_with_a_warning(
    registrars: list[Registrar], clock: FakeClock, caplog: Any
) -> None:
    conflict = RouteCheck(Route.CONFLICT, 200, "our rank is registered as 10.0.0.9:1")
    transport = ScriptedTransport([accepted()], checks=[], before=conflict)
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 1
    assert "will count this rank twice" in caplog.text
    assert "10.0.0.9:1" in caplog.text


def test_a_missing_route_is_registered(registrars: list[Registrar], clock: FakeClock) -> None:
    transport = ScriptedTransport([accepted()], checks=[])
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert (transport.looked, len(transport.registered)) == (1, 1)


def test_a_protocol_that_cannot_check_registers_without_looking(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    transport = ScriptedTransport([accepted()], checks=None)
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert (transport.looked, len(transport.registered)) == (0, 1)


def test_it_looks_once_per_startup_not_before_every_attempt(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    transport = ScriptedTransport([retry(), retry(), accepted()], checks=[])
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert (transport.looked, len(transport.registered)) == (1, 3)


def test_a_route_lost_later_is_registered_again_without_a_second_look(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    transport = ScriptedTransport([accepted()], checks=[route(Route.MISSING), route(Route.PRESENT)])
    reg = make(registrars, transport, clock, watch_interval=10.0)
    assert wait_until(lambda: reg.status().registrations == 2)
    assert transport.looked == 1  # the watch saw it missing: nothing to look at again


# ----------------------------------------------------------------- the reference server


def _puts(server: BootstrapLab) -> int:
    return sum(1 for r in server.records() if r.method == "PUT")


def test_reference_route_registered_by_someone_else_is_adopted(
    registrars: list[Registrar],
) -> None:
    # The topology is one rank, so the server answers the rank query once it holds it.
    with BootstrapLab() as server:
        assert requests.put(f"{server.url}/route", json=PAYLOAD, timeout=5).status_code == 200
        reg = Registrar(server.url, PAYLOAD, watch_interval=0.2)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert wait_until(lambda: reg.status().last_check_at is not None)
        assert server.registered_count == 1
        assert _puts(server) == 1
        assert reg.status().registrations == 0


def test_reference_route_at_another_address_is_registered_and_counted_twice(
    registrars: list[Registrar], caplog: Any
) -> None:
    with BootstrapLab() as server:
        other = dict(PAYLOAD, rank_port=PAYLOAD["rank_port"] + 1)
        assert requests.put(f"{server.url}/route", json=other, timeout=5).status_code == 200
        reg = Registrar(server.url, PAYLOAD, watch_interval=None)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert server.registered_count == 2
        assert "will count this rank twice" in caplog.text


def test_reference_missing_route_is_registered_once(registrars: list[Registrar]) -> None:
    with BootstrapLab() as server:
        reg = Registrar(server.url, sglang_payload(tp_size=2), watch_interval=0.2)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert [r.method for r in server.records()][:2] == ["GET", "PUT"]
        assert server.registered_count == 1


def test_the_snapshot_at_registered_does_not_carry_the_look_before_the_put(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    """The look before the first PUT finds the route missing; the transition to `registered`
    must not publish that stale "missing" beside `registered` (health said "the server has
    forgotten this route" until the check after the PUT landed)."""
    transport = ScriptedTransport([retry(), retry(), accepted()], checks=[])
    seen: list[tuple[State, str | None]] = []
    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=transport,
        clock=clock,
        rng=lambda: 0.0,
        watch_interval=None,
    )
    registrars.append(reg)
    reg.add_listener(lambda old, new, status: seen.append((new, status.route)))
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert transport.looked >= 1
    # Listeners hear a transition from the registrar's thread after the state is set.
    assert wait_until(lambda: any(state is State.REGISTERED for state, _ in seen), timeout=5)
    at_registered = [found for state, found in seen if state is State.REGISTERED]
    assert at_registered
    assert "missing" not in at_registered


def test_an_unanswered_attempt_is_not_sent_again_while_the_count_cannot_tell(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    """After a PUT whose answer was lost, a server that is not ready answers 503 with a count
    that may include it: sending again could count the rank twice. The loop holds until the
    server is ready (the attempt arrived) or empty."""
    lost = retry(None, "no complete answer within the request deadline of 1 s")
    maybe = RouteCheck(Route.UNDETERMINED, 503, "503 with 1 workers registered", count=1)
    transport = ScriptedTransport(
        [lost, accepted()], checks=[maybe, maybe, maybe, maybe, route(Route.PRESENT)]
    )
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 1  # held through four ambiguous looks, never resent
    assert reg.status().registrations == 1  # the lost attempt, found arrived


def test_an_unanswered_attempt_is_sent_again_when_the_server_counts_none(
    registrars: list[Registrar], clock: FakeClock
) -> None:
    lost = retry(None, "no complete answer within the request deadline of 1 s")
    empty = RouteCheck(Route.MISSING, 503, "503 with 0 workers registered", count=0)
    transport = ScriptedTransport([lost, accepted()], checks=[empty, route(Route.PRESENT)])
    reg = make(registrars, transport, clock)
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert len(transport.registered) == 2
