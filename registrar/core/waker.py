"""A wake-up flag that both threads and `select()` can wait on.

The registrar sets it to end any wait at once (stop, a route-missing report). A plain
`threading.Event` cannot be selected on beside a socket, so a transport that waits on its own
connections between checks (`IdleWatcher`) could not be woken; a socket pair, made the first
time someone asks for `fileno()`, makes the flag visible to `select()` too.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["Waker"]


class Waker:
    """A thread-safe flag: `set()` wakes `wait()` and makes `fileno()` readable until `clear()`."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._pair: tuple[socket.socket, socket.socket] | None = None
        self._closed = False

    def set(self) -> None:
        with self._lock:
            self._event.set()
            if self._pair is not None:
                # A full buffer means it is readable already.
                with contextlib.suppress(OSError):
                    self._pair[1].send(b"\0")

    def clear(self) -> None:
        with self._lock:
            self._event.clear()
            if self._pair is not None:
                self._drain(self._pair[0])

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
            if self._pair is None:
                reader, writer = socket.socketpair()
                reader.setblocking(False)
                writer.setblocking(False)
                self._pair = (reader, writer)
                if self._event.is_set():
                    writer.send(b"\0")
            return self._pair[0].fileno()

    def close(self) -> None:
        """Release the socket pair; the flag itself keeps working."""
        with self._lock:
            self._closed = True
            if self._pair is not None:
                for sock in self._pair:
                    sock.close()
                self._pair = None

    @staticmethod
    def _drain(reader: socket.socket) -> None:
        with contextlib.suppress(OSError):  # raised once nothing is left to read
            while reader.recv(4096):
                pass
