"""Whether the served process is ready: the gate before a worker is offered to the gateway, and
the reason it is withdrawn after `grace` seconds of not being ready (docs/gateway.md,
"Registration only when ready")."""

from __future__ import annotations

from collections.abc import Callable

from ...core._clock import Clock
from ...core._waker import Waker
from .._http import HttpTransport
from .settings import SmgSettings

Readiness = Callable[[], str | None]
"""None when the served process is ready, else why not (one line)."""


class ReadinessGate:
    """From the settings' `ready` (a URL ready while it answers 2xx on one kept-alive
    connection, or a callable answering True) or a given `ready` check: since when the process
    has been not ready, so that a worker is withdrawn after `grace` seconds, not at one look."""

    def __init__(self, settings: SmgSettings, clock: Clock, ready: Readiness | None) -> None:
        self._http: HttpTransport | None = None
        if ready is None and isinstance(settings.ready, str):
            self._http = HttpTransport("/".join(settings.ready.split("/", 3)[:3]), timeout=2.0)
            ready = _url_check(settings.ready, self._http)
        elif ready is None and callable(settings.ready):
            ready = _called(settings.ready)
        self.ready = ready
        self._clock = clock
        self.grace = settings.grace
        self.interval = settings.ready_interval
        self._unready_since: float | None = None

    def not_ready(self) -> str | None:
        if self.ready is None:
            return None
        reason = self.ready()
        if reason is None:
            self._unready_since = None
        elif self._unready_since is None:
            self._unready_since = self._clock.monotonic()
        return reason

    def unready_for(self) -> float:
        """Seconds the served process has been seen not ready (0 when ready)."""
        if self.not_ready() is None or self._unready_since is None:
            return 0.0
        return self._clock.monotonic() - self._unready_since

    def wait(self, idle: Callable[[float, Waker], bool], timeout: float, waker: Waker) -> bool:
        """`idle(seconds, waker)` in steps of `interval`, looking at the served process between
        them: True when `idle` says so or the process has been not ready for `grace`."""
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
        if self._http is not None:
            self._http.close()


def _called(check: Callable[[], bool]) -> Readiness:
    def called() -> str | None:
        try:
            return None if check() else "the readiness callable answered False"
        except Exception as exc:
            return f"the readiness callable raised {type(exc).__name__}"

    return called


def _url_check(url: str, http: HttpTransport) -> Readiness:
    parts = url.split("/", 3)
    path = "/" + parts[3] if len(parts) > 3 else "/"

    def get() -> str | None:
        result = http.send("GET", path)
        if result.error is not None:
            return f"GET {url}: {http.describe_error(result.error)}"
        if result.status_code is not None and 200 <= result.status_code < 300:
            return None
        return f"GET {url} answered {result.status_code}"

    return get
