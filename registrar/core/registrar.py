"""The registrar: one daemon thread that drives the registration to the desired state.

Data flows one way: options -> `Registrar` -> its thread asks the transport to act -> the outcome
fires a trigger on the state machine -> a new immutable `Status` -> listeners read it. The thread
never holds a lock while it talks to the network, so `status()` never blocks, and `stop()` wakes
it out of any wait.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from .aio import wait_for_state
from .backoff import (
    DEFAULT_MAX_RETRY_AFTER,
    Backoff,
    contact_delay,
    first_watch_delay,
    probe_delay,
    rejoin_delay,
    retry_delay,
    watch_delay,
)
from .clock import Clock, SystemClock
from .errors import ConfigError, StateError
from .machine import State, Trigger, build_machine, fire
from .outcome import RegisterOutcome, Route, RouteCheck, Verdict
from .redact import clean
from .registry import TransportOptions, make_transport
from .status import Status
from .transport import (
    Abortable,
    FleetSized,
    Gated,
    IdleWatcher,
    Token,
    Transport,
    validate_timeout,
    validate_url,
)
from .untrusted import MAX_DEPTH, nesting_depth
from .waker import Waker

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_WATCH_INTERVAL",
    "EXIT_CODE",
    "REPORT_CHECK_INTERVAL",
    "REPORT_LOG_INTERVAL",
    "UNEXPECTED",
    "Listener",
    "OnFailure",
    "Registrar",
    "RequestEvent",
    "RequestListener",
]

logger = logging.getLogger("registrar")

OnFailureName = Literal["retry", "stop", "exit"]
OnFailure = OnFailureName | Callable[[Status], OnFailureName | None]
"""What to do when the startup budget is spent. A callable is given the FAILED status and
answers with one of the names (None means "stop")."""

Listener = Callable[[State, State, Status], None]
"""Called as fn(old_state, new_state, status) after every transition, outside any lock."""

DEFAULT_BACKOFF = Backoff(initial=1.0, multiplier=2.0, maximum=5.0, jitter=0.25)
"""The upstream schedule capped at 5 s (see docs/benchmarks.md for the figures behind it)."""
DEFAULT_WATCH_INTERVAL = 15.0
"""Seconds between route checks. A restart is noticed on the idle connection, not by this
timer, which remains for what sends no close (a partition, a host that vanished): 15 s costs
about 0.01 % of a core and 4 requests a minute per registrar and recovers from a partition
within 1.2 intervals + 1 s (docs/benchmarks.md)."""
EXIT_CODE = 3
"""Process exit status for on_failure="exit"."""
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024
_POLICIES = ("retry", "stop", "exit")
MAX_ERROR_TEXT = 1000
"""An error or evidence text is cut here, whatever transport made it (see core.redact.clean)."""
UNEXPECTED = "registrar_unexpected"
"""Set on the log record of an exception a transport raised instead of returning an outcome."""
REPORT_CHECK_INTERVAL = 1.0
"""At most one route check per this many seconds is caused by `report_route_missing()`, however
often it is called (a decode failing every transfer calls it ~1000 times a second)."""
REPORT_LOG_INTERVAL = 60.0
"""At most one warning per this many seconds says that reports were contradicted by the server."""
MAX_BROKEN_CHECKS = 3
"""Route checks in a row whose connection broke that are retried at the probe cadence before
the loop falls back to the watch interval."""
_LOOKS_AFTER_UNANSWERED = 3
"""Looks (route checks) made after an attempt that may have reached the server unanswered,
before it is sent again; each lost look waits the backoff."""
_IDLE_SLICE = 3600.0
"""With no watch interval, an idle watcher is asked to wait this long at a time."""


_REGISTRARS: weakref.WeakSet[Registrar] = weakref.WeakSet()
"""Every registrar of this process, for the fork hooks (weak: a hook keeps none alive)."""


def _before_fork() -> None:
    for registrar in list(_REGISTRARS):
        registrar._running_at_fork = registrar.running


def _after_fork_in_child() -> None:
    for registrar in list(_REGISTRARS):
        registrar._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


@dataclass(frozen=True)
class RequestEvent:
    """One request the registrar sent, for metrics: what, how it ended, how long it took."""

    kind: Literal["register", "check"]
    result: str
    """The verdict of a registration or the route a check found."""
    duration: float
    status_code: int | None


RequestListener = Callable[[RequestEvent], None]


def _default_exit(code: int) -> None:
    """End the process now: the registrar's thread cannot raise SystemExit into the main one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _check_positive(name: str, value: object, allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value < float("inf")
    ):
        extra = " or None" if allow_none else ""
        raise ConfigError(f"{name} must be a positive number of seconds{extra}, got {value!r}")
    return float(value)


def _fleet_size(transport: Transport, payload: Mapping[str, Any]) -> int:
    """How many clients share this server, from the transport when it knows (else 1)."""
    if not isinstance(transport, FleetSized):
        return 1
    try:
        size = transport.fleet_size(payload)
    except Exception:
        logger.exception("fleet_size() of %r failed; assuming a fleet of one", transport)
        return 1
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        return 1
    return size


def _encode_payload(payload: object, limit: int) -> dict[str, Any]:
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        raise ConfigError(f"payload must be a mapping (a JSON object), got {kind}")
    # Counted without recursion first: json.dumps would raise RecursionError, not a ConfigError.
    if nesting_depth(dict(payload), MAX_DEPTH) > MAX_DEPTH:
        raise ConfigError(
            f"payload is nested more than {MAX_DEPTH} levels deep (or contains itself); "
            "registration payloads are flat objects"
        )
    try:
        encoded = json.dumps(payload, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"payload is not JSON-serialisable: {exc}") from None
    size = len(encoded.encode())
    if size > limit:
        raise ConfigError(
            f"payload is {size} bytes, over max_payload_bytes={limit}; "
            "shrink it or raise max_payload_bytes"
        )
    # A private copy: later changes to the caller's mapping cannot reach the thread.
    decoded: dict[str, Any] = json.loads(encoded)
    return decoded


class Registrar:
    """Registers `payload` with the bootstrap server at `url` and keeps it registered.

    `start()` returns at once; the work happens in one daemon thread named "registrar".
    The default protocol is SGLang's (`PUT {url}/route`, the rank's route watched afterwards);
    `protocol="http"` sends the payload to `{url}/route` without watching; other names come from
    `registrar.core.registry`, and `transport=` plugs in any `Transport` directly.
    """

    def __init__(
        self,
        url: str,
        payload: Mapping[str, Any],
        *,
        backoff: Backoff = DEFAULT_BACKOFF,
        max_attempts: int | None = 5,
        max_elapsed: float | None = None,
        on_failure: OnFailure = "retry",
        watch_interval: float | None = DEFAULT_WATCH_INTERVAL,
        timeout: float | tuple[float, float] = 5.0,
        token: Token | None = None,
        protocol: str = "sglang",
        transport: Transport | None = None,
        verify: bool = True,
        ca_bundle: str | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
        clock: Clock | None = None,
        rng: Callable[[], float] | None = None,
        exit: Callable[[int], None] | None = None,
    ) -> None:
        url = validate_url(url)
        if not isinstance(backoff, Backoff):
            raise ConfigError(f"backoff must be a registrar.Backoff, got {backoff!r}")
        if max_attempts is not None and (
            isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1
        ):
            raise ConfigError(f"max_attempts must be an integer >= 1 or None, got {max_attempts!r}")
        if not callable(on_failure) and on_failure not in _POLICIES:
            raise ConfigError(
                f"on_failure must be 'retry', 'stop', 'exit' or a callable, got {on_failure!r}"
            )
        self._watch_interval = _check_positive("watch_interval", watch_interval, allow_none=True)
        self._max_elapsed = _check_positive("max_elapsed", max_elapsed, allow_none=True)
        timeout = validate_timeout(timeout)
        if (
            token is not None
            and not callable(token)
            and (not isinstance(token, str) or "\n" in token or "\r" in token)
        ):
            raise ConfigError(
                "token must be a single-line string, or a callable answering one per request"
            )
        if ca_bundle is not None and not os.path.isfile(ca_bundle):
            raise ConfigError(f"ca_bundle {ca_bundle!r} is not a readable file")
        if (
            isinstance(max_payload_bytes, bool)
            or not isinstance(max_payload_bytes, int)
            or (max_payload_bytes < 1)
        ):
            raise ConfigError(
                f"max_payload_bytes must be a positive integer, got {max_payload_bytes!r}"
            )
        if (
            isinstance(max_retry_after, bool)
            or not isinstance(max_retry_after, int | float)
            or not 0 <= max_retry_after < float("inf")
        ):
            raise ConfigError(
                f"max_retry_after must be a number of seconds >= 0 (0 ignores Retry-After), "
                f"got {max_retry_after!r}"
            )
        self._max_retry_after = float(max_retry_after)
        payload = _encode_payload(payload, max_payload_bytes)
        if transport is None:
            tls: bool | str = ca_bundle if ca_bundle is not None else bool(verify)
            options = TransportOptions(url, token=token, timeout=timeout, verify=tls)
            transport, payload = make_transport(protocol, payload, options)
        elif not isinstance(transport, Transport):
            raise ConfigError(f"transport must implement registrar.Transport, got {transport!r}")

        self._payload = payload
        self._transport = transport
        self._backoff = backoff
        self._max_attempts = max_attempts
        self._on_failure = on_failure
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rng = rng if rng is not None else random.random
        self._exit = exit if exit is not None else _default_exit

        machine, self._model = build_machine()
        self._machine = machine
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._status = Status(
            state=State.UNREGISTERED, since=self._clock.time(), url=transport.display_url
        )
        self._listeners: list[Listener] = []
        self._request_listeners: list[RequestListener] = []
        self._pending: deque[tuple[State, State, Status]] = deque()
        self._deliverer: threading.Thread | None = None
        """The one thread that calls listeners: the loop thread while it runs, else a short-lived
        "registrar-events" thread. Never a caller of start() or stop()."""
        self._draining = False  # the deliverer's alone
        self._wake = Waker()
        self._gate = threading.Lock()
        self._stopping = False
        self._reports = 0
        """Route-missing reports not yet acted on (coalesced into one check)."""
        self._reports_unheeded = 0  # reports answered "present", not yet logged
        self._reports_logged_at: float | None = None
        self._last_check_started: float | None = None
        self._thread: threading.Thread | None = None
        self._ever_registered = False
        self._lost_after_put = 0  # the loop thread's alone
        self._unexpected_seen: set[str] = set()  # the loop thread's alone
        self._pid = os.getpid()
        self._forked_from: int | None = None
        self._running_at_fork = False
        _REGISTRARS.add(self)
        self._fleet = _fleet_size(transport, payload)

    # ----------------------------------------------------------------- public API

    @property
    def state(self) -> State:
        """The current state."""
        return self._status.state

    @property
    def payload(self) -> dict[str, Any]:
        """A copy of the payload being registered."""
        return dict(self._payload)

    @property
    def running(self) -> bool:
        """True while the registrar's thread is alive."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread_died(self) -> bool:
        """True when no thread will update the status again: the registrar's thread ended on an
        unexpected error, or this process is a fork (see `Status.thread_died`)."""
        return self._status.thread_died

    def status(self) -> Status:
        """The latest snapshot; never blocks on the loop or a request in flight."""
        return self._status

    def __repr__(self) -> str:
        return f"<Registrar {self._status.url} {self._status.state.value}>"

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(old_state, new_state, status)` after every transition, in order, from
        the registrar's own thread (never from the caller of `start()` or `stop()`)."""
        if not callable(listener):
            raise ConfigError(f"listener must be callable, got {listener!r}")
        with self._lock:
            self._listeners.append(listener)

    def add_request_listener(self, listener: RequestListener) -> None:
        """Call `listener(RequestEvent)` after every request (for metrics)."""
        if not callable(listener):
            raise ConfigError(f"listener must be callable, got {listener!r}")
        with self._lock:
            self._request_listeners.append(listener)

    def start(self) -> Registrar:
        """Start the thread and return at once; a second call does nothing. Listeners hear the
        start from the registrar's thread, so a slow (or stopping) listener cannot hold this."""
        with self._changed:
            if self._stopping:
                raise StateError(
                    "this Registrar was stopped and cannot start again; create a new one"
                )
            if self._forked_from is not None:
                raise StateError(
                    f"this Registrar runs in pid {self._forked_from}, of which this process is "
                    "a fork; a second thread would register the same route again: create and "
                    "start Registrars after forking, one per route"
                )
            if self._thread is not None:
                return self
            thread = threading.Thread(target=self._run, name="registrar", daemon=True)
            # Created, handed the delivery and started under the lock: stop() never sees a
            # thread that exists but cannot be joined yet.
            self._thread = thread
            self._deliverer = thread
            self._fire(Trigger.START, {})
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop for good, within `timeout` seconds whatever the listeners do: wake the thread,
        wait for a request in flight, and return whether the thread has ended. No request is
        sent after this returns True. Listeners hear the stop from the registrar's thread (or a
        helper thread), waited for only within the same `timeout`."""
        deadline = time.monotonic() + max(0.0, timeout)
        me = threading.current_thread()
        with self._lock:
            self._stopping = True
            thread = self._thread
        self._wake.set()
        if self._forked_from is None and isinstance(self._transport, Abortable):
            # A request in flight need not run to its deadline: its answer no longer matters.
            self._transport.abort()
        self._transition(Trigger.STOP)
        ended = True
        if thread is not None and thread is not me:
            # Once the gate is ours, the thread is not inside a request and will see the flag.
            if self._gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self._gate.release()
            thread.join(max(0.0, deadline - time.monotonic()))
            ended = not thread.is_alive()
        with self._changed:
            if self._deliverer is not me:
                self._changed.wait_for(
                    lambda: self._deliverer is None, max(0.0, deadline - time.monotonic())
                )
        return ended

    def wait_for(self, state: State, timeout: float | None = None) -> bool:
        """Block until the registrar is in `state`; False if `timeout` seconds pass first."""
        target = State(state)
        with self._changed:
            return self._changed.wait_for(lambda: self._status.state is target, timeout)

    def report_route_missing(self) -> None:
        """Say the route is gone (e.g. decode reported this rank unknown): the thread wakes,
        verifies, and registers again without waiting for the next watch interval.

        Cheap and safe to call at any rate: reports are coalesced into one check, at most one
        check per `REPORT_CHECK_INTERVAL` seconds, and a report the server contradicts is
        logged at most once per `REPORT_LOG_INTERVAL` seconds (with the count it stands for)."""
        with self._lock:
            self._reports += 1
        self._wake.set()

    def __enter__(self) -> Registrar:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def wait_for_async(self, state: State, timeout: float | None = None) -> bool:
        """`wait_for` for a coroutine: waits without blocking the event loop."""
        return await wait_for_state(self, state, timeout)

    async def __aenter__(self) -> Registrar:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        # stop() may wait for a request in flight: in a worker thread, not on the loop.
        await asyncio.to_thread(self.stop)

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload, multiprocessing "fork"): only the thread that
        forked exists here. Locks another thread held are re-made, and a registrar whose
        thread was running says so: this copy of its status would otherwise answer health
        from the moment of the fork, for ever. No thread is started here: the parent's thread
        still holds the registration, and a second one would PUT the same route again (a PUT
        is not idempotent)."""
        parent, self._pid = self._pid, os.getpid()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._gate = threading.Lock()
        self._wake = Waker()
        self._machine, self._model = build_machine(self._status.state)
        self._pending.clear()
        self._deliverer = None
        self._draining = False
        if not self._running_at_fork:
            return  # never started, or already ended: the copy is as true here as there
        self._forked_from = parent
        self._status = replace(
            self._status,
            thread_died=True,
            retrying=False,
            next_attempt_at=None,
            last_error=(
                f"this process (pid {self._pid}) is a fork of pid {parent}, where the "
                "registrar's thread runs; this copy cannot know the registration: start the "
                "Registrar in this process, or serve health from the parent "
                "(docs/operations.md)"
            ),
        )

    # ----------------------------------------------------------------- state and listeners

    def _publish(self, status: Status) -> None:
        """Replace the snapshot (the lock held). The one rule every snapshot obeys whoever
        wrote it: once stopped, nothing is scheduled, whatever the loop was about to say."""
        if status.state is State.STOPPED and (status.retrying or status.next_attempt_at):
            status = replace(status, retrying=False, next_attempt_at=None)
        self._status = status
        self._changed.notify_all()

    def _update(self, **changes: Any) -> Status:
        """Change fields of the snapshot at once: a reader sees all of them or none."""
        with self._changed:
            self._publish(replace(self._status, **changes))
            return self._status

    def _fire(self, trigger: Trigger, changes: dict[str, Any]) -> bool:
        """Fire `trigger` and publish the new state with `changes` in one snapshot (the lock
        held); the transition is queued for the listeners."""
        old = self._status.state
        if not fire(self._model, trigger):
            return False
        new = State(self._model.state)
        self._publish(replace(self._status, state=new, since=self._clock.time(), **changes))
        self._pending.append((old, new, self._status))
        if self._deliverer is None:
            # No registrar thread to deliver it (not started, ended, or a forked child).
            helper = threading.Thread(target=self._deliver_all, name="registrar-events")
            helper.daemon = True
            self._deliverer = helper
            helper.start()
        return True

    def _transition(self, trigger: Trigger, **changes: Any) -> bool:
        with self._changed:
            fired = self._fire(trigger, changes)
            mine = self._deliverer is threading.current_thread()
        if fired and mine:
            self._drain()
        return fired

    def _drain(self) -> None:
        """Call the listeners for every queued transition, in order; the deliverer only. A
        listener that causes a transition has it delivered after its own, by this loop."""
        if self._draining:
            return
        self._draining = True
        try:
            while True:
                with self._lock:
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

    def _deliver_all(self) -> None:
        """Drain until nothing is queued, then give up the deliverer's role (stop() waits for
        that, within its timeout)."""
        while True:
            self._drain()
            with self._changed:
                if not self._pending:
                    self._deliverer = None
                    self._changed.notify_all()
                    return

    def _emit(self, event: RequestEvent) -> None:
        with self._lock:
            listeners = list(self._request_listeners)
        for listener in listeners:
            try:
                listener(event)
            except Exception:
                logger.exception("request listener %r failed; ignored", listener)

    # ----------------------------------------------------------------- the loop

    def _run(self) -> None:
        try:
            self._drain()  # the start, and anything a listener did about it
            first_delay = 0.0
            while True:
                if not self._register(first_delay):
                    return
                delay = self._watch()
                if delay is None:
                    return
                first_delay = delay
        except BaseException as exc:  # the thread must never die silently
            logger.exception("registrar thread ended on an unexpected error")
            # One snapshot: a reader never sees the thread dead without the reason.
            self._update(
                last_error=f"internal error: {exc!r}",
                retrying=False,
                next_attempt_at=None,
                thread_died=True,
            )
        finally:
            try:
                self._transport.close()
                self._wake.close()
            finally:
                self._deliver_all()

    def _sleep(self, delay: float | None, interruptible: bool = False) -> bool:
        """Wait `delay` seconds on the clock (None: until woken); True when stopping. With
        `interruptible`, a route-missing report ends the wait early too."""
        end = None if delay is None else self._clock.monotonic() + delay
        while True:
            if self._stopping:
                return True
            if interruptible and self._reports:
                return False
            remaining = None if end is None else end - self._clock.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            if self._clock.wait(self._wake, remaining):
                if self._stopping:
                    return True
                self._wake.clear()

    def _idle(self, delay: float | None) -> bool | None:
        """Wait between route checks: None when stopping, True when the transport saw a sign
        that the route may be gone, False when the wait ended (timeout or a report).

        A transport that implements `IdleWatcher` waits inside itself (on its connection or a
        watch stream); any other wait is on the clock."""
        watcher = self._transport if isinstance(self._transport, IdleWatcher) else None
        if watcher is None:
            return None if self._sleep(delay, interruptible=True) else False
        end = None if delay is None else self._clock.monotonic() + delay
        while True:
            if self._stopping:
                return None
            if self._reports:
                return False
            if self._wake.is_set():
                self._wake.clear()
                continue
            remaining = _IDLE_SLICE if end is None else end - self._clock.monotonic()
            if remaining <= 0:
                return False
            try:
                changed = watcher.wait_idle(remaining, self._wake)
            except Exception as exc:
                self._unexpected("wait_idle", exc)
                # This slice is waited on the clock instead; the route checks go on.
                return None if self._sleep(remaining, interruptible=True) else False
            if changed:
                return None if self._stopping else True

    def _register(self, first_delay: float) -> bool:
        """Attempt until accepted (True) or until stopping or giving up for good (False).

        A refused connection means nothing listens: the loop probes again at a short cadence
        (`probe_delay`) instead of backing off, so it registers within a probe of the server
        appearing. The budget still counts attempts on the backoff schedule: a refused
        attempt is counted only when the schedule would have made it (`due`); the probes in
        between are free, so `max_attempts` spans the same time as without probing."""
        startup = not self._ever_registered
        started = self._clock.monotonic()
        streak = 0
        due: float | None = None  # when the next counted attempt is due, while refused
        delay = first_delay
        # Look before the first registration until the server has answered a look once; not
        # right after a refused attempt (nothing listened: there is nothing to look at).
        looked = refused = False
        # Looks still owed after an attempt that may have reached the server unanswered (a lost
        # answer, a deadline): a server that counts every PUT must not count this one twice.
        unanswered = 0
        while True:
            if delay > 0:
                self._update(next_attempt_at=self._clock.time() + delay, retrying=True)
                if self._sleep(delay):
                    return False
            waited = self._await_ready()
            if waited is None:
                return False
            if waited:  # the startup budget counts from when there was something to offer
                started = self._clock.monotonic()
            if (startup and not looked and not refused) or unanswered:
                adopted = self._look_first(ours=unanswered > 0)
                if adopted is None:
                    return False
                if adopted:
                    return True
                reached = self._status.server_reachable is True
                looked = looked or reached
                if unanswered and not reached:
                    # The look was lost too: look again after the backoff (a few times) before
                    # sending what the server may already hold.
                    unanswered -= 1
                    if unanswered:
                        delay = retry_delay(
                            self._backoff, max(streak, 1), self._rng(), None, self._max_retry_after
                        )
                        continue
                unanswered = 0
            counted = due is None or self._clock.monotonic() >= due
            outcome = self._attempt(streak + 1, counted)
            if outcome is None:
                return False
            if outcome.verdict is Verdict.ACCEPTED:
                self._on_accepted(streak + 1)
                return True
            refused = outcome.refused and outcome.verdict is Verdict.RETRY
            if outcome.verdict is Verdict.RETRY and not refused and outcome.status_code is None:
                unanswered = _LOOKS_AFTER_UNANSWERED
            probe_wait = probe_delay(self._fleet, self._rng()) if refused else 0.0
            if refused and not counted:
                delay = probe_wait
                if not (
                    startup
                    and self._status.state is State.REGISTERING
                    and self._out_of_time(started, delay)
                ):
                    continue
                # The next probe would start past max_elapsed: this refusal is the last try.
            streak += 1
            if outcome.verdict is Verdict.FATAL:
                # Retrying cannot help until someone fixes the configuration (a token, a URL,
                # a certificate), which may happen on the server's side: with "retry", try
                # again slowly, at the backoff's cap.
                due = None
                delay = self._backoff.maximum * (1 - self._backoff.jitter * self._rng())
                if self._status.state is State.FAILED:
                    logger.warning(
                        "registration with %s still refused: %s; next attempt in %.2f s",
                        self._status.url,
                        outcome.error,
                        delay,
                    )
                    continue
                if not self._fail(streak, outcome, delay, fatal=True):
                    return False
                continue
            delay = retry_delay(
                self._backoff, streak, self._rng(), outcome.retry_after, self._max_retry_after
            )
            due = None
            if refused:
                due = self._clock.monotonic() + delay
                delay = probe_wait
            spent = (
                startup
                and self._status.state is State.REGISTERING
                and (
                    (self._max_attempts is not None and streak == self._max_attempts)
                    or self._out_of_time(started, delay)
                )
            )
            if spent:
                if not self._fail(streak, outcome, delay, fatal=False):
                    return False
                continue
            if refused:
                assert due is not None
                logger.warning(
                    "registration attempt %s to %s failed: %s; next attempt in %.2f s "
                    "(nothing listens: probing every ~%.2f s, the next counted attempt in %.2f s)",
                    self._attempt_label(streak),
                    self._status.url,
                    outcome.error,
                    delay,
                    probe_delay(self._fleet, 0.5),
                    due - self._clock.monotonic(),
                )
                continue
            logger.warning(
                "registration attempt %s to %s failed: %s; next attempt in %.2f s",
                self._attempt_label(streak),
                self._status.url,
                outcome.error,
                delay,
            )

    def _await_ready(self) -> bool | None:
        """Hold the next attempt while a `Gated` transport says there is nothing to offer yet
        (the served process is not ready). True when it waited, False when it did not have
        to, None when stopping."""
        gate = self._transport if isinstance(self._transport, Gated) else None
        if gate is None:
            return False
        waited = False
        while True:
            try:
                reason = gate.not_ready()
            except Exception as exc:
                reason = self._unexpected("not_ready", exc)
            if reason is None:
                return waited
            if not waited:
                logger.info("%s: not offered yet: %s", self._status.url, clean(reason, 200))
            waited = True
            self._update(last_error=f"not offered yet: {clean(reason, MAX_ERROR_TEXT)}")
            if self._sleep(gate.ready_interval):
                return None

    def _look_first(self, ours: bool = False) -> bool | None:
        """Before a first registration, look: the route may be there already (the runtime's own
        registration, a rank restarted under a live server, a role switched back), and a server
        that counts every registration (SGLang's) would count a second one. True when the route
        was adopted without registering, False to register, None when stopping. `ours`: the
        look follows our own attempt whose answer was lost; a route found is that attempt's."""
        check = self._check()
        if self._stopping:
            return None
        if check is None:  # the protocol cannot check: register
            return False
        if check.route is Route.PRESENT:
            logger.info(
                "%s already holds our route (%s): %s",
                self._status.url,
                check.evidence,
                "our last attempt arrived though its answer was lost; not sent again"
                if ours
                else "adopted without registering again",
            )
            self._ever_registered = True
            self._transition(
                Trigger.SUCCEED,
                attempt=0,
                last_error=None,
                last_success_at=self._clock.time(),
                next_attempt_at=None,
                retrying=False,
                registrations=self._status.registrations + (1 if ours else 0),
            )
            return True
        if check.route is Route.CONFLICT:
            logger.warning(
                "%s already holds our rank at another address (%s); registering anyway: a "
                "server that counts every registration (as SGLang's does) will count this rank "
                "twice",
                self._status.url,
                check.evidence,
            )
        return False

    def _out_of_time(self, started: float, delay: float) -> bool:
        """Whether the next attempt would start past `max_elapsed`: the budget is spent now
        rather than after a wait that can only end over it."""
        if self._max_elapsed is None:
            return False
        return self._clock.monotonic() - started + delay > self._max_elapsed

    def _attempt_label(self, number: int) -> str:
        if self._max_attempts is None:
            return str(number)
        if number <= self._max_attempts and self._status.state is not State.FAILED:
            return f"{number}/{self._max_attempts}"
        return f"{number} (background)"

    def _attempt(self, number: int, scheduled: bool = True) -> RegisterOutcome | None:
        """Send one registration, or None when stopping. A refusal outside the backoff
        schedule (`scheduled=False`) is a free probe: it is not counted in `attempts_total` nor
        reported to request listeners."""
        with self._gate:
            if self._stopping:
                return None
            self._update(attempt=number, next_attempt_at=None, retrying=True)
            started = time.monotonic()
            try:
                outcome = self._transport.register(self._payload)
            except Exception as exc:
                outcome = RegisterOutcome(Verdict.RETRY, error=self._unexpected("register", exc))
            duration = time.monotonic() - started
        if outcome.error:  # any transport's words: one escaped, capped line in logs and status
            outcome = replace(outcome, error=clean(outcome.error, MAX_ERROR_TEXT))
        probe = not scheduled and outcome.refused and outcome.verdict is Verdict.RETRY
        changes: dict[str, Any] = {
            "server_reachable": outcome.reachable,
            "last_request_at": self._clock.time(),
        }
        if not probe:
            changes["attempts_total"] = self._status.attempts_total + 1
        if outcome.verdict is not Verdict.ACCEPTED:
            changes["last_error"] = outcome.error
        self._update(**changes)
        if not probe:
            event = RequestEvent("register", outcome.verdict.value, duration, outcome.status_code)
            self._emit(event)
        return outcome

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

    def _on_accepted(self, number: int) -> None:
        status = self._status
        again = self._ever_registered
        self._ever_registered = True
        with self._lock:
            self._reports = 0  # a report from before this PUT says nothing about it
        self._transition(
            Trigger.SUCCEED,
            attempt=0,
            last_error=None,
            last_success_at=self._clock.time(),
            next_attempt_at=None,
            registrations=status.registrations + 1,
            retrying=False,
        )
        logger.info(
            "%s with %s after %d attempt%s",
            "registered again" if again else "registered",
            status.url,
            number,
            "" if number == 1 else "s",
        )

    def _fail(
        self,
        streak: int,
        outcome: RegisterOutcome,
        delay: float,
        *,
        fatal: bool,
    ) -> bool:
        """Go to FAILED and apply `on_failure` (the startup budget is spent, or the server
        refused the configuration). True when attempts go on."""
        policy = self._on_failure
        name = policy if isinstance(policy, str) else getattr(policy, "__name__", "callable")
        if fatal:
            logger.error(
                "registration with %s refused: %s; retrying cannot help until the "
                "configuration is fixed; on_failure=%s",
                self._status.url,
                outcome.error,
                name,
            )
        else:
            logger.error(
                "registration with %s failed after %d attempt%s, last: %s; on_failure=%s",
                self._status.url,
                streak,
                "" if streak == 1 else "s",
                outcome.error,
                name,
            )
        failed: dict[str, Any] = {"next_attempt_at": None, "retrying": False}
        if callable(policy):
            # The callable is given the FAILED snapshot before it is published, so that no
            # reader sees "failed, nothing scheduled" while it decides to retry.
            preview = replace(self._status, state=State.FAILED, **failed)
            try:
                decided = policy(preview)
            except Exception:
                logger.exception("on_failure callable failed; staying failed")
                decided = "stop"
            if decided is None:
                decided = "stop"
            if decided not in _POLICIES:
                logger.error("on_failure callable answered %r; staying failed", decided)
                decided = "stop"
            policy = decided
        go_on = policy == "retry" and not self._stopping
        if go_on:
            failed.update(next_attempt_at=self._clock.time() + delay, retrying=True)
        if not self._transition(Trigger.GIVE_UP, **failed):
            self._update(**failed)
        if go_on:
            logger.warning("still trying in the background; next attempt in %.2f s", delay)
            return True
        if policy == "exit":
            logger.critical("ending the process with status %d (on_failure='exit')", EXIT_CODE)
            self._exit(EXIT_CODE)
        return False

    # ----------------------------------------------------------------- the watch

    def _watch(self) -> float | None:
        """Watch the route while registered; the delay before registering again when it goes
        missing, or None when stopping."""
        check_now = True
        checks = 0
        refused = False  # the last check was refused: the server is down, probe it soon
        broken = 0  # checks in a row whose connection broke (reset): the server is restarting
        while True:
            if refused or broken:
                # Probing already: a report cannot make it sooner, and must not make it a loop
                # (reports may come a thousand times a second).
                if self._sleep(probe_delay(self._fleet, self._rng())):
                    return None
            elif not check_now:
                delay = None
                if self._watch_interval is not None:
                    spread = first_watch_delay if checks == 1 else watch_delay
                    delay = spread(self._watch_interval, self._rng())
                changed = self._idle(delay)
                if changed is None:
                    return None
                if changed:
                    # The whole fleet saw the same sign at the same moment: spread the checks
                    # so their new connections do not overflow the server's listen queue.
                    spread_by = contact_delay(self._fleet, self._rng())
                    logger.info(
                        "%s: a sign the route may be gone (connection closed or watch event); "
                        "checking in %.3f s",
                        self._status.url,
                        spread_by,
                    )
                    if self._sleep(spread_by, interruptible=True):
                        return None
                elif self._reports and self._await_report_slot():
                    return None
            with self._lock:
                reported, self._reports = self._reports, 0
            just_put, check_now = check_now, False
            checks += 1
            check = self._check()
            if self._stopping:
                return None
            if check is None:
                if reported:
                    return self._lose("the runtime reported the route missing", 0)
                continue
            if check.route is Route.UNREACHABLE:
                if check.refused:
                    if not refused:
                        logger.warning(
                            "route check at %s failed: %s; probing every ~%.2f s until it "
                            "listens again",
                            self._status.url,
                            check.evidence,
                            probe_delay(self._fleet, 0.5),
                        )
                    refused = True
                    continue
                refused = False
                if check.broken and broken < MAX_BROKEN_CHECKS:
                    # A reset while a server goes away (a connection accepted by the dying
                    # process): look again soon, as for a refusal, a few times at most.
                    broken += 1
                    logger.info(
                        "route check at %s failed: %s; checking again in ~%.2f s",
                        self._status.url,
                        check.evidence,
                        probe_delay(self._fleet, 0.5),
                    )
                    continue
                broken = 0
                logger.warning(
                    "route check at %s failed: %s; checking again at the next interval",
                    self._status.url,
                    check.evidence,
                )
                continue
            refused = False
            broken = 0
            if check.route is Route.MISSING:
                # Lost again right after our own PUT: the streak survives re-registration, so
                # the window before the next PUT keeps growing instead of PUTting in a loop.
                self._lost_after_put = self._lost_after_put + 1 if just_put else 0
                return self._lose(check.evidence, self._lost_after_put)
            if check.route is Route.PRESENT:
                self._lost_after_put = 0
            if check.route is Route.CONFLICT:
                logger.warning("route conflict at %s: %s", self._status.url, check.evidence)
            elif reported:
                self._log_unheeded(reported, check)

    def _await_report_slot(self) -> bool:
        """Hold a report-driven check until REPORT_CHECK_INTERVAL has passed since the last
        check started (the watch's own included); reports arriving meanwhile join it. True
        when stopping."""
        last = self._last_check_started
        if last is None:
            return False
        due = last + REPORT_CHECK_INTERVAL - self._clock.monotonic()
        return due > 0 and self._sleep(due)

    def _log_unheeded(self, reported: int, check: RouteCheck) -> None:
        """Say (at most once per REPORT_LOG_INTERVAL) that reports were contradicted."""
        self._reports_unheeded += reported
        now = self._clock.monotonic()
        last = self._reports_logged_at
        if last is not None and now - last < REPORT_LOG_INTERVAL:
            return
        logger.warning(
            "route reported missing %d time%s, but the server says %s (%s); not registering again",
            self._reports_unheeded,
            "" if self._reports_unheeded == 1 else "s",
            check.route.value,
            check.evidence,
        )
        self._reports_logged_at = now
        self._reports_unheeded = 0

    def _check(self) -> RouteCheck | None:
        with self._gate:
            if self._stopping:
                return None
            self._last_check_started = self._clock.monotonic()
            started = time.monotonic()
            try:
                check = self._transport.check(self._payload)
            except Exception as exc:
                evidence = self._unexpected("check", exc)
                check = RouteCheck(Route.UNDETERMINED, evidence=evidence)
            duration = time.monotonic() - started
        if check is None:
            return None
        if check.evidence:
            check = replace(check, evidence=clean(check.evidence, MAX_ERROR_TEXT))
        now = self._clock.time()
        self._update(
            last_check_at=now,
            last_request_at=now,
            server_reachable=check.reachable,
            route=check.route.value,
        )
        self._emit(RequestEvent("check", check.route.value, duration, check.status_code))
        return check

    def _lose(self, evidence: str, lost_after_put: int) -> float | None:
        """Go back to registering; the delay before the first re-attempt (none the first time:
        the check that found the route missing was the fleet's spread first contact)."""
        delay = rejoin_delay(self._backoff, lost_after_put, self._rng())
        logger.warning(
            "route at %s is missing (%s); registering again in %.2f s",
            self._status.url,
            evidence,
            delay,
        )
        if not self._transition(
            Trigger.LOSE,
            reregistrations=self._status.reregistrations + 1,
            retrying=True,
            # The rejoin is scheduled in the same snapshot as the loss.
            next_attempt_at=self._clock.time() + delay if delay > 0 else None,
        ):
            return None
        return delay
