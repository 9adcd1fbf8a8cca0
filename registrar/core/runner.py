"""The runner: the registrar's thread, performing what `decide()` answers.

A short loop, as in tenacity's `Retrying.__call__`: ask `decide()` what to do after what was
just seen, log its lines, fire its trigger (with what the last request found, in one snapshot),
perform its action (a wait, a request, the failure policy) and feed the result back. Everything
that touches the network, the clock, the random source or another thread is here; every choice
is in `registrar.core.decide`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .actions import (
    Action,
    Answered,
    Check,
    Checked,
    Decision,
    Fail,
    Look,
    Looked,
    Observation,
    Probe,
    Send,
    Sent,
    Started,
    Stopping,
    Wait,
    Waited,
    WaitKind,
)
from .board import RequestEvent, StatusBoard
from .clock import Clock
from .decide import decide
from .failure import Policy, apply_policy
from .loopstate import LoopConfig, LoopState
from .machine import Trigger
from .outcome import RegisterOutcome, Route, RouteCheck, Verdict
from .redact import clean
from .transport import Gated, IdleWatcher, Transport
from .waker import Waker

__all__ = ["MAX_ERROR_TEXT", "UNEXPECTED", "Controls", "Runner"]

logger = logging.getLogger("registrar")

MAX_ERROR_TEXT = 1000
"""An error or evidence text is cut here, whatever transport made it (see core.redact.clean)."""
UNEXPECTED = "registrar_unexpected"
"""Set on the log record of an exception a transport raised instead of returning an outcome."""
_IDLE_SLICE = 3600.0
"""With no watch interval, an idle watcher is asked to wait this long at a time."""


@dataclass
class Controls:
    """What other threads use to reach the loop: the stop flag, the route-missing reports, the
    waker that ends any wait, and the gate held while a request is in flight."""

    stopping: bool = False
    reports: int = 0
    """Route-missing reports not yet acted on (coalesced into one check)."""
    wake: Waker = field(default_factory=Waker)
    gate: threading.Lock = field(default_factory=threading.Lock)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def report(self) -> None:
        with self.lock:
            self.reports += 1
        self.wake.set()

    def take_reports(self) -> int:
        with self.lock:
            taken, self.reports = self.reports, 0
        return taken


@dataclass(kw_only=True)
class Runner:
    """Performs the loop's actions for one registrar; runs on its thread only. Made of the
    registrar's parts (a dataclass: they are named where it is built)."""

    config: LoopConfig
    transport: Transport
    payload: Mapping[str, Any]
    clock: Clock
    rng: Callable[[], float]
    board: StatusBoard
    controls: Controls
    policy: Policy
    _observed: dict[str, Any] = field(default_factory=dict, init=False)
    """What the last route check found, published with the decision it leads to."""
    _unexpected_seen: set[str] = field(default_factory=set, init=False)
    _holding: bool = field(default=False, init=False)
    """Whether the last attempt was held by a `Gated` transport (logged once per hold)."""

    # ----------------------------------------------------------------- the loop

    def run(self) -> None:
        try:
            self.board.drain()  # the start, and anything a listener did about it
            self._loop()
        except BaseException as exc:  # the thread must never die silently
            logger.exception("registrar thread ended on an unexpected error")
            # One snapshot: a reader never sees the thread dead without the reason.
            self.board.update(
                last_error=f"internal error: {exc!r}",
                retrying=False,
                next_attempt_at=None,
                thread_died=True,
            )
        finally:
            try:
                self.transport.close()
                self.controls.wake.close()
            finally:
                self.board.deliver_all()

    def _loop(self) -> None:
        state = LoopState()
        seen: Observation | None = Started()
        while seen is not None:
            decision = decide(self.config, state, seen, self.clock.monotonic(), self.rng)
            for note in decision.notes:
                logger.log(note.level, note.message, *note.args)
            if not self._publish(decision, state, seen):
                return
            state = decision.state
            seen = self._perform(decision.action)

    def _publish(self, decision: Decision, before: LoopState, seen: Observation) -> bool:
        """Publish what the last request found together with the transition it leads to, in
        one snapshot (a route found missing is never shown beside `registered`). False when
        the transition was refused (stopped)."""
        observed, self._observed = self._observed, {}
        trigger = decision.trigger
        if trigger is None:
            if observed:
                self.board.update(**observed)
            return True
        status = self.board.status
        now = self.clock.time()
        if trigger is Trigger.LOSE:
            action = decision.action
            due = action.delay if isinstance(action, Wait) else None
            return self.board.transition(
                Trigger.LOSE,
                **observed,
                reregistrations=status.reregistrations + 1,
                retrying=True,
                # The rejoin is scheduled in the same snapshot as the loss.
                next_attempt_at=now + due if due else None,
            )
        if isinstance(seen, Sent):
            self.controls.take_reports()  # a report from before this PUT says nothing about it
        added = decision.state.registrations - before.registrations
        changes = {
            **observed,
            "attempt": 0,
            "last_error": None,
            "last_success_at": now,
            "next_attempt_at": None,
            "retrying": False,
            "route": decision.state.route,
            "registrations": status.registrations + added,
        }
        self.board.transition(Trigger.SUCCEED, **changes)
        return True

    def _perform(self, action: Action) -> Observation | None:
        """Do `action`; what came of it, Stopping when stop() came first, None at the end."""
        if isinstance(action, Wait):
            return self._wait(action)
        if isinstance(action, Look | Send | Probe):
            return self._hold() or self._register(action)
        if isinstance(action, Check):
            reported = self.controls.take_reports()
            check = self._check()
            return Stopping() if self.controls.stopping else Checked(check, reported)
        if isinstance(action, Fail):
            return Answered(self._fail(action))
        return None

    def _register(self, action: Look | Send | Probe) -> Observation:
        """A look before an attempt, or the attempt itself."""
        if isinstance(action, Look):
            check = self._check()
            return Stopping() if self.controls.stopping else Looked(check)
        outcome = self._attempt(action.number, isinstance(action, Send))
        return Stopping() if outcome is None else Sent(outcome)

    def _wait(self, action: Wait) -> Observation:
        kind, delay = action.kind, action.delay
        if kind is WaitKind.IDLE:
            sign = self._idle(delay)
            if sign is None:
                return Stopping()
            return Waited(kind, sign=sign, reports=self.controls.reports)
        if kind is WaitKind.BACKOFF and delay is not None:
            self.board.update(next_attempt_at=self.clock.time() + delay, retrying=True)
        if self._sleep(delay, interruptible=kind is WaitKind.CONTACT):
            return Stopping()
        return Waited(kind, reports=self.controls.reports)

    # ----------------------------------------------------------------- waiting

    def _sleep(self, delay: float | None, interruptible: bool = False) -> bool:
        """Wait `delay` seconds on the clock (None: until woken); True when stopping. With
        `interruptible`, a route-missing report ends the wait early too."""
        controls = self.controls
        end = None if delay is None else self.clock.monotonic() + delay
        while True:
            if controls.stopping:
                return True
            if interruptible and controls.reports:
                return False
            remaining = None if end is None else end - self.clock.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if self.clock.wait(controls.wake, remaining):
                if controls.stopping:
                    return True
                controls.wake.clear()

    def _idle(self, delay: float | None) -> bool | None:
        """Wait between route checks: None when stopping, True when the transport saw a sign
        that the route may be gone, False when the wait ended (timeout or a report).

        A transport that implements `IdleWatcher` waits inside itself (on its connection or a
        watch stream); any other wait is on the clock."""
        transport = self.transport
        if not isinstance(transport, IdleWatcher):
            return None if self._sleep(delay, interruptible=True) else False
        controls = self.controls
        end = None if delay is None else self.clock.monotonic() + delay
        while not controls.stopping:
            if controls.reports:
                return False
            if controls.wake.is_set():
                controls.wake.clear()
                continue
            remaining = _IDLE_SLICE if end is None else end - self.clock.monotonic()
            if remaining <= 0:
                return False
            try:
                changed = transport.wait_idle(remaining, controls.wake)
            except Exception as exc:
                self._unexpected("wait_idle", exc)
                # This slice is waited on the clock instead; the route checks go on.
                return None if self._sleep(remaining, interruptible=True) else False
            if changed:
                return None if controls.stopping else True
        return None

    def _hold(self) -> Observation | None:
        """While a `Gated` transport has nothing to offer (the served process is not ready),
        wait `ready_interval` in place of the attempt: None when it may go ahead."""
        gate = self.transport
        if not isinstance(gate, Gated):
            return None
        try:
            reason = gate.not_ready()
        except Exception as exc:
            reason = self._unexpected("not_ready", exc)
        if reason is None:
            self._holding = False
            return None
        if not self._holding:
            logger.info("%s: not offered yet: %s", self.config.url, clean(reason, 200))
            self._holding = True
        self.board.update(last_error=f"not offered yet: {clean(reason, MAX_ERROR_TEXT)}")
        if self._sleep(gate.ready_interval):
            return Stopping()
        return Waited(WaitKind.READY, reports=self.controls.reports)

    # ----------------------------------------------------------------- requests

    def _attempt(self, number: int, scheduled: bool) -> RegisterOutcome | None:
        """Send one registration, or None when stopping. A refusal outside the backoff
        schedule (`scheduled=False`) is a free probe: it is not counted in `attempts_total` nor
        reported to request listeners."""
        with self.controls.gate:
            if self.controls.stopping:
                return None
            self.board.update(attempt=number, next_attempt_at=None, retrying=True)
            started = time.monotonic()
            try:
                outcome = self.transport.register(self.payload)
            except Exception as exc:
                outcome = RegisterOutcome(Verdict.RETRY, error=self._unexpected("register", exc))
            duration = time.monotonic() - started
        if outcome.error:  # any transport's words: one escaped, capped line in logs and status
            outcome = replace(outcome, error=clean(outcome.error, MAX_ERROR_TEXT))
        probe = not scheduled and outcome.refused and outcome.verdict is Verdict.RETRY
        changes: dict[str, Any] = {
            "server_reachable": outcome.reachable,
            "last_request_at": self.clock.time(),
        }
        if not probe:
            changes["attempts_total"] = self.board.status.attempts_total + 1
        if outcome.verdict is not Verdict.ACCEPTED:
            changes["last_error"] = outcome.error
        self.board.update(**changes)
        if not probe:
            event = RequestEvent("register", outcome.verdict.value, duration, outcome.status_code)
            self.board.emit(event)
        return outcome

    def _check(self) -> RouteCheck | None:
        """Check the route once; what it found is published with the decision it leads to."""
        with self.controls.gate:
            if self.controls.stopping:
                return None
            started = time.monotonic()
            try:
                check = self.transport.check(self.payload)
            except Exception as exc:
                evidence = self._unexpected("check", exc)
                check = RouteCheck(Route.UNDETERMINED, evidence=evidence)
            duration = time.monotonic() - started
        if check is None:
            return None
        if check.evidence:
            check = replace(check, evidence=clean(check.evidence, MAX_ERROR_TEXT))
        now = self.clock.time()
        self._observed = {
            "last_check_at": now,
            "last_request_at": now,
            "server_reachable": check.reachable,
            "route": check.route.value,
        }
        self.board.emit(RequestEvent("check", check.route.value, duration, check.status_code))
        return check

    def _unexpected(self, call: str, exc: Exception) -> str:
        """The transport broke its contract ("never raises"): this is the one place that holds
        it for every transport. The exception becomes a failed attempt (an undetermined check,
        a wait on the clock for `wait_idle`) and the loop goes on; its traceback is logged once
        per exception type, marked `registrar_unexpected` so the test suite fails on it
        (tests/conftest.py) instead of a bug hiding behind a retry."""
        kind = type(exc).__name__
        if kind not in self._unexpected_seen:
            self._unexpected_seen.add(kind)
            counted = {"register": "a failed attempt", "check": "an undetermined check"}
            logger.error(
                "the transport raised %s in %s (a bug: a transport must not raise); "
                "taken as %s, not logged again",
                kind,
                call,
                counted.get(call, "a wait on the clock"),
                exc_info=exc,
                extra={UNEXPECTED: True},
            )
        # The message may quote anything (a header, a secret): status shows the type only.
        return f"unexpected {kind} in the transport's {call} (see the log)"

    # ----------------------------------------------------------------- failing

    def _fail(self, action: Fail) -> bool:
        """Go to FAILED and apply `on_failure`; True when attempts go on."""
        return apply_policy(
            self.board, self.clock, self.policy, action, lambda: self.controls.stopping
        )
