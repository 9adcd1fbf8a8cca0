"""The registrar: one daemon thread that drives the registration to the desired state.

Data flows one way: options -> `Registrar` -> its thread asks the transport to act -> the outcome
fires a trigger on the state machine -> a new immutable `Status` -> listeners read it. The thread
never holds a lock while it talks to the network, so `status()` never blocks, and `stop()` wakes
it out of any wait.

This module holds the front door (construction, start, stop, status, reports, forks); the loop's
choices are in `decide`, their performance in `runner`, the snapshot and its listeners in
`board`, the failure policy in `failure`.
"""

from __future__ import annotations

import asyncio
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from .aio import wait_for_state
from .backoff import DEFAULT_MAX_RETRY_AFTER, Backoff
from .board import Listener, RequestEvent, RequestListener, StatusBoard
from .clock import Clock, SystemClock
from .decide import MAX_BROKEN_CHECKS, REPORT_CHECK_INTERVAL, REPORT_LOG_INTERVAL
from .errors import ConfigError, StateError
from .failure import EXIT_CODE, OnFailure, OnFailureName, Policy, default_exit
from .loopstate import LoopConfig
from .machine import State, Trigger
from .registry import TransportOptions, make_transport
from .runner import MAX_ERROR_TEXT, UNEXPECTED, Controls, Runner
from .settings import (
    DEFAULT_BACKOFF,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_WATCH_INTERVAL,
    Hooks,
    HttpSettings,
    LoopSettings,
)
from .status import Status
from .transport import Abortable, Resolving, Token, Transport
from .validate import encode_payload, fleet_size

__all__ = [
    "DEFAULT_BACKOFF",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_WATCH_INTERVAL",
    "EXIT_CODE",
    "MAX_BROKEN_CHECKS",
    "MAX_ERROR_TEXT",
    "REPORT_CHECK_INTERVAL",
    "REPORT_LOG_INTERVAL",
    "UNEXPECTED",
    "Listener",
    "OnFailure",
    "OnFailureName",
    "Registrar",
    "RequestEvent",
    "RequestListener",
]

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


def _hooks(
    clock: Clock | None, rng: Callable[[], float] | None, exit: Callable[[int], None] | None
) -> Hooks:
    return Hooks(
        clock if clock is not None else SystemClock(),
        rng if rng is not None else random.random,
        exit if exit is not None else default_exit,
    )


def _transport_for(
    payload: dict[str, Any], via: HttpSettings | Transport
) -> tuple[Transport, dict[str, Any]]:
    """The transport given, or the one its HTTP settings' protocol names, with the payload it
    will send."""
    if not isinstance(via, HttpSettings):
        if not isinstance(via, Transport):
            raise ConfigError(f"transport must implement registrar.Transport, got {via!r}")
        return via, payload
    made = TransportOptions(via.url, token=via.token, timeout=via.timeout, verify=via.tls)
    return make_transport(via.protocol, payload, made)


class Registrar:
    """Registers `payload` with the bootstrap server at `url` and keeps it registered.

    `start()` returns at once; the work happens in one daemon thread named "registrar".
    The default protocol is SGLang's (`PUT {url}/route`, the rank's route watched afterwards);
    `protocol="http"` sends the payload to `{url}/route` without watching; other names come from
    `registrar.core.registry`, and `transport=` plugs in any `Transport` directly (then no URL
    and none of the HTTP options are needed). `Registrar.from_settings` takes the same as
    settings values (`LoopSettings`, `HttpSettings`).
    """

    def __init__(  # noqa: PLR0913 - the front door: every option a keyword, as documented
        self,
        url: str | None = None,
        payload: Mapping[str, Any] | None = None,
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
        via: HttpSettings | Transport
        if transport is None:
            via = HttpSettings(url, protocol, timeout, token, verify, ca_bundle)  # type: ignore[arg-type]
        else:
            via = transport  # given: nothing about HTTP is needed, nor checked
        loop = LoopSettings(
            backoff=backoff,
            max_attempts=max_attempts,
            max_elapsed=max_elapsed,
            on_failure=on_failure,
            watch_interval=watch_interval,
            max_retry_after=max_retry_after,
            max_payload_bytes=max_payload_bytes,
        )
        self._setup(payload, via, loop, _hooks(clock, rng, exit))

    @classmethod
    def from_settings(
        cls,
        payload: Mapping[str, Any],
        via: HttpSettings | Transport,
        loop: LoopSettings | None = None,
        hooks: Hooks | None = None,
    ) -> Registrar:
        """A registrar from settings values: `via` is where to register (`HttpSettings`, or a
        `Transport` of your own), `loop` the retry and watch policy (defaults if None)."""
        made = cls.__new__(cls)
        made._setup(payload, via, loop or LoopSettings(), hooks or Hooks())
        return made

    def _setup(
        self,
        payload: Mapping[str, Any] | None,
        via: HttpSettings | Transport,
        loop: LoopSettings,
        hooks: Hooks,
    ) -> None:
        transport, sent = _transport_for(encode_payload(payload, loop.max_payload_bytes), via)
        self._payload = sent
        self._transport = transport
        self._settings = loop
        self._clock: Clock = hooks.clock
        self._rng = hooks.rng
        self._config = LoopConfig(
            backoff=loop.backoff,
            max_attempts=loop.max_attempts,
            max_elapsed=loop.max_elapsed,
            watch_interval=loop.watch_interval,
            max_retry_after=loop.max_retry_after,
            fleet=fleet_size(transport, sent),
            url=transport.display_url,
        )
        self._policy = Policy(loop.on_failure, hooks.exit)
        initial = Status(
            state=State.UNREGISTERED, since=self._clock.time(), url=transport.display_url
        )
        self._board = StatusBoard(initial, self._clock)
        self._controls = Controls()
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()
        self._forked_from: int | None = None
        self._running_at_fork = False
        _REGISTRARS.add(self)

    @property
    def settings(self) -> LoopSettings:
        """The loop's settings, as validated."""
        return self._settings

    # ----------------------------------------------------------------- public API

    @property
    def state(self) -> State:
        """The current state."""
        return self._board.status.state

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
        return self._board.status.thread_died

    def status(self) -> Status:
        """The latest snapshot; never blocks on the loop or a request in flight. What the
        resolver does to the server's name is read live (a stalled lookup outlives attempts)."""
        status = self._board.status
        if isinstance(self._transport, Resolving):
            resolution = self._transport.resolution()
            if resolution != status.resolution:
                status = replace(status, resolution=resolution)
        return status

    def __repr__(self) -> str:
        status = self._board.status
        return f"<Registrar {status.url} {status.state.value}>"

    def add_listener(self, listener: Listener) -> None:
        """Call `listener(old_state, new_state, status)` after every transition, in order, from
        the registrar's own thread (never from the caller of `start()` or `stop()`)."""
        self._board.add_listener(listener)

    def add_request_listener(self, listener: RequestListener) -> None:
        """Call `listener(RequestEvent)` after every request (for metrics)."""
        self._board.add_request_listener(listener)

    def start(self) -> Registrar:
        """Start the thread and return at once; a second call does nothing. Listeners hear the
        start from the registrar's thread, so a slow (or stopping) listener cannot hold this."""
        board = self._board
        with board.changed:
            if self._controls.stopping:
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
            board.deliverer = thread
            board.fire(Trigger.START, {})
            thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop for good, within `timeout` seconds whatever the listeners do: wake the thread,
        wait for a request in flight, and return whether the thread has ended. No request is
        sent after this returns True. Listeners hear the stop from the registrar's thread (or a
        helper thread), waited for only within the same `timeout`."""
        deadline = time.monotonic() + max(0.0, timeout)
        me = threading.current_thread()
        board, controls = self._board, self._controls
        with board.lock:
            controls.stopping = True
            thread = self._thread
        controls.wake.set()
        if self._forked_from is None and isinstance(self._transport, Abortable):
            # A request in flight need not run to its deadline: its answer no longer matters.
            self._transport.abort()
        board.transition(Trigger.STOP)
        ended = True
        if thread is not None and thread is not me:
            # Once the gate is ours, the thread is not inside a request and will see the flag.
            if controls.gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
                controls.gate.release()
            thread.join(max(0.0, deadline - time.monotonic()))
            ended = not thread.is_alive()
        with board.changed:
            if board.deliverer is not me:
                board.changed.wait_for(
                    lambda: board.deliverer is None, max(0.0, deadline - time.monotonic())
                )
        return ended

    def wait_for(self, state: State, timeout: float | None = None) -> bool:
        """Block until the registrar is in `state`; False if `timeout` seconds pass first."""
        target = State(state)
        board = self._board
        with board.changed:
            return board.changed.wait_for(lambda: board.status.state is target, timeout)

    def report_route_missing(self) -> None:
        """Say the route is gone (e.g. decode reported this rank unknown): the thread wakes,
        verifies, and registers again without waiting for the next watch interval.

        Cheap and safe to call at any rate: reports are coalesced into one check, at most one
        check per `REPORT_CHECK_INTERVAL` seconds, and a report the server contradicts is
        logged at most once per `REPORT_LOG_INTERVAL` seconds (with the count it stands for)."""
        self._controls.report()

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
        controls = self._controls
        self._controls = Controls(stopping=controls.stopping, reports=controls.reports)
        status = self._board.status
        self._board.after_fork(status)
        if not self._running_at_fork:
            return  # never started, or already ended: the copy is as true here as there
        self._forked_from = parent
        self._board.status = replace(
            status,
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

    def _run(self) -> None:
        Runner(
            config=self._config,
            transport=self._transport,
            payload=self._payload,
            clock=self._clock,
            rng=self._rng,
            board=self._board,
            controls=self._controls,
            policy=self._policy,
        ).run()
