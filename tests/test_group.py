"""A group of registrations of one service (one per registry): health shows an entry per
member and one verdict, metrics label each member, and stop() stops them together."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from support import ScriptedTransport, accepted, retry, wait_until

from registrar import ConfigError, Registrar, State, Status
from registrar.core._group import RegistrarGroup
from registrar.surfaces.health import answer_health, start_health_server

UP, DOWN = "http://127.0.0.1:30001", "http://127.0.0.1:30002"


def status(url: str, state: State) -> Status:
    return Status(state=state, since=1_000.0, url=url)


class Member:
    """A member as the health endpoints read it: a status, whether its thread died."""

    def __init__(self, status: Status, thread_died: bool) -> None:
        self._status = status
        self.thread_died = thread_died
        self.payload: dict[str, Any] = {}

    def status(self) -> Status:
        return self._status


class Group:
    def __init__(self, members: list[tuple[Status, bool]]) -> None:
        self._members = [Member(s, died) for s, died in members]

    def members(self) -> list[Member]:
        return self._members


def group_health(members: list[tuple[Status, bool]], probe: str) -> tuple[int, dict[str, Any]]:
    """The group's document for `probe`, as its health endpoints answer it."""
    answer = answer_health(Group(members), "GET", f"/{probe}", "")
    assert answer is not None
    return answer.code, json.loads(answer.body)


@pytest.mark.parametrize(
    ("states", "verdict", "code"),
    [
        ((State.REGISTERED, State.REGISTERED), "pass", 200),
        ((State.REGISTERED, State.REGISTERING), "warn", 200),
        ((State.REGISTERING, State.FAILED), "fail", 503),
    ],
)
def test_registration_passes_when_all_warns_when_some_fails_when_none(
    states: tuple[State, State], verdict: str, code: int
) -> None:
    members = [(status(UP, states[0]), False), (status(DOWN, states[1]), False)]
    got, document = group_health(members, "readyz")
    assert got == code
    assert document["status"] == verdict
    entries = document["checks"]["registration:state"]
    assert [(e["componentId"], e["observedValue"]) for e in entries] == [
        (UP, states[0].value),
        (DOWN, states[1].value),
    ]
    if verdict != "pass":
        assert DOWN in document["output"]


def test_a_dead_thread_of_one_member_fails_liveness() -> None:
    members = [(status(UP, State.REGISTERED), False), (status(DOWN, State.REGISTERED), True)]
    code, document = group_health(members, "livez")
    assert code == 503
    assert len(document["checks"]["registrar:thread"]) == 2


def test_a_group_registers_once_per_registry() -> None:
    one = Registrar(UP, {}, transport=ScriptedTransport([accepted()]), protocol="http")
    with pytest.raises(ConfigError, match="a URL is repeated"):
        RegistrarGroup([one, one])
    with pytest.raises(ConfigError, match="one or more Registrar"):
        RegistrarGroup([])


def test_group_health_server_and_metrics_per_member() -> None:
    up = ScriptedTransport([accepted()])
    up.display_url = UP
    down = ScriptedTransport([retry(None, "refused")])
    down.display_url = DOWN
    group = RegistrarGroup(
        [Registrar(UP, {}, transport=up), Registrar(DOWN, {}, transport=down, max_attempts=None)]
    )
    health = start_health_server(group, metrics=True)
    try:
        group.start()
        assert group.members()[0].wait_for(State.REGISTERED, 10)
        answer = requests.get(f"{health.url}/readyz", timeout=5)
        assert answer.status_code == 200
        assert answer.json()["status"] == "warn"
        wanted = [
            f'registrar_state{{registrar_state="registered",registry="{UP}"}} 1.0',
            f'registrar_state{{registrar_state="registering",registry="{DOWN}"}} 1.0',
        ]

        def exposed() -> bool:  # listeners hear a transition just after it is published
            metrics = requests.get(f"{health.url}/metrics", timeout=5).text
            return all(line in metrics for line in wanted)

        assert wait_until(exposed, 10)
    finally:
        assert group.stop(timeout=10)
        health.stop()
    assert all(r.state is State.STOPPED for r in group)
