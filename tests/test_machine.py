from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from transitions import EventData

from registrar import State
from registrar.core._board import TRANSITIONS, Trigger, build_machine, mermaid_diagram

DOC = Path(__file__).resolve().parent.parent / "docs" / "state-machine.md"

EXPECTED = {
    (State.UNREGISTERED, Trigger.START): State.REGISTERING,
    (State.REGISTERING, Trigger.SUCCEED): State.REGISTERED,
    (State.REGISTERING, Trigger.GIVE_UP): State.FAILED,
    (State.FAILED, Trigger.SUCCEED): State.REGISTERED,
    (State.REGISTERED, Trigger.LOSE): State.REGISTERING,
    (State.UNREGISTERED, Trigger.STOP): State.STOPPED,
    (State.REGISTERING, Trigger.STOP): State.STOPPED,
    (State.REGISTERED, Trigger.STOP): State.STOPPED,
    (State.FAILED, Trigger.STOP): State.STOPPED,
}


def test_table_is_exactly_the_expected_one() -> None:
    assert {(s, t): d for s, t, d in TRANSITIONS} == EXPECTED
    assert len(TRANSITIONS) == len(EXPECTED)


@pytest.mark.parametrize(("source", "trigger"), list(itertools.product(State, Trigger)))
def test_every_pair_on_the_real_machine(source: State, trigger: Trigger) -> None:
    heard: list[tuple[str, str, dict[str, object]]] = []

    def changed(event: EventData) -> None:
        assert event.transition is not None
        heard.append((event.transition.source, str(event.transition.dest), event.kwargs))

    machine = build_machine(source, changed)
    allowed = machine.dispatch(trigger.value, route="present")
    expected = EXPECTED.get((source, trigger))
    assert allowed is (expected is not None)
    assert machine.state == (expected or source).value
    # The library's callback hears each transition the table allows, with the trigger's
    # keywords, and nothing else.
    assert heard == ([(source.value, expected.value, {"route": "present"})] if expected else [])


def test_stopped_is_terminal() -> None:
    assert not [t for s, t, _ in TRANSITIONS if s is State.STOPPED]


def test_doc_diagram_matches_the_table() -> None:
    text = DOC.read_text()
    assert f"```mermaid\n{mermaid_diagram()}```" in text, (
        "docs/state-machine.md is stale: paste the output of `registrar diagram`"
    )
