"""Time and waiting as the registrar sees it: the clock, injectable so tests run minutes of
backoff in milliseconds, and a wake-up flag that both threads and `poll()` can wait on, so a
transport waiting on its own connections (`IdleWatcher`) is woken at once by a stop or a report.
The flag's descriptor is one eventfd: 500 registrars in one process stay within the usual limit
of 1024 descriptors."""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Where the loop reads time and waits. A fake advances virtual time in `wait`."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for scheduling."""

    def time(self) -> float:
        """Wall-clock epoch seconds, for the timestamps people read."""

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """Block until `event` is set or `timeout` seconds pass; True when the event is set."""


class SystemClock:
    """The real clock; `wait` sleeps on the event, so a wake-up or stop ends it at once."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)


class Waker(threading.Event):
    """A thread-safe flag: `set()` wakes `wait()` and makes `fileno()` readable until `clear()`."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self._fd: int | None = None  # the eventfd, once asked for: readable while its counter > 0
        self._closed = False

    def set(self) -> None:
        with self._lock:
            super().set()
            if self._fd is not None:
                with contextlib.suppress(OSError):  # the counter is full: readable already
                    os.eventfd_write(self._fd, 1)

    def clear(self) -> None:
        with self._lock:
            super().clear()
            if self._fd is not None:
                with contextlib.suppress(OSError):  # raised when the counter is zero already
                    os.eventfd_read(self._fd)

    def fileno(self) -> int:
        with self._lock:
            if self._closed:
                raise ValueError("the waker is closed")
            if self._fd is None:
                self._fd = os.eventfd(int(self.is_set()), os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            return self._fd

    def close(self) -> None:
        """Release the descriptor; the flag itself keeps working."""
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def wait_readable(sock: socket.socket | None, timeout: float, waker: Waker) -> bool:
    """Wait up to `timeout` for `sock` to turn readable (closed, reset or written on unasked) or
    for `waker`; True only for the socket. Without either it is a plain wait, never a spin."""
    deadline = time.monotonic() + timeout
    with contextlib.suppress(OSError, ValueError):
        if sock is not None:
            # `poll()`: `select()` refuses descriptors numbered 1024 and above (a fleet's).
            poller = select.poll()
            for fd in (sock.fileno(), waker.fileno()):
                poller.register(fd, select.POLLIN)
            return bool(poller.poll(max(0, math.ceil(timeout * 1000)))) and not waker.is_set()
    waker.wait(max(0.0, deadline - time.monotonic()))
    return False
