"""The awaitable side of the thread engine, not a second engine: one listener per registrar
hands each change to waiting loops with `loop.call_soon_threadsafe` (nothing blocks or polls)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ._machine import State
from ._status import Status

if TYPE_CHECKING:
    from ._registrar import Registrar

logger = logging.getLogger("registrar.core.aio")


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
                loop.call_soon_threadsafe(_settle, future)


_WAITERS: weakref.WeakKeyDictionary[Registrar, _Waiters] = weakref.WeakKeyDictionary()
_WAITERS_LOCK = threading.Lock()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def wait_for_state(registrar: Registrar, state: State, timeout: float | None) -> bool:
    """Wait in the running loop until `registrar` reaches `state`; False after `timeout`."""
    target = State(state)
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()
    entry = (target, loop, future)
    with _WAITERS_LOCK:
        if (waiters := _WAITERS.get(registrar)) is None:
            waiters = _WAITERS[registrar] = _Waiters()
            registrar.add_listener(waiters)
        waiters.add(entry)
    try:
        # Checked after joining the waiters, so a transition in between is never missed.
        if registrar.state is target:
            return True
        try:
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            return False
        return True
    finally:
        with _WAITERS_LOCK:
            waiters.discard(entry)


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
            logger.exception("listener %r failed on %s -> %s; ignored", listener, old, new)
            return
        if asyncio.iscoroutine(result):
            task = target.create_task(result)
            _TASKS.add(task)
            task.add_done_callback(_finished)

    def deliver(old: State, new: State, status: Status) -> None:
        try:
            target.call_soon_threadsafe(run, old, new, status)
        except RuntimeError:
            logger.debug("event loop closed; transition %s -> %s not delivered", old, new)

    return deliver


_TASKS: set[asyncio.Task[Any]] = set()


def _finished(task: asyncio.Task[Any]) -> None:
    _TASKS.discard(task)
    if not task.cancelled() and task.exception() is not None:
        logger.error("async listener failed; ignored", exc_info=task.exception())
