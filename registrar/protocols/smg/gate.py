"""Whether the served process is ready: the gate before a worker is offered to the gateway, and
the reason it is withdrawn after `grace` seconds of not being ready. From a URL (ready while it
answers 2xx, e.g. SGLang's `/ready`) or from a callable."""

from __future__ import annotations

from collections.abc import Callable

from ...core.clock import Clock
from ...core.transport import validate_url
from ...core.waker import Waker
from ..http import HttpTransport

Readiness = Callable[[], str | None]
"""None when the served process is ready, else why not (one line)."""


def readiness(ready: str | Callable[[], bool] | None, timeout: float = 2.0) -> Readiness | None:
    """A readiness check from a URL (ready while it answers 2xx, e.g. SGLang's `/ready`) or a
    callable answering True when ready; None for none."""
    if ready is None:
        return None
    if callable(ready):
        check = ready

        def called() -> str | None:
            try:
                return None if check() else "the readiness callable answered False"
            except Exception as exc:
                return f"the readiness callable raised {type(exc).__name__}"

        return called
    return UrlReadiness(ready, timeout)


class UrlReadiness:
    """Ready while `GET url` answers 2xx, on one kept-alive connection (closed by `close`)."""

    def __init__(self, url: str, timeout: float = 2.0) -> None:
        self._url = validate_url(url, "ready url")
        parts = self._url.split("/", 3)
        self._path = "/" + parts[3] if len(parts) > 3 else "/"
        self._http = HttpTransport("/".join(parts[:3]), timeout=timeout)

    def __call__(self) -> str | None:
        result = self._http.send("GET", self._path)
        if result.error is not None:
            return f"GET {self._url}: {self._http.describe_error(result.error)}"
        if result.status_code is not None and 200 <= result.status_code < 300:
            return None
        return f"GET {self._url} answered {result.status_code}"

    def close(self) -> None:
        self._http.close()


class ReadinessGate:
    """The served process's readiness over time: since when it has been not ready, so that a
    worker is withdrawn only after `grace` seconds of it, not at the first failed look."""

    def __init__(
        self, ready: Readiness | None, clock: Clock, grace: float, interval: float
    ) -> None:
        self.ready = ready
        self._clock = clock
        self.grace = grace
        self.interval = interval
        self._unready_since: float | None = None

    def not_ready(self) -> str | None:
        """Why the worker must not be offered now (None: offer it), asking now."""
        if self.ready is None:
            return None
        reason = self.ready()
        if reason is None:
            self._unready_since = None
        elif self._unready_since is None:
            self._unready_since = self._clock.monotonic()
        return reason

    def unready_for(self) -> float:
        """Seconds the served process has been seen not ready (0 when ready), asking now."""
        if self.not_ready() is None or self._unready_since is None:
            return 0.0
        return self._clock.monotonic() - self._unready_since

    def wait(self, idle: Callable[[float, Waker], bool], timeout: float, waker: Waker) -> bool:
        """`idle(seconds, waker)` in steps of `interval`, looking at the served process
        between them: True when `idle` says so or the process has been not ready for
        `grace`; False on timeout or when the waker is set."""
        end = self._clock.monotonic() + timeout
        while True:
            left = end - self._clock.monotonic()
            if left <= 0 or waker.is_set():
                return False
            if idle(min(left, self.interval), waker):
                return True
            if waker.is_set():
                return False
            if self.unready_for() >= self.grace:
                return True

    def close(self) -> None:
        """Close the check's connection, if it keeps one (`UrlReadiness`)."""
        closing = getattr(self.ready, "close", None)
        if callable(closing):
            closing()
