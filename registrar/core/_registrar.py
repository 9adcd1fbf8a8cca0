"""The front door: construction, start, stop, status, reports and forks, around one daemon thread
(docs/architecture.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, Unpack

from ._board import (
    Changes,
    Listener,
    RequestEvent,
    RequestListener,
    State,
    Status,
    StatusBoard,
    Trigger,
)
from ._clock import Clock
from ._diagnosis import Code, Diagnosis, Evidence, diagnose
from ._errors import ConfigError, StateError
from ._redact import encode_payload
from ._registry import protocol_factory
from ._runner import Controls, Runner
from ._settings import Hooks, LoopSettings, Options, options_of, refuse_unknown, split_options
from ._transport import Abortable, Diagnosable, FleetSized, Resolving, Transport, WatchBounded

logger = logging.getLogger("registrar")
aio_logger = logging.getLogger("registrar.core.aio")

_REGISTRARS: weakref.WeakSet[Registrar] = weakref.WeakSet()
"""Every registrar of this process, for the fork hooks (weak: a hook keeps none alive)."""


def _before_fork() -> None:
    for registrar in list(_REGISTRARS):
        registrar._running_at_fork = registrar.running


def _after_fork_in_child() -> None:
    for registrar in list(_REGISTRARS):
        registrar._after_fork()


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


def _fleet_size(transport: Transport, payload: Mapping[str, Any]) -> int:
    if not isinstance(transport, FleetSized):
        return 1
    try:
        size = transport.fleet_size(payload)
    except Exception:
        logger.exception("fleet_size() of %r failed; assuming a fleet of one", transport)
        return 1
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 1 else 1


def _built(
    url: str | Sequence[str] | None,
    payload: dict[str, Any],
    protocol: str,
    settings: object,
    options: dict[str, Any],
) -> tuple[Transport, dict[str, Any]]:
    """The protocol's transport from its settings value: the one given, else made of `url` and
    the options that are its fields (an option it has no field for is refused in one line)."""
    factory = protocol_factory(protocol)
    kind = factory.settings
    if settings is None:
        names = options_of(kind)
        refuse_unknown(
            {k: v for k, v in options.items() if k not in names},
            f"protocol {protocol!r} takes {', '.join(names)} ({kind.__name__}) and the loop's",
        )
        if missing := [name for name in options_of(kind, required=True) if name not in options]:
            raise ConfigError(
                f"protocol {protocol!r} needs {', '.join(missing)} (fields of {kind.__name__})"
            )
        settings = kind(url, **options)
    elif not isinstance(settings, kind):
        raise ConfigError(
            f"settings of protocol {protocol!r} must be a {kind.__name__}, got {settings!r}"
        )
    else:
        refuse_unknown(
            {**options, **({} if url is None else {"url": url})},
            f"settings= holds them (give them to {kind.__name__}, not beside it)",
        )
    return factory.build(payload, settings)


class Registrar:
    """Registers `payload` with the bootstrap server at `url` and keeps it registered, from one
    daemon thread named "registrar" (`start()` returns at once). The protocol is found by name
    (`registrar.core._registry`; "sglang" by default) and built from its settings value:
    `settings=` given whole, or `url` and the HTTP `options` (`HttpSettings`); `transport=` plugs
    in any `Transport`. The other `options` are the fields of `LoopSettings` and `Hooks`."""

    def __init__(
        self,
        url: str | Sequence[str] | None = None,
        payload: Mapping[str, Any] | None = None,
        *,
        protocol: str = "sglang",
        settings: object = None,
        transport: Transport | None = None,
        **options: Unpack[Options],
    ) -> None:
        given: dict[str, Any] = dict(options)
        loop = LoopSettings(**split_options(given, LoopSettings))
        hooks = Hooks(**{k: v for k, v in split_options(given, Hooks).items() if v is not None})
        sent = encode_payload(payload, loop.max_payload_bytes)
        if transport is None:
            transport, sent = _built(url, sent, protocol, settings, given)
        elif not isinstance(transport, Transport):
            raise ConfigError(f"transport must implement registrar.Transport, got {transport!r}")
        else:  # given: its settings are the transport's own
            refuse_unknown(given, "a transport given directly takes its settings itself")
        if isinstance(transport, WatchBounded):
            fitted = transport.fit_watch_interval(loop.watch_interval, "watch_interval" in options)
            loop = replace(loop, watch_interval=fitted)
        self._transport = transport
        clock = hooks.clock
        initial = Status(state=State.UNREGISTERED, since=clock.time(), url=transport.display_url)
        self._board = StatusBoard(initial, clock)
        self._runner = Runner(
            settings=loop,
            fleet=_fleet_size(transport, sent),
            transport=transport,
            payload=sent,
            hooks=hooks,
            board=self._board,
        )
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._forked_from: int | None = None
        self._running_at_fork = False
        _REGISTRARS.add(self)
        after = loop.diagnose_after  # diagnose a URL that keeps failing, if it can be probed
        if after is not None and isinstance(transport, Diagnosable):
            watcher = Diagnostician(self._board, partial(transport.evidence, sent), clock, after)
            self.add_request_listener(watcher.on_request)
            self.add_listener(watcher.on_transition)

    @property
    def settings(self) -> LoopSettings:
        return self._runner.settings

    @property
    def state(self) -> State:
        return self._board.status.state

    @property
    def payload(self) -> dict[str, Any]:
        return dict(self._runner.payload)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def thread_died(self) -> bool:
        """Whether no thread will update the status again (see `Status.thread_died`)."""
        return self._board.status.thread_died

    def status(self) -> Status:
        """The latest snapshot; never blocks on the loop or a request in flight. What the
        resolver does to the server's name is read live (a stalled lookup outlives attempts)."""
        status = self._board.status
        if isinstance(self._transport, Resolving):
            status = replace(status, resolution=self._transport.resolution())
        return status

    def __repr__(self) -> str:
        status = self._board.status
        return f"<Registrar {status.url} {status.state.value}>"

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(old_state, new_state, status)` after every transition, in order, from
        the registrar's own thread (never from the caller of `start()` or `stop()`)."""
        self._board.add(self._board.listeners, listener)

    def add_request_listener(self, listener: RequestListener) -> None:
        """Call `listener(RequestEvent)` after every request (for metrics)."""
        self._board.add(self._board.request_listeners, listener)

    def start(self) -> Registrar:
        """Start the thread and return at once; a second call does nothing. Listeners hear the
        start from the registrar's thread, so a slow (or stopping) listener cannot hold this."""
        board = self._board
        with board.changed:
            if self._runner.controls.stopping:
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
            thread = threading.Thread(target=self._runner.run, name="registrar", daemon=True)
            # Created, handed the delivery and started under the lock: stop() never sees a
            # thread that exists but cannot be joined yet.
            self._thread = board.deliverer = thread
            board.fire(Trigger.START, Changes())  # the lock held: the thread cannot run before it
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop for good, within `timeout` seconds whatever the listeners do: wake the thread,
        wait for a request in flight, and return whether the thread has ended. No request is
        sent after this returns True. Listeners hear the stop from the registrar's thread (or a
        helper thread), waited for only within the same `timeout`."""
        deadline = time.monotonic() + max(0.0, timeout)
        me = threading.current_thread()
        board, controls = self._board, self._runner.controls
        with board.lock:
            controls.stopping = True
            thread = self._thread
        controls.wake.set()
        if self._forked_from is None and isinstance(self._transport, Abortable):
            # A request in flight need not run to its deadline: its answer no longer matters.
            self._transport.abort()
        board.apply(Trigger.STOP, Changes())
        ended = True
        if thread is not None and thread is not me:
            # Once the gate is ours, the thread is not inside a request and will see the flag.
            if controls.gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
                controls.gate.release()
            thread.join(max(0.0, deadline - time.monotonic()))
            ended = not thread.is_alive()
        with board.changed:
            left = max(0.0, deadline - time.monotonic())
            board.changed.wait_for(lambda: board.deliverer is None or board.deliverer is me, left)
        return ended

    def wait_for(self, state: State, timeout: float | None = None) -> bool:
        """Block until the registrar is in `state`; False if `timeout` seconds pass first."""
        target = State(state)
        board = self._board
        with board.changed:
            return board.changed.wait_for(lambda: board.status.state is target, timeout)

    def report_route_missing(self) -> None:
        """Say the route is gone (e.g. decode reported this rank unknown): the thread checks and
        registers again at once. Safe at any rate: reports coalesce into at most one check per
        `REPORT_CHECK_INTERVAL` s; a contradicted one is logged once per `REPORT_LOG_INTERVAL` s."""
        self._runner.controls.report()

    def __enter__(self) -> Registrar:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    async def wait_for_async(self, state: State, timeout: float | None = None) -> bool:
        """`wait_for` for a coroutine: waits without blocking the event loop."""
        target = State(state)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        entry = (target, loop, future)
        with _WAITERS_LOCK:
            if (waiters := _WAITERS.get(self)) is None:
                waiters = _WAITERS[self] = _Waiters()
                self.add_listener(waiters)
            waiters.add(entry)
        try:
            # Checked after joining the waiters, so a transition in between is never missed.
            if self.state is target:
                return True
            done, _ = await asyncio.wait({future}, timeout=timeout)
            return bool(done)
        finally:
            with _WAITERS_LOCK:
                waiters.discard(entry)

    async def __aenter__(self) -> Registrar:
        return self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        # stop() may wait for a request in flight: in a worker thread, not on the loop.
        await asyncio.to_thread(self.stop)

    def _after_fork(self) -> None:
        """In a forked child (gunicorn --preload): locks are re-made, and a registrar whose
        thread was running says it is dead here (else health answers from the moment of the fork
        for ever). No thread starts: the parent's holds the registration (PUT is not idempotent)."""
        parent, self._pid = self._pid, os.getpid()
        controls = self._runner.controls
        self._runner.controls = Controls(stopping=controls.stopping, reports=controls.reports)
        status = self._board.status  # never started, or ended: as true here as there
        if self._running_at_fork:
            self._forked_from = parent
            error = (
                f"this process (pid {self._pid}) is a fork of pid {parent}, where the registrar's "
                "thread runs; this copy cannot know the registration: start the Registrar in this "
                "process, or serve health from the parent (docs/operations.md)"
            )
            status = replace(
                status, thread_died=True, retrying=False, next_attempt_at=None, last_error=error
            )
        self._board.after_fork(status)


_ANSWERED = frozenset({"accepted", "present", "missing", "conflict", "undetermined"})
"""Request results that mean a bootstrap server answered as one (a route check's findings)."""


class Diagnostician:
    """When to diagnose: after `after` seconds of requests that reached no bootstrap server,
    probe once with `gather` (off the registrar's thread), state the diagnosis once at WARNING
    and publish it on `board`; clear it as soon as the server answers. A listener like any
    other: the loop does not know it exists."""

    def __init__(
        self, board: StatusBoard, gather: Callable[[], Evidence], clock: Clock, after: float
    ) -> None:
        self._board = board
        self._gather = gather
        self._clock = clock
        self._after = after
        self._lock = threading.Lock()
        self._since: float | None = None  # when this run of unanswered requests began
        self._busy = False  # a probe is running, or this run was diagnosed already (once)
        self._run = 0  # counts runs: a probe's finding for a run that ended is dropped
        self._denied = False  # the last registration was refused for its credential (401/403)

    def on_request(self, event: RequestEvent) -> None:
        """After every request (on the registrar's thread): start, end, or probe a run."""
        now = self._clock.monotonic()
        if event.kind == "register":
            self._denied = event.status_code in (401, 403)
        if event.result in _ANSWERED:
            with self._lock:
                self._since, self._busy = None, False
                self._run += 1
            shown = self._board.status.diagnosis
            if shown is not None:
                self._board.apply(None, Changes(diagnosis=None))
                logger.info("diagnosis %s cleared: the bootstrap server answers", shown.code)
            return
        with self._lock:
            if self._since is None:
                self._since = now
            due = not self._busy and not self._denied and now - self._since >= self._after
            self._busy |= due
            run = self._run
        if due:
            # Off the registrar's thread: a probe may take a few connect timeouts, and the loop's
            # timing must not change because a diagnosis is being made.
            threading.Thread(
                target=self._diagnose, args=(run,), name="registrar-diagnosis", daemon=True
            ).start()

    def on_transition(self, old: State, new: State, status: Status) -> None:
        """Given up for good: no request will come to reach the threshold, so probe now, on
        this thread: with on_failure="exit" the process ends right after, and the diagnosis is
        what its last lines should say (the probe's steps are bounded)."""
        if new is not State.FAILED or (status.retrying and not self._denied):
            return
        with self._lock:
            if self._busy:
                return
            self._busy = True
            run = self._run
        found = None
        if self._denied and status.last_error:
            # The server's own words name the credential (and where to set it); a probe sends
            # none, and a server whose GETs are open would look healthy to it.
            found = Diagnosis(Code.DENIED, status.last_error)
        self._diagnose(run, found)

    def _diagnose(self, run: int, found: Diagnosis | None = None) -> None:
        if found is None:
            try:
                found = diagnose(self._gather())
            except Exception:
                logger.exception("the diagnosis probe failed; no diagnosis")
        with self._lock:
            if run != self._run:
                return  # the server answered meanwhile: what the probe saw is old
            if found is None:
                # A bootstrap server answers the probe: nothing to say yet; look again later.
                self._since, self._busy = self._clock.monotonic(), False
                return
            self._board.apply(None, Changes(diagnosis=found))
        status = self._board.status
        logger.warning(
            "registration with %s: %s [diagnosis %s]%s",
            status.url,
            found.sentence,
            found.code,
            "; still trying" if status.retrying else "",
        )


# The awaitable side of the thread engine, not a second engine: one listener per registrar hands
# each change to waiting loops with `loop.call_soon_threadsafe` (nothing blocks or polls).
class _Waiters(set[tuple[State, asyncio.AbstractEventLoop, asyncio.Future[None]]]):
    """The futures waiting on one registrar (under _WAITERS_LOCK), fed by a single listener: so
    waiting many times never grows the registrar's listener list."""

    def __call__(self, old: State, new: State, status: Status) -> None:
        with _WAITERS_LOCK:
            ready = [entry for entry in self if entry[0] is new]
            self.difference_update(ready)
        for _, loop, future in ready:
            # A closed loop raises RuntimeError: nobody waits there any more.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(future.set_result, None)


_WAITERS: weakref.WeakKeyDictionary[Registrar, _Waiters] = weakref.WeakKeyDictionary()
_WAITERS_LOCK = threading.Lock()


def in_loop(
    listener: Callable[[State, State, Status], Awaitable[None] | None],
    loop: asyncio.AbstractEventLoop | None = None,
) -> Callable[[State, State, Status], None]:
    """Wrap `listener` so each transition is delivered into `loop` (None: the running one), not
    called on the registrar's thread; a coroutine function runs as a task, logged if it fails."""
    target = loop if loop is not None else asyncio.get_running_loop()

    def run(old: State, new: State, status: Status) -> None:
        try:
            result = listener(old, new, status)
        except Exception:
            aio_logger.exception("listener %r failed on %s -> %s; ignored", listener, old, new)
            return
        if asyncio.iscoroutine(result):
            task = target.create_task(result)
            _TASKS.add(task)
            task.add_done_callback(_finished)

    def deliver(old: State, new: State, status: Status) -> None:
        try:
            target.call_soon_threadsafe(run, old, new, status)
        except RuntimeError:
            aio_logger.debug("event loop closed; transition %s -> %s not delivered", old, new)

    return deliver


_TASKS: set[asyncio.Task[Any]] = set()


def _finished(task: asyncio.Task[Any]) -> None:
    _TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        aio_logger.error("async listener failed; ignored", exc_info=task.exception())
