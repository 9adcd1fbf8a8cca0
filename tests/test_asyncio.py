"""The awaitable surface under a real event loop (asyncio.run): waiting never blocks the loop,
listeners are delivered on the loop's thread, `async with` starts and stops."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from support import FakeClock, ScriptedTransport, accepted, retry, sglang_payload

from registrar import Backoff, Registrar, State, Status, in_loop
from registrar.core import _registrar
from registrar.devtools.bootstrap_server import BootstrapServer


async def ticking(stop: asyncio.Event, ticks: list[int]) -> None:
    while not stop.is_set():
        ticks.append(1)
        await asyncio.sleep(0.005)


def test_wait_for_async_against_a_late_server() -> None:
    server = BootstrapServer("127.0.0.1", 0).start()
    server.stop()  # the port is known, nothing listens yet: the startup race

    async def main() -> tuple[bool, int, State]:
        stop, ticks = asyncio.Event(), []
        ticker = asyncio.create_task(ticking(stop, ticks))
        async with Registrar(
            server.url, sglang_payload(), backoff=Backoff(initial=0.05, maximum=0.2)
        ) as reg:
            while reg.status().attempts_total < 2:  # refused, and refused again
                await asyncio.sleep(0.01)
            assert reg.state is State.REGISTERING
            before = len(ticks)
            await asyncio.to_thread(server.start)
            ok = await reg.wait_for_async(State.REGISTERED, timeout=10)
            waited_ticks = len(ticks) - before
        stop.set()
        await ticker
        return ok, waited_ticks, reg.state

    try:
        ok, ticks, final = asyncio.run(main())
    finally:
        server.close()
    assert ok
    assert ticks > 0, "the loop was blocked while waiting"
    assert final is State.STOPPED  # __aexit__ stopped it


def test_wait_for_async_times_out_and_leaves_no_waiter() -> None:
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"x": 1},
        transport=ScriptedTransport([retry()]),
        clock=FakeClock(horizon=0.1),
        watch_interval=None,
    )

    async def main() -> tuple[bool, bool]:
        async with reg:
            late = await reg.wait_for_async(State.REGISTERED, timeout=0.1)
            task = asyncio.create_task(reg.wait_for_async(State.REGISTERED, timeout=None))
            await asyncio.sleep(0.05)
            task.cancel()
            cancelled = False
            try:
                await task
            except asyncio.CancelledError:
                cancelled = True
            return late, cancelled

    late, cancelled = asyncio.run(main())
    assert late is False
    assert cancelled
    assert not _registrar._WAITERS[reg]
    assert reg.state is State.STOPPED


def test_already_there_answers_at_once() -> None:
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"x": 1},
        transport=ScriptedTransport([accepted()]),
        clock=FakeClock(),
        watch_interval=None,
    )

    async def main() -> bool:
        async with reg:
            assert await reg.wait_for_async(State.REGISTERED, timeout=5)
            return await reg.wait_for_async(State.REGISTERED, timeout=0)

    assert asyncio.run(main())


def test_listeners_are_delivered_on_the_loop_thread() -> None:
    seen: list[tuple[State, State, int]] = []
    awaited: list[State] = []

    async def main() -> int:
        loop_thread = threading.get_ident()
        reg = Registrar(
            "http://127.0.0.1:8998",
            {"x": 1},
            transport=ScriptedTransport([retry(), accepted()]),
            clock=FakeClock(),
            watch_interval=None,
        )

        def plain(old: State, new: State, status: Status) -> None:
            seen.append((old, new, threading.get_ident()))

        async def coroutine(old: State, new: State, status: Status) -> None:
            await asyncio.sleep(0)
            awaited.append(new)

        def broken(old: State, new: State, status: Status) -> Any:
            raise RuntimeError("listener bug")

        reg.add_listener(in_loop(plain))
        reg.add_listener(in_loop(coroutine))
        reg.add_listener(in_loop(broken))
        async with reg:
            assert await reg.wait_for_async(State.REGISTERED, timeout=5)
            for _ in range(100):  # delivered through the loop: let it run
                if len(awaited) >= 2:
                    break
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        return loop_thread

    loop_thread = asyncio.run(main())
    assert [(old, new) for old, new, _ in seen][:2] == [
        (State.UNREGISTERED, State.REGISTERING),
        (State.REGISTERING, State.REGISTERED),
    ]
    assert {ident for _, _, ident in seen} == {loop_thread}
    assert awaited[:2] == [State.REGISTERING, State.REGISTERED]


def test_a_closed_loop_does_not_break_the_registrar() -> None:
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"x": 1},
        transport=ScriptedTransport([accepted()]),
        clock=FakeClock(),
        watch_interval=None,
    )
    loop = asyncio.new_event_loop()
    reg.add_listener(in_loop(lambda old, new, status: None, loop))
    loop.close()
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    reg.stop()
    assert not reg.thread_died
