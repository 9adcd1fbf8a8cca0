"""Time as the registrar sees it, injectable so tests run minutes of backoff in milliseconds."""

from __future__ import annotations

import threading
import time
from typing import Protocol

from ._waker import Waker


class Clock(Protocol):
    """Where the loop reads time and waits. A fake advances virtual time in `wait`."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, for scheduling."""

    def time(self) -> float:
        """Wall-clock epoch seconds, for the timestamps people read."""

    def wait(self, event: threading.Event | Waker, timeout: float | None) -> bool:
        """Block until `event` is set or `timeout` seconds pass; True when the event is set."""


class SystemClock:
    """The real clock; `wait` sleeps on the event, so a wake-up or stop ends it at once."""

    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()

    def wait(self, event: threading.Event | Waker, timeout: float | None) -> bool:
        return event.wait(timeout)
