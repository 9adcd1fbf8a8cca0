"""The registration state machine: states, triggers, and the one table of what may follow what.

The table below is the single source of truth. The `transitions` machine is built from it, the
mermaid diagram in `docs/state-machine.md` is drawn from it (`registrar diagram`), and a test
checks every (state, trigger) pair against it.

`fire` takes a transition through the machine's table (`get_transitions`, `set_state`) rather
than its event dispatch: registrar hangs no callbacks on the machine, and the dispatch narrates
every change on the `transitions.core` logger (two INFO lines per state change, more at DEBUG),
which a library must not add to its host's logs. Silencing that logger instead would reconfigure
a logger the host owns, and hide the host's own machines too.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from transitions import Machine
from transitions.extensions import LockedMachine

__all__ = [
    "TRANSITIONS",
    "State",
    "Trigger",
    "build_machine",
    "fire",
    "mermaid_diagram",
]


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
    """The events that move a registrar between states."""

    START = "start"
    SUCCEED = "succeed"
    GIVE_UP = "give_up"
    LOSE = "lose"
    STOP = "stop"


_LIVE = (State.UNREGISTERED, State.REGISTERING, State.REGISTERED, State.FAILED)

TRANSITIONS: tuple[tuple[State, Trigger, State], ...] = (
    (State.UNREGISTERED, Trigger.START, State.REGISTERING),
    (State.REGISTERING, Trigger.SUCCEED, State.REGISTERED),
    (State.REGISTERING, Trigger.GIVE_UP, State.FAILED),
    # on_failure="retry": attempts go on in the background and a late success still counts.
    (State.FAILED, Trigger.SUCCEED, State.REGISTERED),
    (State.REGISTERED, Trigger.LOSE, State.REGISTERING),
    *((source, Trigger.STOP, State.STOPPED) for source in _LIVE),
)
"""Every allowed (source, trigger, destination); anything else is refused."""


class _Model:
    """The object the machine drives. It carries no methods named like a trigger, because a
    model method with a trigger's name silently wins over the trigger."""

    state: str
    trigger: Any
    machine: Machine


def build_machine(initial: State = State.UNREGISTERED) -> tuple[LockedMachine, _Model]:
    """A fresh locked machine over the table, and its model."""
    model = _Model()
    machine = LockedMachine(
        model=model,
        states=[s.value for s in State],
        transitions=[
            {"trigger": t.value, "source": s.value, "dest": d.value} for s, t, d in TRANSITIONS
        ],
        initial=initial.value,
        auto_transitions=False,
        ignore_invalid_triggers=False,
        send_event=False,
    )
    model.machine = machine
    return machine, model


def fire(model: _Model, trigger: Trigger) -> bool:
    """Fire `trigger`; False (and no change) when the table does not allow it from here.

    Logs nothing: see the module's docstring."""
    allowed = model.machine.get_transitions(trigger=trigger.value, source=model.state)
    dest = allowed[0].dest if allowed else None
    if dest is None:  # not allowed from here (the table has no internal transitions)
        return False
    model.machine.set_state(dest, model)
    return True


def mermaid_diagram() -> str:
    """The state diagram as mermaid `stateDiagram-v2` text, drawn from `TRANSITIONS`."""
    lines = ["stateDiagram-v2", f"    [*] --> {State.UNREGISTERED.value}"]
    for source, trigger, dest in TRANSITIONS:
        lines.append(f"    {source.value} --> {dest.value}: {trigger.value}")
    lines.append(f"    {State.STOPPED.value} --> [*]")
    return "\n".join(lines) + "\n"
