"""The status board: the published `Status` snapshot, the `transitions` machine whose callback
publishes it, and the listeners who hear every change in order (docs/state-machine.md)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from transitions import EventData

from ._clock import Clock
from ._errors import ConfigError
from ._machine import State, Trigger, build_machine
from ._status import Changes, Status

logger = logging.getLogger("registrar")

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


class StatusBoard:
    def __init__(self, status: Status, clock: Clock) -> None:
        self._clock = clock
        self._listeners: list[Listener] = []
        self._request_listeners: list[RequestListener] = []
        self._pending: deque[tuple[State, State, Status]] = deque()
        self.after_fork(status)

    def after_fork(self, status: Status) -> None:
        """A fresh lock, machine and delivery around `status` (also in a forked child, where
        locks another thread held are made again and nothing is pending)."""
        self.status = status
        self._changes = Changes()  # of the trigger being fired
        self._machine = build_machine(status.state, self._changed)
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self._pending.clear()
        # The one thread that calls listeners: the registrar's own while it runs, else a
        # short-lived "registrar-events" thread, never a caller of start() or stop().
        self.deliverer: threading.Thread | None = None
        self._draining = False  # the deliverer's alone

    def add_listener(self, listener: Listener) -> None:
        if not callable(listener):
            raise ConfigError(f"listener must be callable, got {listener!r}")
        with self.lock:
            self._listeners.append(listener)

    def add_request_listener(self, listener: RequestListener) -> None:
        if not callable(listener):
            raise ConfigError(f"listener must be callable, got {listener!r}")
        with self.lock:
            self._request_listeners.append(listener)

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
                    listeners = list(self._listeners)
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
            listeners = list(self._request_listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("request listener %r failed; ignored", listener)
