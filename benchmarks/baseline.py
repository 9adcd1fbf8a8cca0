"""The upstream SGLang retry loop, reimplemented from its description, as the baseline.

Up to 5 PUTs with a 5 s timeout; only 200 counts; between attempts it sleeps
`min(1.0 * 2**attempt, 30.0) * (0.75 + 0.25 * (time.monotonic() % 1))`, with no sleep after
the last; then it gives up for good. It never registers again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import requests

MAX_RETRIES = 5
INITIAL_DELAY = 1.0
MAX_DELAY = 30.0


def upstream_delay(attempt: int, u: float) -> float:
    """The upstream sleep after failed attempt `attempt` (from 0) for a draw `u` in [0, 1)."""
    return min(INITIAL_DELAY * 2**attempt, MAX_DELAY) * (0.75 + 0.25 * u)


class BaselineClient:
    """One upstream registration loop in its own thread, recording what it sends."""

    def __init__(
        self, url: str, payload: dict[str, Any], on_request: Callable[[float], None] | None = None
    ) -> None:
        self.url = f"{url}/route"
        self.payload = payload
        self.registered_at: float | None = None
        self.gave_up = False
        self.requests = 0
        self._on_request = on_request
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="baseline", daemon=True)

    def start(self) -> BaselineClient:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        with requests.Session() as session:
            for attempt in range(MAX_RETRIES):
                if self._stop.is_set():
                    return
                self.requests += 1
                if self._on_request is not None:
                    self._on_request(time.monotonic())
                try:
                    answer = session.put(self.url, json=self.payload, timeout=5)
                    if answer.status_code == 200:
                        self.registered_at = time.monotonic()
                        return
                except requests.RequestException:
                    pass
                if attempt < MAX_RETRIES - 1:
                    # The upstream jitter source: the fractional part of the monotonic clock.
                    self._stop.wait(upstream_delay(attempt, time.monotonic() % 1))
            self.gave_up = True
