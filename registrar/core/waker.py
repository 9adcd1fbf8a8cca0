"""A wake-up flag that both threads and `poll()` can wait on, so a transport waiting on its own
connections (`IdleWatcher`) is woken at once by a stop or a report. Its descriptor, made on the
first `fileno()`, is one eventfd (Linux), else a socket pair: a fleet of 500 registrars in one
process stays within the usual limit of 1024 descriptors.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading


class _EventFd:
    """One eventfd: readable while its counter is above zero."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def fileno(self) -> int:
        return self._fd

    def signal(self) -> None:
        with contextlib.suppress(OSError):  # the counter is full: readable already
            os.eventfd_write(self._fd, 1)

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # raised when the counter is zero already
            os.eventfd_read(self._fd)

    def close(self) -> None:
        os.close(self._fd)


class _SocketPair:
    """A socket pair, where there is no eventfd: readable while a byte waits in it."""

    def __init__(self) -> None:
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)

    def fileno(self) -> int:
        return self._reader.fileno()

    def signal(self) -> None:
        with contextlib.suppress(OSError):  # a full buffer means it is readable already
            self._writer.send(b"\0")

    def drain(self) -> None:
        with contextlib.suppress(OSError):  # raised once nothing is left to read
            while self._reader.recv(4096):
                pass

    def close(self) -> None:
        self._reader.close()
        self._writer.close()


class Waker:
    """A thread-safe flag: `set()` wakes `wait()` and makes `fileno()` readable until `clear()`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._signal: _EventFd | _SocketPair | None = None
        self._closed = False

    def set(self) -> None:
        with self._lock:
            self._event.set()
            if self._signal is not None:
                self._signal.signal()

    def clear(self) -> None:
        with self._lock:
            self._event.clear()
            if self._signal is not None:
                self._signal.drain()

    def is_set(self) -> bool:
        return self._event.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until set or `timeout` seconds pass; True when set."""
        return self._event.wait(timeout)

    def fileno(self) -> int:
        """A descriptor that is readable while the waker is set (until `clear()`)."""
        with self._lock:
            if self._closed:
                raise ValueError("the waker is closed")
            if self._signal is None:
                self._signal = _EventFd() if hasattr(os, "eventfd") else _SocketPair()
                if self._event.is_set():
                    self._signal.signal()
            return self._signal.fileno()

    def close(self) -> None:
        """Release the descriptor; the flag itself keeps working."""
        with self._lock:
            self._closed = True
            if self._signal is not None:
                self._signal.close()
                self._signal = None
