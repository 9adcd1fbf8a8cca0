"""The wait on the idle kept-alive connection: a server process that exits closes it at once, a
sign the route may be gone far sooner than the next check (docs/sglang.md)."""

from __future__ import annotations

import contextlib
import math
import select
import socket
import time

from ..core._waker import Waker

# A connection idle longer may have met the server's own idle timeout (aiohttp: 75 s): re-opening
# it proves nothing about a restart.
KEEPALIVE_WINDOW = 60.0
MAX_HARMLESS_CLOSES = 2  # closes a check showed harmless, after which closes are no sign


def wait_readable(sock: socket.socket | None, timeout: float, waker: Waker) -> bool:
    """Wait up to `timeout` for `sock` to turn readable (closed, reset or written on unasked) or
    for `waker`; True only for the socket. Without either it is a plain wait, never a spin."""
    deadline = time.monotonic() + timeout
    try:
        wake = waker.fileno()
    except ValueError:
        sock = None
    if sock is not None:
        # `poll()`: `select()` refuses descriptors numbered 1024 and above (a fleet's).
        with contextlib.suppress(OSError, ValueError):
            poller = select.poll()
            for fd in (sock.fileno(), wake):
                poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(0, math.ceil(timeout * 1000)))) and not waker.is_set()
    waker.wait(max(0.0, deadline - time.monotonic()))
    return False


class IdleCloses:
    """Which closes of the idle connection are signs of a restart: not those after the idle time
    of a close a check showed harmless (the server's idle timeout), nor after KEEPALIVE_WINDOW,
    nor any once MAX_HARMLESS_CLOSES proved harmless (idle times too short to tell apart)."""

    def __init__(self) -> None:
        self._signal_age: float | None = None  # idle seconds of the close a check is to settle
        self._closes_idle_after: float | None = None  # this server's own idle timeout, learned
        self._harmless = 0

    def is_sign(self, age: float) -> bool:
        """Whether a close after `age` idle seconds is a sign (for a check to settle)."""
        if (
            age < KEEPALIVE_WINDOW
            and self._harmless < MAX_HARMLESS_CLOSES
            and (self._closes_idle_after is None or age < 0.5 * self._closes_idle_after)
        ):
            self._signal_age = age
            return True
        return False

    def settle(self, route_survived: bool) -> float | None:
        """What the check after a sign found; the server's idle timeout, if newly learned."""
        age, self._signal_age = self._signal_age, None
        if age is None or not route_survived:
            return None
        self._harmless += 1
        if self._closes_idle_after is None or age < self._closes_idle_after:
            self._closes_idle_after = age
            return age
        return None
