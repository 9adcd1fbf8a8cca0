"""SGLang's model gateway (`smg`, the successor of sgl-router) as the registry: a worker added
through its control plane and kept there.

The gateway keeps the workers added by `POST /workers` in memory only, and "accepted" is not
"registered": the POST answers 202 with the worker's id, then a background job probes the
worker and lists it, or fails and forgets it without telling anyone. So:

- `register` looks up the id it already has (an earlier attempt may still be in the gateway's
  queue), else POSTs, then polls `GET /workers/{id}` with a short backoff, within
  `confirm_timeout`, until the worker is listed ready. A 404 meanwhile (the job failed, or the
  gateway restarted) is a failed attempt, retried. A 409 names the worker the gateway already
  holds at our URL: it is adopted, never added twice (the gateway keys workers by URL).
- `check` reads `GET /workers/{id}`: 404 means the gateway forgot us (every id is new after a
  restart; an operator's DELETE ends the same way) and the loop registers again. Before we know
  an id (the look before the first POST, or after an answer was lost) it searches the list for
  our URL and adopts what it finds.
- Between checks it waits on the idle kept-alive connection (`HttpTransport.wait_idle`): a
  gateway process that dies closes it, and the loop checks at once instead of at the next
  interval. While a readiness check is configured it also follows the served process: a
  worker not ready for `grace` seconds is withdrawn (DELETE) and offered again once ready
  (`not_ready`, the `Gated` hook the loop calls before each attempt).
- `close` (called once when the registrar stops) drains: `DELETE /workers/{id}`, then waits,
  within `drain_timeout`, until the gateway no longer lists the worker. The gateway marks it
  draining at once (no new requests) and removes it after its settle time (5 s by default),
  while the server is still up to finish what it was sent.

The control-plane key (`--control-plane-api-keys`) is sent as a bearer token, taken from a
file read before each request or from `$REGISTRAR_GATEWAY_KEY`; it never appears in a log or a
status. See docs/gateway.md.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ..core.clock import Clock, SystemClock
from ..core.errors import ConfigError
from ..core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from ..core.redact import clean
from ..core.transport import Timeout, Token, validate_url
from ..core.untrusted import load_json
from ..core.waker import Waker
from .http import HttpResult, HttpTransport

__all__ = [
    "DEFAULT_CONFIRM_TIMEOUT",
    "DEFAULT_DRAIN_TIMEOUT",
    "DEFAULT_GRACE",
    "DEFAULT_READY_INTERVAL",
    "DEFAULT_WATCH_INTERVAL",
    "KEY_ENV",
    "WORKER_TYPES",
    "Readiness",
    "SmgTransport",
    "UrlReadiness",
    "readiness",
    "validate_spec",
    "worker_spec",
]

logger = logging.getLogger(__name__)

KEY_ENV = "REGISTRAR_GATEWAY_KEY"
"""The variable holding the gateway's control-plane key when no key file is given."""
WORKER_TYPES = ("prefill", "decode", "regular")
DEFAULT_CONFIRM_TIMEOUT = 30.0
"""Seconds one attempt waits for the gateway to list the worker ready after its POST (a stand-in
worker is listed in about 0.1 s; a worker whose /health fails is dropped within about 2 s)."""
DEFAULT_DRAIN_TIMEOUT = 15.0
"""Seconds `close` waits for the gateway to stop listing the worker after its DELETE (the
gateway's own settle time is 5 s by default)."""
DEFAULT_GRACE = 10.0
"""Seconds the served process may be not ready before the worker is withdrawn."""
DEFAULT_READY_INTERVAL = 1.0
"""Seconds between readiness checks of the served process."""
DEFAULT_WATCH_INTERVAL = 5.0
"""Seconds between checks of our worker: an operator's DELETE is undone within about this."""
MAX_LIST_BYTES = 16 * 1024 * 1024
"""`GET /workers` is read up to this (about 600 bytes per worker); every other answer up to the
HTTP transport's usual cap (64 KiB)."""
_POLL_FIRST, _POLL_MAX = 0.05, 1.0
_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")

Readiness = Callable[[], str | None]
"""None when the served process is ready, else why not (one line)."""


def worker_spec(
    url: str, worker_type: str = "regular", bootstrap_port: int | None = None, **fields: Any
) -> dict[str, Any]:
    """The `POST /workers` body for a worker at `url`, or `ConfigError` naming the field. Other
    fields of the gateway's WorkerSpec (priority, cost, labels, ...) pass through."""
    spec: dict[str, Any] = {"url": url, "worker_type": worker_type, **fields}
    if bootstrap_port is not None:
        spec["bootstrap_port"] = bootstrap_port
    return validate_spec(spec)


def validate_spec(payload: object) -> dict[str, Any]:
    """A copy of `payload` with its URL normalised, or one `ConfigError` naming the field."""
    if not isinstance(payload, Mapping):
        raise ConfigError(f"payload must be a worker spec mapping, got {type(payload).__name__}")
    spec = dict(payload)
    spec["url"] = validate_url(spec.get("url"), "worker url")
    kind = spec.setdefault("worker_type", "regular")
    if kind not in WORKER_TYPES:
        raise ConfigError(f"worker_type must be one of {', '.join(WORKER_TYPES)}, got {kind!r}")
    port = spec.get("bootstrap_port")
    if port is not None:
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ConfigError(f"bootstrap_port must be a port within [1, 65535], got {port!r}")
        if kind != "prefill":
            raise ConfigError("bootstrap_port is for a prefill worker (worker_type=prefill)")
    return spec


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


class SmgTransport:
    """Keeps one worker listed by the smg gateway at `url` (see the module's docstring).

    `ready` (see `readiness`) gates the offer; `grace`, `confirm_timeout`, `drain_timeout` and
    `ready_interval` are seconds. `token` is the control-plane key (a string or a provider).
    `clock` and `sender` are for tests (a fake clock; an object whose `send` answers like
    `HttpTransport.send`)."""

    token_hint = "check the gateway's control-plane key"

    def __init__(
        self,
        url: str,
        *,
        token: Token | None = None,
        token_source: str = "the gateway key",
        timeout: Timeout = 5.0,
        verify: bool | str = True,
        ready: Readiness | None = None,
        grace: float = DEFAULT_GRACE,
        ready_interval: float = DEFAULT_READY_INTERVAL,
        confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        clock: Clock | None = None,
        sender: Any = None,
    ) -> None:
        self._http = HttpTransport(
            url,
            path="/workers",
            method="POST",
            token=token,
            token_source=token_source,
            timeout=timeout,
            verify=verify,
        )
        self._http.token_hint = self.token_hint
        self._http.token_how = f"give the key in a file (--gateway-key-file) or ${KEY_ENV}"
        for name, value in (
            ("grace", grace),
            ("ready_interval", ready_interval),
            ("confirm_timeout", confirm_timeout),
            ("drain_timeout", drain_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < 1e9:
                raise ConfigError(f"{name} must be a positive number of seconds, got {value!r}")
        self._ready = ready
        self._grace = float(grace)
        self._ready_interval = float(ready_interval)
        self._confirm_timeout = float(confirm_timeout)
        self._drain_timeout = float(drain_timeout)
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._sender = sender.send if sender is not None else self._http.send
        self.requests_sent = 0
        """Requests that reached the gateway so far (a refused connection is not counted)."""
        self._stopping = threading.Event()
        self._abort_lock = threading.Lock()
        self._closing = False
        self._worker_id: str | None = None
        self._url: str | None = None
        self._posted = False
        """A POST was sent whose worker we may not know the id of (its answer was lost)."""
        self._unready_since: float | None = None
        self._draining_seen = False
        """The worker an attempt follows was being removed (a withdrawal or an operator's
        DELETE not finished yet): once it is gone, POST again at once."""

    # ----------------------------------------------------------------- properties

    @property
    def display_url(self) -> str:
        return self._http.display_url

    @property
    def worker_id(self) -> str | None:
        """The gateway's id of our worker, when known."""
        return self._worker_id

    @property
    def drain_timeout(self) -> float:
        return self._drain_timeout

    @property
    def ready_interval(self) -> float:
        return self._ready_interval

    # ----------------------------------------------------------------- readiness

    def not_ready(self) -> str | None:
        """The `Gated` hook: why the worker must not be offered now (None: offer it)."""
        if self._ready is None:
            return None
        reason = self._ready()
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

    # ----------------------------------------------------------------- registering

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        self._url = str(payload["url"])
        if self._worker_id is not None:
            # An earlier attempt's worker may still be in the gateway's queue: follow it.
            outcome = self._confirm(self._worker_id)
            if outcome is not None:
                return outcome
        for _ in range(2):  # again at once when the worker we adopted was being removed
            self._draining_seen = False
            result = self._send("POST", "/workers", json=dict(payload))
            # Sent, unless refused: its worker may exist even if its answer is lost.
            self._posted = self._posted or not result.refused
            code = result.status_code
            if result.error is not None or code not in (200, 201, 202, 409):
                return self._http.classify_registration(result)
            worker_id = self._id_in(result)
            if worker_id is None:
                return RegisterOutcome(
                    Verdict.RETRY,
                    code,
                    f"{code} from {self._http.endpoint} names no worker id: "
                    f"{self._http.excerpt(result)}",
                )
            if code == 409:
                logger.info(
                    "%s already holds worker %s at %s: adopted",
                    self.display_url,
                    worker_id,
                    clean(self._url, 200),
                )
            self._worker_id = worker_id
            self._posted = False
            outcome = self._confirm(worker_id)
            if outcome is not None:
                return outcome
            if not self._draining_seen:
                break
        return RegisterOutcome(
            Verdict.RETRY,
            404,
            f"the gateway dropped worker {clean(self._url, 200)} before "
            "listing it ready: its add job failed (does the worker answer the gateway's "
            "/health?) or the gateway restarted",
        )

    def _id_in(self, result: HttpResult) -> str | None:
        """The worker id a 202 (`worker_id`) or a 409 (in its error text) names."""
        try:
            body = load_json(result.text)
        except ValueError:
            body = None
        if isinstance(body, dict):
            if isinstance(body.get("worker_id"), str) and _UUID.fullmatch(body["worker_id"]):
                return str(body["worker_id"])
            text = body.get("error")
            if isinstance(text, str):
                found = _UUID.search(text)
                return found.group(0) if found else None
        return None

    def _confirm(self, worker_id: str) -> RegisterOutcome | None:
        """Poll our worker until listed ready (ACCEPTED), within `confirm_timeout`. None when
        the gateway does not know the id (it was dropped: POST again); a RETRY outcome when the
        bound passed or the gateway could not be asked (the id is kept: the next attempt
        follows the same worker instead of adding another)."""
        deadline = self._clock.monotonic() + self._confirm_timeout
        delay = _POLL_FIRST
        while True:
            result = self._get_worker(worker_id)
            if result.error is not None:
                return self._http.classify_registration(result)
            code = result.status_code
            if code in (400, 404):
                self._worker_id = None
                return None
            info = self._info(result)
            if code != 200 or info is None:
                return self._http.classify_registration(result)
            status = info.get("status")
            self._draining_seen = self._draining_seen or status == "draining"
            if status == "ready" and info.get("is_healthy", True):
                return RegisterOutcome(Verdict.ACCEPTED, status_code=code)
            left = deadline - self._clock.monotonic()
            if left <= 0 or self._stopping.is_set():
                job = info.get("job_status") if isinstance(info.get("job_status"), dict) else {}
                return RegisterOutcome(
                    Verdict.RETRY,
                    code,
                    f"worker {clean(self._url, 200)} not listed ready within "
                    f"{self._confirm_timeout:g} s (status {clean(status, 40)!s}, job "
                    f"{clean((job or {}).get('status'), 40)!s})",
                )
            if self._clock.wait(self._stopping, min(delay, left)):
                continue  # stopping: one last look, then the answer above
            delay = min(delay * 2, _POLL_MAX)

    def _send(self, method: str, path: str, **kw: Any) -> HttpResult:
        result: HttpResult = self._sender(method, path, **kw)
        if not result.refused:
            self.requests_sent += 1
        return result

    def _get_worker(self, worker_id: str) -> HttpResult:
        return self._send("GET", f"/workers/{worker_id}")

    def _info(self, result: HttpResult) -> dict[str, Any] | None:
        if not result.complete:
            return None
        try:
            body = load_json(result.text)
        except ValueError:
            return None
        return body if isinstance(body, dict) else None

    # ----------------------------------------------------------------- the watch

    def check(self, payload: Mapping[str, Any]) -> RouteCheck:
        self._url = str(payload["url"])
        if self._ready is not None and self._worker_id is not None:
            unready = self._unready_for()
            if unready >= self._grace:
                return self._withdraw_unready(unready)
        if self._worker_id is None:
            return self._find()
        result = self._get_worker(self._worker_id)
        check = self._classify(result)
        self._http.settle_idle_signal(check.route is Route.PRESENT)
        return check

    def _classify(self, result: HttpResult) -> RouteCheck:
        if result.error is not None:
            return RouteCheck(
                Route.UNREACHABLE,
                evidence=self._http.describe_error(result.error),
                refused=result.refused,
                broken=result.reconnected,
            )
        code = result.status_code
        if code in (400, 404):
            forgotten, self._worker_id = self._worker_id, None
            return RouteCheck(
                Route.MISSING,
                code,
                f"the gateway does not know worker {forgotten} (it restarted, "
                "or the worker was removed)",
            )
        info = self._info(result) if code == 200 else None
        if info is None:
            return RouteCheck(
                Route.UNDETERMINED, code, f"unexpected {code}: {self._http.excerpt(result)}"
            )
        return self._classify_listed(info, code)

    def _classify_listed(self, info: Mapping[str, Any], code: int | None) -> RouteCheck:
        listed = str(info.get("url", "")).rstrip("/")
        ours = (self._url or "").rstrip("/")
        if listed != ours:
            theirs = clean(listed, 200)
            return RouteCheck(Route.CONFLICT, code, f"our worker id lists {theirs}, not {ours}")
        status = clean(info.get("status"), 40)
        if info.get("status") == "pending":
            return RouteCheck(Route.UNDETERMINED, code, "the gateway is still adding the worker")
        if info.get("status") == "draining":
            return RouteCheck(
                Route.UNDETERMINED,
                code,
                "the gateway is removing the worker (draining); it is added again once gone",
            )
        health = (
            "healthy" if info.get("is_healthy", True) else "not healthy by the gateway's checks"
        )
        return RouteCheck(Route.PRESENT, code, f"listed as {self._worker_id} ({status}, {health})")

    def _find(self) -> RouteCheck:
        """Before we know an id: our URL in the gateway's list, adopted when found."""
        result = self._send("GET", "/workers", limit=MAX_LIST_BYTES)
        if result.error is not None or result.status_code != 200:
            return (
                self._classify(result)
                if result.error is not None
                else RouteCheck(
                    Route.UNDETERMINED,
                    result.status_code,
                    f"unexpected {result.status_code} for the worker list: "
                    f"{self._http.excerpt(result)}",
                )
            )
        body = self._info(result)
        listed = body.get("workers") if body is not None else None
        if not isinstance(listed, list):
            return RouteCheck(Route.UNDETERMINED, 200, "the worker list could not be read")
        ours = (self._url or "").rstrip("/")
        mine = [
            w
            for w in listed
            if isinstance(w, dict)
            and str(w.get("url", "")).rstrip("/") == ours
            and isinstance(w.get("id"), str)
        ]
        if not mine:
            return RouteCheck(Route.MISSING, 200, f"the gateway lists no worker at {ours}")
        self._worker_id = str(mine[0]["id"])
        self._posted = False
        return self._classify_listed(mine[0], 200)

    def _withdraw_unready(self, unready: float) -> RouteCheck:
        reason = self.not_ready() or "not ready"
        logger.warning(
            "%s: the worker has not been ready for %.1f s (%s); withdrawing it from the gateway",
            self.display_url,
            unready,
            clean(reason, 200),
        )
        removed = self._remove(wait=False)
        return RouteCheck(
            Route.MISSING,
            None,
            f"withdrawn: not ready for {unready:.1f} s ({clean(reason, 200)})"
            + ("" if removed else "; the gateway did not take the removal"),
        )

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait on the idle connection (a gateway that dies closes it: True at once); with a
        readiness check, look at the served process every `ready_interval` seconds, and say
        True once it has been not ready for `grace` (the check then withdraws the worker)."""
        if self._ready is None:
            return self._http.wait_idle(timeout, waker)
        end = self._clock.monotonic() + timeout
        while True:
            left = end - self._clock.monotonic()
            if left <= 0 or waker.is_set():
                return False
            if self._http.wait_idle(min(left, self._ready_interval), waker):
                return True
            if waker.is_set():
                return False
            if self._unready_for() >= self._grace:
                return True

    # ----------------------------------------------------------------- the end

    def _remove(self, wait: bool = True) -> bool:
        """DELETE our worker and (`wait`) wait, within `drain_timeout`, until the gateway no
        longer lists it. True when it is gone (without `wait`: when the DELETE was taken)."""
        worker_id = self._worker_id
        if worker_id is None and self._posted:
            self._find()  # a POST whose answer was lost: its worker may be listed
            worker_id = self._worker_id
        if worker_id is None:
            return True
        started = self._clock.monotonic()
        result = self._send("DELETE", f"/workers/{worker_id}")
        if result.error is not None or result.status_code not in (200, 202, 204, 400, 404):
            what = (
                self._http.describe_error(result.error)
                if result.error is not None
                else f"{result.status_code}: {self._http.excerpt(result)}"
            )
            logger.warning("%s: could not remove worker %s: %s", self.display_url, worker_id, what)
            return False
        if not wait:
            self._worker_id = None
            return True
        delay = _POLL_FIRST
        while True:
            probe = self._get_worker(worker_id)
            if probe.error is None and probe.status_code in (400, 404):
                self._worker_id = None
                logger.info(
                    "%s: worker %s removed after %.2f s",
                    self.display_url,
                    worker_id,
                    self._clock.monotonic() - started,
                )
                return True
            left = started + self._drain_timeout - self._clock.monotonic()
            if left <= 0:
                logger.warning(
                    "%s: worker %s still listed %g s after its DELETE",
                    self.display_url,
                    worker_id,
                    self._drain_timeout,
                )
                return False
            self._clock.wait(threading.Event(), min(delay, left))
            delay = min(delay * 2, _POLL_MAX)

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
            closing = getattr(self._ready, "close", None)
            if callable(closing):
                closing()

