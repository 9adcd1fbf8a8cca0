"""The wall-clock deadline of a whole request, which no HTTP library bounds (a socket timeout
bounds each read, not their sum): docs/reliability.md, "Hostile servers"."""

from __future__ import annotations

import contextlib
import heapq
import os
import socket
import struct
import threading
import time


class DeadlineExceeded(TimeoutError):
    """No complete answer within the request's deadline (however slowly bytes came)."""


class _Deadlines:
    """One thread for the whole process ends requests past their deadline (one per transport cost
    a thread per registrar and a wake-up per request); entries of ended requests drop when due."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.cond = threading.Condition()
        self._heap: list[tuple[float, int, Watchdog]] = []
        self._count = 0
        self._thread: threading.Thread | None = None

    def arm(self, watchdog: Watchdog, at: float) -> None:
        """Called with `cond` held."""
        self._count += 1
        heapq.heappush(self._heap, (at, self._count, watchdog))
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="registrar-deadline", daemon=True
            )
            self._thread.start()
        elif self._heap[0][1] == self._count:  # the new entry is the soonest: wake the thread
            self.cond.notify()

    def _run(self) -> None:
        with self.cond:
            while True:
                if not self._heap:
                    self.cond.wait()
                    continue
                at, _, watchdog = self._heap[0]
                live = watchdog.at == at  # else that request ended (or was re-armed) meanwhile
                left = at - time.monotonic()
                if live and left > 0:
                    self.cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                if live:
                    watchdog.expire()


DEADLINES = _Deadlines()
os.register_at_fork(after_in_child=DEADLINES._reset)  # the parent's thread is not in the child


class Watchdog:
    """Bounds each request of one transport: past its deadline, the deadline thread shuts the
    transport's sockets down, which wakes a blocked connect, TLS handshake or read at once."""

    def __init__(self) -> None:
        self.at: float | None = None  # when the request in flight is due; None between requests
        self._fired = False
        self.by_abort = False  # the request's end came from `fire()` (a stop), not its deadline
        self._tracked: set[socket.socket | threading.Event] = set()  # its sockets; a lookup's wait

    def begin(self, seconds: float) -> float:
        """Arm for a request of at most `seconds`; when it is due."""
        with DEADLINES.cond:
            self.at = due = time.monotonic() + seconds
            self.by_abort = self._fired = False
            DEADLINES.arm(self, due)
            return due

    def end(self) -> bool:
        """Disarm; whether the deadline fired during the request."""
        with DEADLINES.cond:
            self.at = None
            return self._fired

    def fire(self) -> None:
        """End the request in flight now, if any (any thread); not the next one: a transport may
        still have requests to make as it closes (etcd revokes its lease)."""
        with DEADLINES.cond:
            if self.at is not None:
                self.by_abort = True
                self.at = time.monotonic()
                DEADLINES.arm(self, self.at)

    def expire(self) -> None:
        """The deadline passed (called by the deadline thread, its lock held)."""
        self._fired = True
        self.at = None
        for tracked in self._tracked:
            _end(tracked)

    def track(self, tracked: socket.socket | threading.Event) -> None:
        """Shut `tracked` down (a socket) or set it (an event) when the request in flight ends."""
        with DEADLINES.cond:
            self._tracked.add(tracked)
            if self._fired:  # tracked after the deadline passed, within the same request
                _end(tracked)

    def untrack(self, tracked: socket.socket | threading.Event) -> None:
        with DEADLINES.cond:
            self._tracked.discard(tracked)


def _end(tracked: socket.socket | threading.Event) -> None:
    """End a wait, or a connection now (from any thread) without closing its descriptor."""
    if isinstance(tracked, threading.Event):
        tracked.set()
        return
    with contextlib.suppress(OSError):
        # Reset when closed, not closed gracefully: a request given up at its deadline must not
        # reach the server later from the send queue (a PUT counted after a look found nothing).
        tracked.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):  # already closed by its peer or its connection
        # The plain socket's shutdown, on a TLS socket too: `SSLSocket.shutdown` would also
        # unwrap it under the thread that is reading it.
        socket.socket.shutdown(tracked, socket.SHUT_RDWR)
