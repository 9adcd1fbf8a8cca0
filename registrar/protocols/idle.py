"""The two socket-level abilities of the HTTP transport that no HTTP library offers.

- The wait on the idle kept-alive connection: a server process that exits (restart, crash)
  closes it at once, which the transport reads as a sign that its route may be gone, far
  sooner than the next periodic check. `IdleCloses` learns a server's own idle timeout, so
  that a server closing idle connections on its own does not make that a loop of checks.
- The bare connect probe after a refusal (`Prober`): another refusal costs a few tens of µs
  of CPU instead of a whole request.
"""

from __future__ import annotations

import errno
import os
import socket
import time

from ..core.waker import Waker
from .deadline import ready
from .resolver import RESOLVER, Resolver, Unresolved

__all__ = ["KEEPALIVE_WINDOW", "MAX_HARMLESS_CLOSES", "IdleCloses", "Prober", "wait_readable"]

KEEPALIVE_WINDOW = 60.0
"""A connection idle for longer than this may have been closed by the server's own idle
timeout (aiohttp: 75 s), so re-opening it then proves nothing about a restart."""
MAX_HARMLESS_CLOSES = 2
"""Closes of the idle connection that a check showed harmless, after which this server's
closes are no longer taken as signs of a restart (the watch interval remains)."""


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
        self._signal_age: float | None = None
        """Idle seconds at which the server closed our connection, while the check it
        triggered has not yet said whether the route survived."""
        self._closes_idle_after: float | None = None
        """Idle seconds after which this server closes connections on its own (learned)."""
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


class Prober:
    """A bare, non-blocking TCP connect to the server, bounded by the connect timeout (it
    wakes no deadline thread). The address comes from the process's resolver
    (`registrar.protocols.resolver`: twice a second at most, the last good one while it
    stalls), within the same timeout."""

    def __init__(self, host: str, port: int, resolver: Resolver = RESOLVER) -> None:
        self._address = (host, port)
        self._resolver = resolver

    def connect(self, timeout: float) -> socket.socket | ConnectionRefusedError | None:
        """A connected socket, the refusal, or None when it cannot tell (the request itself
        will meet the error and name it)."""
        try:
            resolved = self._resolver.resolve(*self._address, timeout)
        except Unresolved:
            return None
        family, kind, proto, address = resolved.addresses[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                writable = ready([sock.fileno()], timeout, write=True)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if writable else -1
        except OSError:
            code = -1
        if code != 0:
            sock.close()
            refused = code == errno.ECONNREFUSED
            return ConnectionRefusedError(code, os.strerror(code)) if refused else None
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
