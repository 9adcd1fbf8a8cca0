"""One worker kept listed by the gateway, from the POST that offers it to the DELETE that drains
it, while the served process is ready (docs/gateway.md, "How the protocol keeps the worker
listed", "Registration only when ready"); the gateway's answers are never trusted."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from typing import Any

from ...core._clock import Clock, SystemClock, Waker
from ...core._redact import clean
from ...core._settings import HttpSettings
from ...core._transport import RegisterOutcome, Route, RouteCheck, Verdict
from .._http import HttpTransport
from .._httpvalues import HttpResult
from .settings import KEY_ENV, SmgSettings

logger = logging.getLogger("registrar.protocols.smg.transport")

DEFAULT_WATCH_INTERVAL = 5.0
"""Seconds between checks of our worker: an operator's DELETE is undone within about this."""
MAX_LIST_BYTES = 16 * 1024 * 1024
"""What `GET /workers` may read (about 600 bytes a worker; any other answer: 64 KiB)."""
_POLL_FIRST, _POLL_MAX = 0.05, 1.0
_PASSING = {  # statuses of a worker on its way in or out: the route is neither there nor gone
    "pending": "the gateway is still adding the worker",
    "draining": "the gateway is removing the worker (draining); it is added again once gone",
}
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


class SmgTransport:
    """One gateway of `settings` (the first by default); `clock` is the registrar's."""

    def __init__(
        self, settings: SmgSettings, gateway: str | None = None, *, clock: Clock | None = None
    ) -> None:
        url = gateway if gateway is not None else settings.gateways[0]
        self._http = HttpTransport(
            HttpSettings(url, timeout=settings.timeout, verify=settings.verify),
            path="/workers",  # the endpoint its messages name
            auth=settings.auth,
        )
        self._http.token_hint = "check the gateway's control-plane key"
        self._http.token_how = f"give the key in a file (--gateway-key-file) or ${KEY_ENV}"
        self.display_url = self._http.display_url
        self._settings = settings
        self._clock: Clock = clock if clock is not None else SystemClock()
        # A URL is ready while it answers 2xx (one kept-alive connection); a callable, while True.
        self._ready_http: HttpTransport | None = None
        self._ready_path = "/"
        if isinstance(settings.ready, str):
            parts = settings.ready.split("/", 3)
            self._ready_http = HttpTransport(HttpSettings("/".join(parts[:3]), timeout=2.0))
            self._ready_path = "/" + parts[3] if len(parts) > 3 else "/"
        self.ready_interval = settings.ready_interval
        self._unready_since: float | None = None  # withdrawn only after `grace` seconds of it
        self.requests_sent = 0  # a refused connection is not counted
        self._stopping = threading.Event()
        self._abort_lock = threading.Lock()
        self._closing = False
        self.worker_id: str | None = None
        self._url: str | None = None
        self._posted = False  # a POST was sent whose answer (and worker id) may be lost
        self._draining_seen = False  # the worker followed was draining (a withdrawal, a DELETE)

    def fit_watch_interval(self, given: float | None, chosen: bool) -> float | None:
        """The caller's interval, else smg's own (`DEFAULT_WATCH_INTERVAL`), at every front door."""
        return given if chosen else DEFAULT_WATCH_INTERVAL

    def _reason(self) -> str | None:
        """Why the served process is not ready now (None: ready, or no check); never raises."""
        if callable(self._settings.ready):
            try:
                return None if self._settings.ready() else "the readiness callable answered False"
            except Exception as exc:
                return f"the readiness callable raised {type(exc).__name__}"
        if self._ready_http is None:
            return None
        result = self._ready_http.send("GET", self._ready_path)
        if result.error is not None:
            return f"GET {self._settings.ready}: {self._ready_http.describe_error(result.error)}"
        code = result.status_code
        if code is not None and 200 <= code < 300:
            return None
        return f"GET {self._settings.ready} answered {code}"

    def not_ready(self) -> str | None:
        reason = self._reason()
        if reason is None:
            self._unready_since = None
        elif self._unready_since is None:
            self._unready_since = self._clock.monotonic()
        return reason

    def _unready_for(self) -> float:
        """Seconds the served process has been seen not ready (0 when ready), asking now."""
        if self.not_ready() is None or self._unready_since is None:
            return 0.0
        return self._clock.monotonic() - self._unready_since

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        self._url = str(payload["url"])
        if self.worker_id is not None:
            # An earlier attempt's worker may still be in the gateway's queue: follow it.
            outcome = self._confirm(self.worker_id)
            if outcome is not None:
                return outcome
        for _ in range(2):  # again at once when the worker we adopted was being removed
            self._draining_seen = False
            result = self._send("POST", "/workers", json=dict(payload))
            self._posted = self._posted or not (result.refused or result.unsent)
            code = result.status_code
            if result.error is not None or code not in (200, 201, 202, 409):
                return self._http.classify_registration(result)
            worker_id = _worker_id_in(result)
            if worker_id is None:
                excerpt = self._http.excerpt(result)
                error = f"{code} from {self._http.endpoint} names no worker id: {excerpt}"
                return RegisterOutcome(Verdict.RETRY, code, error)
            if code == 409:
                url = clean(self._url, 200)
                logger.info(
                    "%s already holds worker %s at %s: adopted", self.display_url, worker_id, url
                )
            self.worker_id = worker_id
            self._posted = False
            outcome = self._confirm(worker_id)
            if outcome is not None:
                return outcome
            if not self._draining_seen:
                break
        dropped = f"the gateway dropped worker {clean(self._url, 200)} before listing it ready"
        why = "its add job failed (does the worker answer the gateway's /health?)"
        return RegisterOutcome(Verdict.RETRY, 404, f"{dropped}: {why} or the gateway restarted")

    def _confirm(self, worker_id: str) -> RegisterOutcome | None:
        """Poll our worker until listed ready; None when the gateway does not know the id (POST
        again). A RETRY keeps the id: the next attempt follows it instead of adding another."""
        deadline = self._clock.monotonic() + self._settings.confirm_timeout
        delay = _POLL_FIRST
        while True:
            result = self._send("GET", f"/workers/{worker_id}")
            code = result.status_code
            if result.error is None and code in (400, 404):
                self.worker_id = None
                return None
            info = result.json_object() if code == 200 else None
            if info is None:
                return self._http.classify_registration(result)
            status = info.get("status")
            self._draining_seen = self._draining_seen or status == "draining"
            if status == "ready" and info.get("is_healthy", True):
                return RegisterOutcome(Verdict.ACCEPTED, status_code=code)
            left = deadline - self._clock.monotonic()
            if left <= 0 or self._stopping.is_set():
                job = info.get("job_status")
                job = job if isinstance(job, dict) else {}
                seen = f"status {clean(status, 40)}, job {clean(job.get('status'), 40)}"
                within = f"within {self._settings.confirm_timeout:g} s"
                text = f"worker {clean(self._url, 200)} not listed ready {within} ({seen})"
                return RegisterOutcome(Verdict.RETRY, code, text)
            if self._clock.wait(self._stopping, min(delay, left)):
                continue  # stopping: one last look, then the answer above
            delay = min(delay * 2, _POLL_MAX)

    def _send(self, method: str, path: str, **kw: Any) -> HttpResult:
        result = self._http.send(method, path, **kw)
        if not result.refused:
            self.requests_sent += 1
        return result

    def check(self, payload: Mapping[str, Any]) -> RouteCheck:
        self._url = str(payload["url"])
        if self.worker_id is None:
            return self._find()
        unready = self._unready_for()
        if unready >= self._settings.grace:
            reason = clean(self.not_ready() or "not ready", 200)
            logger.warning(
                "%s: the worker has not been ready for %.1f s (%s); withdrawing it from the "
                "gateway",
                self.display_url,
                unready,
                reason,
            )
            evidence = f"withdrawn: not ready for {unready:.1f} s ({reason})"
            if not self._remove(wait=False):
                evidence += "; the gateway did not take the removal"
            return RouteCheck(Route.MISSING, None, evidence)
        check = self._classify(self._send("GET", f"/workers/{self.worker_id}"))
        self._http.settle_idle_signal(check.route is Route.PRESENT)
        return check

    def _classify(self, result: HttpResult) -> RouteCheck:
        """MISSING (the loop registers again) only when the gateway does not know the id."""
        if result.error is not None:
            return self._http.unreachable(result)
        code = result.status_code
        if code in (400, 404):
            gone = "(it restarted, or the worker was removed)"
            evidence = f"the gateway does not know worker {self.worker_id} {gone}"
            self.worker_id = None
            return RouteCheck(Route.MISSING, code, evidence)
        info = result.json_object() if code == 200 else None
        if info is None:
            excerpt = self._http.excerpt(result)
            return RouteCheck(Route.UNDETERMINED, code, f"unexpected {code}: {excerpt}")
        return self._listed(info, code)

    def _find(self) -> RouteCheck:
        """Before we know an id: our URL in the gateway's list, adopted when found."""
        result = self._send("GET", "/workers", limit=MAX_LIST_BYTES)
        if result.error is not None:
            return self._http.unreachable(result)
        code = result.status_code
        if code != 200:
            text = f"unexpected {code} for the worker list: {self._http.excerpt(result)}"
            return RouteCheck(Route.UNDETERMINED, code, text)
        ours = (self._url or "").rstrip("/")
        listed = (result.json_object() or {}).get("workers")
        if not isinstance(listed, list):
            return RouteCheck(Route.UNDETERMINED, 200, "the worker list could not be read")
        mine = [w for w in listed if isinstance(w, dict) and isinstance(w.get("id"), str)]
        mine = [w for w in mine if str(w.get("url", "")).rstrip("/") == ours]
        if not mine:
            return RouteCheck(Route.MISSING, 200, f"the gateway lists no worker at {ours}")
        self.worker_id = str(mine[0]["id"])
        self._posted = False
        return self._listed(mine[0], 200)

    def _listed(self, info: Mapping[str, Any], code: int | None) -> RouteCheck:
        listed = str(info.get("url", "")).rstrip("/")
        ours = (self._url or "").rstrip("/")
        if listed != ours:
            theirs = clean(listed, 200)
            return RouteCheck(Route.CONFLICT, code, f"our worker id lists {theirs}, not {ours}")
        passing = _PASSING.get(str(info.get("status")))
        if passing is not None:
            return RouteCheck(Route.UNDETERMINED, code, passing)
        healthy = info.get("is_healthy", True)
        health = "healthy" if healthy else "not healthy by the gateway's checks"
        status = clean(info.get("status"), 40)
        return RouteCheck(Route.PRESENT, code, f"listed as {self.worker_id} ({status}, {health})")

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait on the idle connection (a gateway that dies closes it); with a readiness check,
        True once the process has been not ready for `grace` (the check withdraws the worker)."""
        if self._settings.ready is None:
            return self._http.wait_idle(timeout, waker)
        end = self._clock.monotonic() + timeout
        while True:
            left = end - self._clock.monotonic()
            if left <= 0 or waker.is_set():
                return False
            if self._http.wait_idle(min(left, self.ready_interval), waker):
                return True
            if waker.is_set():
                return False
            if self._unready_for() >= self._settings.grace:
                return True

    def _remove(self, wait: bool = True) -> bool:
        """DELETE our worker and (`wait`) wait, within `drain_timeout`, until the gateway no
        longer lists it. True when it is gone (without `wait`: when the DELETE was taken)."""
        if self.worker_id is None and self._posted:
            self._find()  # a POST whose answer was lost: its worker may be listed
        worker_id = self.worker_id
        if worker_id is None:
            return True
        started = self._clock.monotonic()
        result = self._send("DELETE", f"/workers/{worker_id}")
        if result.error is not None or result.status_code not in (200, 202, 204, 400, 404):
            what = f"{result.status_code}: {self._http.excerpt(result)}"
            if result.error is not None:
                what = self._http.describe_error(result.error)
            logger.warning("%s: could not remove worker %s: %s", self.display_url, worker_id, what)
            return False
        if not wait:
            self.worker_id = None
            return True
        delay = _POLL_FIRST
        while True:
            probe = self._send("GET", f"/workers/{worker_id}")
            if probe.error is None and probe.status_code in (400, 404):
                self.worker_id = None
                took = self._clock.monotonic() - started
                logger.info("%s: worker %s removed after %.2f s", self.display_url, worker_id, took)
                return True
            left = started + self._settings.drain_timeout - self._clock.monotonic()
            if left <= 0:
                logger.warning(
                    "%s: worker %s still listed %g s after its DELETE",
                    self.display_url,
                    worker_id,
                    self._settings.drain_timeout,
                )
                return False
            self._clock.wait(threading.Event(), min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

    def resolution(self) -> str | None:
        return self._http.resolution()

    def abort(self) -> None:
        """End an attempt's wait for the gateway now (from `stop()`); `close` still drains,
        and a request of the drain is never cut (`stop()` may be called again meanwhile)."""
        with self._abort_lock:
            if self._closing:
                return
            self._stopping.set()
            self._http.abort()

    def close(self) -> None:
        """Drain: remove our worker from the gateway and wait until it is gone (bounded)."""
        with self._abort_lock:
            self._closing = True
        try:
            self._remove()
        finally:
            self._http.close()
            if self._ready_http is not None:
                self._ready_http.close()


def _worker_id_in(result: HttpResult) -> str | None:
    """The worker id a 202 (`worker_id`) or a 409 (in its error text) names."""
    body = result.json_object() or {}
    if isinstance(body.get("worker_id"), str) and _UUID.fullmatch(body["worker_id"]):
        return str(body["worker_id"])
    found = _UUID.search(body["error"]) if isinstance(body.get("error"), str) else None
    return found.group(0) if found else None
