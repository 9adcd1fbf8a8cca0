"""The wait on the idle kept-alive connection: a server process that exits closes it at once, a
sign that the route may be gone far sooner than the next check. `IdleCloses` learns a server's
own idle timeout, so that its closes do not make a loop of checks."""

from __future__ import annotations

import socket
import time

from ..core._waker import Waker
from ._deadline import ready

KEEPALIVE_WINDOW = 60.0
"""A connection idle for longer than this may have been closed by the server's own idle
timeout (aiohttp: 75 s), so re-opening it then proves nothing about a restart."""
MAX_HARMLESS_CLOSES = 2
"""Closes a check showed harmless, after which this server's closes are no longer signs."""


def wait_readable(sock: socket.socket | None, timeout: float, waker: Waker) -> bool:
    """Wait up to `timeout` for `sock` to turn readable (the server closed it, reset it or
    wrote on it unasked) or for `waker`; True only for the socket. Without a socket, or with
    a closed waker (the registrar is ending), it is a plain wait: never a spin."""
    deadline = time.monotonic() + timeout
    try:
        wake = waker.fileno()
    except ValueError:
        sock = None
    if sock is None:
        waker.wait(timeout)
        return False
    try:
        readable = ready([sock.fileno(), wake], timeout)
    except (OSError, ValueError):
        waker.wait(max(0.0, deadline - time.monotonic()))
        return False
    return bool(readable) and not waker.is_set()


class IdleCloses:
    """Which closes of the idle connection are signs of a restart.

    Once a close was followed by a check that found the route in place (`settle`), closes
    after that much idle time are taken as the server's idle timeout; so are closes after
    KEEPALIVE_WINDOW, and every close once MAX_HARMLESS_CLOSES proved harmless (a server that
    closes at once, where idle times are too short to tell apart)."""

    def __init__(self) -> None:
        self._signal_age: float | None = None  # idle seconds of the close a check is to settle
        self._closes_idle_after: float | None = None  # this server's own idle timeout, learned
        self._harmless = 0

    def is_sign(self, age: float) -> bool:
        """Whether a close after `age` idle seconds is a sign (to be settled by a check)."""
        if (
            age < KEEPALIVE_WINDOW
            and self._harmless < MAX_HARMLESS_CLOSES
            and (self._closes_idle_after is None or age < 0.5 * self._closes_idle_after)
        ):
            self._signal_age = age
            return True
        return False

    def settle(self, route_survived: bool) -> float | None:
        """What the check after a sign found; the idle time newly learned as the server's own
        idle timeout, if any."""
        age, self._signal_age = self._signal_age, None
        if age is None or not route_survived:
            return None
        self._harmless += 1
        if self._closes_idle_after is None or age < self._closes_idle_after:
            self._closes_idle_after = age
            return age
        return None
