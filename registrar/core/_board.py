"""The status board: the states and the one table of what may follow what (`TRANSITIONS`), from
which its `transitions` machine and the diagram of docs/state-machine.md are built (why the
library's records are filtered: docs/operations.md); the published `Status` snapshot (immutable:
what health endpoints, metrics and people read), which the machine's callback publishes; and the
listeners who hear every change in order (docs/state-machine.md)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal, TypedDict, TypeVar

from transitions import EventData, Machine
from transitions.extensions import GraphMachine

from ._clock import Clock
from ._diagnosis import Diagnosis
from ._errors import ConfigError

logger = logging.getLogger("registrar")

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
        "transitions": [[t.value, s.value, d.value] for s, t, d in TRANSITIONS],
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


def iso_utc(timestamp: float | None) -> str | None:
    """An epoch timestamp as ISO 8601 UTC text (`2026-11-30T03:00:00.000Z`), or None."""
    if timestamp is None:
        return None
    moment = datetime.fromtimestamp(timestamp, tz=UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


_TIMESTAMPS = ("since", "last_success_at", "next_attempt_at", "last_check_at", "last_request_at")


@dataclass(frozen=True)
class Status:
    """One consistent view of a registrar, replaced whole on every change. Timestamps are
    wall-clock epoch seconds (ISO 8601 UTC in `to_dict()`); `next_attempt_at` is None when no
    attempt is scheduled (registered, an attempt in flight, or given up for good)."""

    state: State
    since: float
    url: str
    attempt: int = 0
    """Attempts in the current run of failures (0 after a success)."""
    attempts_total: int = 0
    """Registration requests sent since start."""
    last_error: str | None = None
    last_success_at: float | None = None
    next_attempt_at: float | None = None
    registrations: int = 0
    """Accepted registrations, the first one included."""
    reregistrations: int = 0
    """Times the route was found missing and registration started again."""
    server_reachable: bool | None = None
    """Whether the bootstrap server answered the last request (None before any)."""
    last_check_at: float | None = None
    route: str | None = None
    """What the last route check found: present, conflict, missing, undetermined, unreachable;
    None before any, and from an accepted registration until the check after it."""
    retrying: bool = False
    """True while attempts are scheduled or in flight (also in FAILED with on_failure="retry")."""
    last_request_at: float | None = None
    """When the last request (registration or check) ended: when `server_reachable` was read."""
    resolution: str | None = None
    """Read live: "resolving NAME (no answer for 3 s)" while a lookup stalls past its first
    second, or the last good address in use while lookups fail; None while names resolve."""
    thread_died: bool = False
    """No thread will update this snapshot again (an unexpected error, or this process is a
    fork): in the snapshot so a reader never sees "dead" without the reason (`last_error`)."""
    diagnosis: Diagnosis | None = None
    """What a probe saw after requests kept failing for `diagnose_after` seconds (a wrong port,
    a name that does not resolve, ...); None while the server answers."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready mapping of every field, in snake_case (`/health` converts to camelCase
        by one rule: Python names in Python, JSON names on the wire)."""
        data = asdict(self) | {"state": self.state.value}
        return data | {key: iso_utc(data[key]) for key in _TIMESTAMPS}


class Changes(TypedDict, total=False):
    """The fields of `Status` a change sets (all but the state, its time and the URL, which
    the machine and construction set): typed from `decide` to the snapshot."""

    attempt: int
    attempts_total: int
    last_error: str | None
    last_success_at: float | None
    next_attempt_at: float | None
    registrations: int
    reregistrations: int
    server_reachable: bool | None
    last_check_at: float | None
    route: str | None
    retrying: bool
    last_request_at: float | None
    resolution: str | None
    thread_died: bool
    diagnosis: Diagnosis | None


Listener = Callable[[State, State, Status], None]
"""Called as fn(old_state, new_state, status) after every transition, outside any lock."""


@dataclass(frozen=True)
class RequestEvent:
    """One request the registrar sent, for metrics: what, how it ended, how long it took."""

    kind: Literal["register", "check"]
    result: str  # the verdict of a registration or the route a check found
    duration: float
    status_code: int | None


RequestListener = Callable[[RequestEvent], None]
_L = TypeVar("_L", Listener, RequestListener)


class StatusBoard:
    def __init__(self, status: Status, clock: Clock) -> None:
        self._clock = clock
        self.listeners: list[Listener] = []
        self.request_listeners: list[RequestListener] = []
        self.after_fork(status)

    def after_fork(self, status: Status) -> None:
        """A fresh lock, machine and delivery around `status` (also in a forked child, where
        locks another thread held are made again and nothing is pending)."""
        self.status = status
        self._changes = Changes()  # of the trigger being fired
        self._machine = build_machine(status.state, self._changed)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._pending: deque[tuple[State, State, Status]] = deque()
        # The one thread that calls listeners: the registrar's own while it runs, else a
        # short-lived "registrar-events" thread, never a caller of start() or stop().
        self.deliverer: threading.Thread | None = None
        self._draining = False  # the deliverer's alone

    def add(self, listeners: list[_L], listener: _L) -> None:
        if not callable(listener):
            raise ConfigError(f"listener must be callable, got {listener!r}")
        with self.lock:
            listeners.append(listener)

    def publish(self, status: Status) -> None:
        """Replace the snapshot (the lock held). The one rule every snapshot obeys whoever
        wrote it: once stopped, nothing is scheduled, whatever the loop was about to say."""
        if status.state is State.STOPPED and (status.retrying or status.next_attempt_at):
            status = replace(status, retrying=False, next_attempt_at=None)
        self.status = status
        self.changed.notify_all()

    def fire(self, trigger: Trigger, changes: Changes) -> bool:
        """Fire `trigger` with `changes` (the lock held): False, and nothing changed, when the
        table does not allow it from here. The callback reads `changes` here, typed, not from
        the event's untyped keywords."""
        self._changes = changes
        if not self._machine.dispatch(trigger.value):
            return False
        if self.deliverer is None:
            # No registrar thread to deliver it (not started, ended, or a forked child).
            helper = threading.Thread(target=self.deliver_all, name="registrar-events", daemon=True)
            self.deliverer = helper
            helper.start()
        return True

    def _changed(self, event: EventData) -> None:
        """The machine's after-state-change callback: the new state and the trigger's changes
        in one snapshot, and the transition queued for the listeners (no I/O: the lock is held)."""
        moved = event.transition
        assert moved is not None  # after a state change, there is always a transition
        old, new = State(moved.source), State(str(moved.dest))
        self.publish(replace(self.status, state=new, since=self._clock.time(), **self._changes))
        self._pending.append((old, new, self.status))

    def apply(self, trigger: Trigger | None, changes: Changes) -> bool:
        """Fire `trigger` with `changes`, or publish `changes` alone; False when the trigger is
        refused (stopped). Listeners hear it at once when the caller is the deliverer."""
        with self.changed:
            if trigger is None:
                self.publish(replace(self.status, **changes))
                return True
            fired = self.fire(trigger, changes)
            mine = self.deliverer is threading.current_thread()
        if fired and mine:
            self.drain()
        return fired

    def drain(self) -> None:
        """Call the listeners for every queued transition, in order; the deliverer only. A
        listener that causes a transition has it delivered after its own, by this loop."""
        if self._draining:
            return
        self._draining = True
        try:
            while True:
                with self.lock:
                    if not self._pending:
                        return
                    old, new, status = self._pending.popleft()
                    listeners = list(self.listeners)
                for listener in listeners:
                    try:
                        listener(old, new, status)
                    except Exception:
                        logger.exception(
                            "listener %r failed on %s -> %s; ignored", listener, old, new
                        )
        finally:
            self._draining = False

    def deliver_all(self) -> None:
        """Drain until none is queued, then give up the deliverer's role (stop() waits for it)."""
        while True:
            self.drain()
            with self.changed:
                if not self._pending:
                    self.deliverer = None
                    self.changed.notify_all()
                    return

    def emit(self, event: RequestEvent) -> None:
        with self.lock:
            listeners = list(self.request_listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("request listener %r failed; ignored", listener)
