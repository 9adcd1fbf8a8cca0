"""The runner: the registrar's thread, performing what `decide()` answers; everything that touches
the network, the clock, the random source or another thread is here, every choice in `decide`."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from . import _actions as act
from ._board import Changes, RequestEvent, State, StatusBoard, Trigger
from ._clock import Waker
from ._decide import MAX_ERROR_TEXT, decide
from ._redact import clean
from ._settings import POLICIES, Hooks, LoopSettings, OnFailureName
from ._transport import Gated, IdleWatcher, RegisterOutcome, Route, RouteCheck, Transport, Verdict

logger = logging.getLogger("registrar")

UNEXPECTED = "registrar_unexpected"
"""Set on the log record of an exception a transport raised instead of returning an outcome."""
_IDLE_SLICE = 3600.0  # with no watch interval, an idle watcher is asked to wait this long at a time


@dataclass
class Controls:
    """What other threads use to reach the loop; `gate` is held while a request is in flight."""

    stopping: bool = False
    reports: int = 0  # route-missing reports not yet acted on (coalesced into one check)
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
    """The parts of one registrar's loop; `run` is its thread, `controls` how others reach it."""

    settings: LoopSettings
    fleet: int
    transport: Transport
    payload: Mapping[str, Any]
    hooks: Hooks
    board: StatusBoard
    controls: Controls = field(default_factory=Controls)
    _unexpected_seen: set[str] = field(default_factory=set, init=False)

    def run(self) -> None:
        try:
            self.board.drain()  # the start, and anything a listener did about it
            self._loop()
        except BaseException as exc:  # the thread must never die silently
            logger.exception("registrar thread ended on an unexpected error")
            died = Changes(thread_died=True, retrying=False, next_attempt_at=None)
            self.board.apply(None, died | {"last_error": f"internal error: {exc!r}"})
        finally:
            try:
                self.transport.close()
                self.controls.wake.close()
            finally:
                self.board.deliver_all()

    def _loop(self) -> None:
        state = act.LoopState(fleet=self.fleet, url=self.transport.display_url)
        seen: act.Observation | None = act.Started()
        while seen is not None:
            now = self.hooks.clock.monotonic()
            decision = decide(self.settings, self.board.status, state, seen, now, self.hooks.rng)
            for note in decision.notes:
                logger.log(note.level, note.message, *note.args)
            if not self._apply(decision, seen):
                return  # its trigger was refused: stopped
            state = decision.state
            seen = self._perform(decision.action)

    def _apply(self, decision: act.Decision, seen: act.Observation) -> bool:
        """Publish the decision's status change in one snapshot; False when its trigger was
        refused. A backoff wait is published as when the next attempt is due."""
        changes, action = decision.changes, decision.action
        if isinstance(action, act.Wait) and action.kind is act.WaitKind.BACKOFF and action.delay:
            changes = changes | {"next_attempt_at": self.hooks.clock.time() + action.delay}
            changes["retrying"] = True
        if decision.trigger is Trigger.SUCCEED and isinstance(seen, act.Sent):
            self.controls.take_reports()  # a report from before this PUT says nothing about it
        return self.board.apply(decision.trigger, changes)

    def _perform(self, action: act.Action) -> act.Observation | None:
        """Do `action`; what came of it, Stopping when stop() came first, None at the end."""
        if isinstance(action, act.Wait):
            return self._wait(action)
        if isinstance(action, act.Look | act.Send):
            return self._register(action)
        if isinstance(action, act.Check):
            reported, check = self.controls.take_reports(), self._check()
            at = self.hooks.clock.time()
            return act.Stopping() if self.controls.stopping else act.Checked(check, reported, at)
        if isinstance(action, act.Fail):
            return act.Answered(self._answer())
        if action.exit_code is not None:
            self.hooks.exit(action.exit_code)
        return None

    def _register(self, action: act.Look | act.Send) -> act.Observation:
        """A look or an attempt; `Held` instead while a `Gated` transport has nothing to offer."""
        gate = self.transport
        if isinstance(gate, Gated):
            try:
                reason = gate.not_ready()
            except Exception as exc:
                reason = self._unexpected("not_ready", exc)
            if reason is not None:
                return act.Held(reason, gate.ready_interval)
        if isinstance(action, act.Look):
            check, at = self._check(), self.hooks.clock.time()
            return act.Stopping() if self.controls.stopping else act.Looked(check, at)
        return self._attempt(action)

    def _wait(self, action: act.Wait) -> act.Observation:
        kind = action.kind
        if kind is act.WaitKind.IDLE and isinstance(self.transport, IdleWatcher):
            sign = self._idle(self.transport, action.delay)
        else:
            sign = self._sleep(action.delay, kind in (act.WaitKind.IDLE, act.WaitKind.CONTACT))
        return act.Stopping() if sign is None else act.Waited(kind, sign, self.controls.reports)

    def _sleep(self, delay: float | None, interruptible: bool) -> bool | None:
        """Wait `delay` seconds on the clock (None: until woken); None when stopping, else False.
        With `interruptible`, a route-missing report ends the wait early too."""
        controls = self.controls
        end = None if delay is None else self.hooks.clock.monotonic() + delay
        while True:
            if controls.stopping:
                return None
            if interruptible and controls.reports:
                return False
            remaining = None if end is None else end - self.hooks.clock.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if self.hooks.clock.wait(controls.wake, remaining):
                controls.wake.clear()  # a stop is seen at the top of the loop

    def _idle(self, transport: IdleWatcher, delay: float | None) -> bool | None:
        """Wait between route checks inside the transport: None when stopping, True on a sign
        that the route may be gone, False on timeout or a report."""
        controls = self.controls
        end = None if delay is None else self.hooks.clock.monotonic() + delay
        while not controls.stopping:
            if controls.reports:
                return False
            if controls.wake.is_set():
                controls.wake.clear()
                continue
            remaining = _IDLE_SLICE if end is None else end - self.hooks.clock.monotonic()
            if remaining <= 0:
                return False
            try:
                changed = transport.wait_idle(remaining, controls.wake)
            except Exception as exc:
                self._unexpected("wait_idle", exc)
                # This slice is waited on the clock instead; the route checks go on.
                return self._sleep(remaining, interruptible=True)
            if changed:
                return None if controls.stopping else True
        return None

    def _attempt(self, action: act.Send) -> act.Observation:
        """Send one registration, published as in flight when sent, not when decided (a `Gated`
        hold moves no counter); a refused probe is free (`Sent.free`): not reported."""
        with self.controls.gate:
            if self.controls.stopping:
                return act.Stopping()
            in_flight = Changes(attempt=action.number, next_attempt_at=None, retrying=True)
            self.board.apply(None, in_flight)
            started = time.monotonic()
            try:
                outcome = self.transport.register(self.payload)
            except Exception as exc:
                outcome = RegisterOutcome(Verdict.RETRY, error=self._unexpected("register", exc))
            duration = time.monotonic() - started
        if outcome.error:  # any transport's words: one escaped, capped line in logs and status
            outcome = replace(outcome, error=clean(outcome.error, MAX_ERROR_TEXT))
        sent = act.Sent(outcome, action.scheduled, self.hooks.clock.time())
        if not sent.free:
            event = RequestEvent("register", outcome.verdict.value, duration, outcome.status_code)
            self.board.emit(event)
        return sent

    def _check(self) -> RouteCheck | None:
        """Check the route once; what it found is published by the decision it leads to."""
        with self.controls.gate:
            if self.controls.stopping:
                return None
            started = time.monotonic()
            try:
                check = self.transport.check(self.payload)
            except Exception as exc:
                check = RouteCheck(Route.UNDETERMINED, evidence=self._unexpected("check", exc))
            duration = time.monotonic() - started
        if check is None:
            return None
        check = replace(check, evidence=clean(check.evidence, MAX_ERROR_TEXT))
        self.board.emit(RequestEvent("check", check.route.value, duration, check.status_code))
        return check

    def _unexpected(self, call: str, exc: Exception) -> str:
        """The transport broke its contract ("never raises"): the one place that holds it. The
        loop goes on; the traceback is logged once per type, marked `registrar_unexpected` so the
        test suite fails on it (tests/conftest.py) instead of a bug hiding behind a retry."""
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

    def _answer(self) -> OnFailureName:
        """What `on_failure` says ("stop" when stopping, failing or answering nonsense). A callable
        is given the FAILED snapshot before it is published: no reader sees "failed, nothing
        scheduled" while it decides to retry."""
        policy = self.settings.on_failure
        answer: object = policy
        if callable(policy):
            failed = replace(
                self.board.status, state=State.FAILED, next_attempt_at=None, retrying=False
            )
            try:
                answer = policy(failed)
            except Exception:
                logger.exception("on_failure callable failed; staying failed")
                answer = None
            if answer is not None and answer not in POLICIES:
                logger.error("on_failure callable answered %r; staying failed", answer)
        if answer not in POLICIES or (answer == "retry" and self.controls.stopping):
            return "stop"
        return answer  # type: ignore[return-value]
