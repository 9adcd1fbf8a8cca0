"""The registration state machine: states, triggers, and the one table of what may follow what
(`TRANSITIONS`), from which the status board's `transitions` machine and the diagram of
docs/state-machine.md are built (why the library's records are filtered: docs/operations.md)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from transitions import EventData, Machine
from transitions.extensions import GraphMachine

MACHINE_NAME = "registrar-status"
"""The name of every machine registrar builds; the library's log records begin with it."""


class State(StrEnum):
    """Where a registrar stands."""

    UNREGISTERED = "unregistered"
    """Created, not started."""
    REGISTERING = "registering"
    """Attempting the registration (at startup, or again after the route went missing)."""
    REGISTERED = "registered"
    """The bootstrap server accepted the registration; the route is being watched."""
    FAILED = "failed"
    """Startup budget spent or a configuration error; see `Status.next_attempt_at`."""
    STOPPED = "stopped"
    """`stop()` was called; no request is ever sent again."""


class Trigger(StrEnum):
    START = "start"
    SUCCEED = "succeed"
    GIVE_UP = "give_up"
    LOSE = "lose"
    STOP = "stop"


TRANSITIONS: tuple[tuple[State, Trigger, State], ...] = (
    (State.UNREGISTERED, Trigger.START, State.REGISTERING),
    (State.REGISTERING, Trigger.SUCCEED, State.REGISTERED),
    (State.REGISTERING, Trigger.GIVE_UP, State.FAILED),
    # on_failure="retry": attempts go on in the background and a late success still counts.
    (State.FAILED, Trigger.SUCCEED, State.REGISTERED),
    (State.REGISTERED, Trigger.LOSE, State.REGISTERING),
    *((source, Trigger.STOP, State.STOPPED) for source in State if source is not State.STOPPED),
)
"""Every allowed (source, trigger, destination); anything else is refused."""


def ours_dropped(record: logging.LogRecord) -> bool:
    """The `transitions.core` filter: drops the records of registrar's machines, and only those."""
    args = record.args
    first = args[0] if isinstance(args, tuple) and args else record.msg
    return not str(first).startswith(MACHINE_NAME + ": ")


logging.getLogger("transitions.core").addFilter(ours_dropped)  # the same object: added once


def _config(initial: State) -> dict[str, Any]:
    return {
        "states": [s.value for s in State],
        "transitions": [
            {"trigger": t.value, "source": s.value, "dest": d.value} for s, t, d in TRANSITIONS
        ],
        "initial": initial.value,
        "auto_transitions": False,
        "name": MACHINE_NAME,
    }


def build_machine(initial: State, changed: Callable[[EventData], None]) -> Machine:
    """A machine over the table, itself its model: a trigger the table does not allow from here
    is refused (`dispatch` answers False); `changed` gets the event after each transition."""
    return Machine(
        **_config(initial),
        ignore_invalid_triggers=True,
        send_event=True,
        after_state_change=changed,
    )


def mermaid_diagram() -> str:
    """The state diagram as mermaid text, drawn by the library's engine (no graphviz)."""
    graph = GraphMachine(**_config(State.UNREGISTERED), graph_engine="mermaid", title="registrar")
    text: str = graph.get_graph().draw(None)
    return "".join(line.rstrip() + "\n" for line in text.strip("\n").splitlines())
