"""The generic HTTP transport: the payload as JSON on one kept-alive connection (a pool would hide
the re-opening that is evidence of a restart, and cost 2-5 times the CPU: docs/benchmarks.md)."""

from __future__ import annotations

import http.client
import json as _json
import logging
import ssl
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from urllib3.exceptions import HTTPError

from .._version import __version__
from ..core._clock import Waker, wait_readable
from ..core._diagnosis import Evidence
from ..core._errors import describe_exception, root_cause
from ..core._redact import clean, redact_url
from ..core._settings import HttpSettings
from ..core._transport import (
    RegisterOutcome,
    Route,
    RouteCheck,
    Token,
    Verdict,
    connect_read,
    deadline_seconds,
)
from ._deadline import DeadlineExceeded, Watchdog
from ._httpconn import (
    ConnectTimeout,
    Link,
    LocalError,
    ReadTimeout,
    Request,
    TlsError,
    TlsFiles,
    exchange,
)
from ._httpvalues import (
    DEFAULT_MAX_ANSWER_BYTES,
    Credentials,
    Endpoint,
    HttpResult,
    TokenUnavailable,
    parse_retry_after,
)
from ._probe import Answer, gather
from ._resolver import RESOLVER, Unresolved

logger = logging.getLogger("registrar.protocols.http")

_RETRIED_4XX = frozenset({408, 429})
_RETRY_AFTER_CODES = frozenset({429, 503})
EXCERPT_BYTES = 1024  # an error answer is read up to this many bytes
# How an exchange fails rather than answers; anything else is a bug, left to the loop's log.
_EXCHANGE_ERRORS = (HTTPError, http.client.HTTPException, OSError, ValueError)
# A connection idle longer may have met the server's own idle timeout (aiohttp: 75 s): re-opening
# it proves nothing about a restart.
KEEPALIVE_WINDOW = 60.0
MAX_HARMLESS_CLOSES = 2  # closes a check showed harmless, after which closes are no sign


class HttpTransport:
    """`PUT {url}{path}` with the payload as JSON, from its settings value as it is (validated
    when it was made); `timeout` bounds the whole request (docs/index.md). A protocol fixes by
    keyword the path, the token and where it came from (named in messages), a client certificate."""

    token_hint = "check the auth token"
    token_how = "pass one with token="

    def __init__(
        self,
        settings: HttpSettings,
        *,
        path: str = "/route",
        auth: tuple[Token | None, str] | None = None,
        cert: tuple[str, str] | None = None,
    ) -> None:
        self._url = settings.url
        token, source = (settings.token, "token") if auth is None else auth
        self._auth = Credentials(self._url, token, source)
        self.display_url = redact_url(self._url)
        self._path = path if path.startswith("/") else f"/{path}"
        self.deadline = deadline_seconds(settings.timeout)  # seconds one request may take in all
        self._connect_timeout, self._read_timeout = connect_read(settings.timeout)
        self._watchdog = Watchdog()
        where = Endpoint.of(self._url)
        # Proxies from the environment are not followed: the server is on the cluster's network.
        tls = TlsFiles(settings.verify, cert) if where.tls else None
        self._link = Link(where.host, where.port, tls, self._watchdog)
        self._prefix = where.prefix
        self._headers = {
            "User-Agent": f"registrar/{__version__}",
            "Accept-Encoding": "gzip, deflate",  # only what httpconn decodes, with a cap
            **self._auth.fixed,
        }
        self._last_end = 0.0  # when the last exchange ended (monotonic)
        self._kept_alive = False
        self._refused = False  # the last exchange was refused: probe before the next
        # Which closes of the idle connection are signs of a restart: not those after the idle
        # time of a close a check showed harmless (the server's idle timeout), nor after
        # KEEPALIVE_WINDOW, nor any once MAX_HARMLESS_CLOSES proved harmless (idle times too
        # short to tell apart).
        self._signal_age: float | None = None  # idle seconds of the close a check is to settle
        self._closes_idle_after: float | None = None  # this server's own idle timeout, learned
        self._harmless = 0

    @property
    def endpoint(self) -> str:
        return f"{self.display_url}{self._path}"

    def close(self) -> None:
        self._link.discard_probe()
        self._link.close()
        self._watchdog.end()

    def abort(self) -> None:
        """End the request in flight now, as if its deadline had passed (any thread)."""
        self._watchdog.fire()

    def resolution(self) -> str | None:
        """For the status: "resolving NAME" while the lookup stalls or fails (any thread)."""
        return RESOLVER.describe(self._link.host)

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """True if the server closed the idle connection, as an exiting server process does at once:
        a sign the route may be gone long before the next check (docs/sglang.md)."""
        deadline = time.monotonic() + timeout
        if not wait_readable(self._link.sock if self._kept_alive else None, timeout, waker):
            return False
        # Readable while idle: closed, reset or written on unasked; not reusable either way.
        age = time.monotonic() - self._last_end
        self._link.close()
        learned = self._closes_idle_after
        early = learned is None or age < 0.5 * learned
        if early and age < KEEPALIVE_WINDOW and self._harmless < MAX_HARMLESS_CLOSES:
            self._signal_age = age  # for the check to settle
            return True
        # The server's own idle timeout: opening the connection again proves nothing.
        self._kept_alive = False
        waker.wait(max(0.0, deadline - time.monotonic()))
        return False

    def settle_idle_signal(self, route_survived: bool) -> None:
        """What the check after a sign found; the server's idle timeout, logged if newly learned."""
        age, self._signal_age = self._signal_age, None
        if age is None or not route_survived:
            return
        self._harmless += 1
        if self._closes_idle_after is None or age < self._closes_idle_after:
            self._closes_idle_after = age
            logger.info(
                "%s closes idle connections after about %.1f s; such closes no longer trigger "
                "a route check",
                self.display_url,
                age,
            )

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """A generic service has no route query; the SGLang transport overrides this."""
        return None

    def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        limit: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """One request within its deadline, the body capped; failures are returned, never raised."""
        refusal = self._link.probe_port(self._connect_timeout) if self._refused else None
        if refusal is not None:
            self._last_end = time.monotonic()
            return HttpResult(None, {}, "", refusal, reconnected=False, refused=True)
        try:
            was_alive = self._kept_alive and time.monotonic() - self._last_end < KEEPALIVE_WINDOW
            request = self._prepare(method, path, json, headers)
            if isinstance(request, HttpResult):
                return request
            return self._exchange(request, limit, was_alive)
        finally:
            self._link.discard_probe()

    def _exchange(self, request: Request, limit: int | None, was_alive: bool) -> HttpResult:
        opened_before, moves_before = self._link.opened_count, self._link.moves
        response: urllib3.BaseHTTPResponse | None = None
        error: BaseException | None = None
        body, complete, kept = b"", False, False
        due = self._watchdog.begin(self.deadline)
        try:
            conn = self._link.ensure(self._connect_timeout)
            response, body, complete = exchange(conn, request, self._read_timeout, self._cap(limit))
            # Only an HTTP/1.1 answer read whole that did not close it leaves it reusable
            # (`http.client` closes the connection of a `Connection: close` or HTTP/1.0 answer;
            # re-opening one cut at the cap is our doing, not evidence).
            kept = complete and response.version == 11 and conn.sock is not None
        except _EXCHANGE_ERRORS as exc:
            error = exc
        finally:
            fired = self._watchdog.end()
        self._last_end = time.monotonic()
        # Evidence even of a request cut at its deadline; a moved address is a replaced server.
        reopened = was_alive and self._link.opened_count > opened_before
        reconnected = reopened or self._link.moves > moves_before
        # A socket timeout as long as the deadline may beat the deadline thread: the same time
        # ran out. A lookup says so itself ("could not resolve NAME within 1.0 s").
        unresolved = isinstance(error, Unresolved) and not self._watchdog.by_abort
        timed_out = isinstance(error, TimeoutError) and self._last_end >= due
        abandoned = not unresolved and (fired or timed_out)
        self._kept_alive = kept and not abandoned
        if not self._kept_alive:
            self._link.close()
        # A refusal is evidence of its own; `reconnected` is about the connection we had.
        self._refused = not abandoned and isinstance(error, ConnectionRefusedError)
        if abandoned:
            # Whatever the shutdown made the exchange look like (an EOF inside the headers can
            # pass for a complete answer).
            why = f"no complete answer within the request deadline of {self.deadline:g} s"
            if self._watchdog.by_abort:
                why = "request abandoned: stopping"
            return HttpResult(None, {}, "", DeadlineExceeded(why), reconnected=reconnected)
        if error is not None or response is None:
            # Our kept-alive connection broken under the request, or re-opened for it.
            unbroken = isinstance(error, TimeoutError | TlsError | LocalError | Unresolved)
            broken = isinstance(error, OSError | http.client.HTTPException) and not unbroken
            lost = (reconnected or (was_alive and broken)) and not self._refused
            return HttpResult(None, {}, "", error, reconnected=lost, refused=self._refused)
        text = body.decode("utf-8", "replace")
        return HttpResult(
            response.status, response.headers, text, None, reconnected, complete=complete
        )

    def _prepare(
        self, method: str, path: str, json: Any, headers: Mapping[str, str] | None
    ) -> Request | HttpResult:
        """The request (method, target, body, headers), or the result of one that cannot be made."""
        try:
            auth = self._auth.asked()
        except Exception as exc:  # a provider that fails fails this request, like the network
            return HttpResult(None, {}, "", TokenUnavailable(describe_exception(exc)), False)
        sent = {**self._headers, **(auth or {}), **(headers or {})}
        data: bytes | None = None
        if json is not None:
            try:
                data = _json.dumps(json, allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                return HttpResult(None, {}, "", ValueError(f"payload is not JSON: {exc}"), False)
            sent["Content-Type"] = "application/json"
        elif method in ("PUT", "POST", "PATCH"):
            data = b""
        return method, f"{self._prefix}{path}", data, sent

    def _cap(self, limit: int | None) -> Callable[[int], int]:
        if limit is not None:
            return lambda _: limit
        return lambda status: DEFAULT_MAX_ANSWER_BYTES if 200 <= status < 300 else EXCERPT_BYTES

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        return self.classify_registration(self.send("PUT", self._path, json=dict(payload)))

    def evidence(self, payload: Mapping[str, Any]) -> Evidence:
        """What a fresh probe sees, the rank's own HTTP port knocked on too when it has one."""
        port = payload.get("prefill_http_port")
        http_port = port if isinstance(port, int) and not isinstance(port, bool) else None
        return gather(self._url, self.probe_path or self._path, self.recognise, http_port=http_port)

    probe_path: str | None = None  # what the probe GETs (None: the registration path)

    def recognise(self, answer: Answer) -> bool:
        """Whether the probe's answer is this server's: a generic one has no signature."""
        return answer.content_type != "text/html"

    def describe_error(self, exc: BaseException) -> str:
        """The root cause of a failed exchange: one line, escaped, capped, secret-free."""
        if isinstance(exc, DeadlineExceeded):
            text = str(exc)
        elif isinstance(exc, TokenUnavailable):
            text = f"no bearer token: {exc}"
        elif isinstance(exc, TlsError):
            found = describe_exception(exc)
            text = f"TLS failed with {self.endpoint}: {found}"
            if isinstance(root_cause(exc), ssl.SSLCertVerificationError):
                fix = "pass the server's CA bundle (ca_bundle=...)"
                text = f"TLS certificate verification failed for {self.endpoint}: {found}; {fix}"
        elif isinstance(exc, ConnectTimeout):
            text = f"connect timed out after {self._connect_timeout} s"
        elif isinstance(exc, ReadTimeout):
            text = f"no answer within the read timeout of {self._read_timeout} s"
        else:
            text = describe_exception(exc)
        return clean(text, secrets=self._auth.secrets)

    def unreachable(self, result: HttpResult) -> RouteCheck:
        assert result.error is not None
        evidence = self.describe_error(result.error)
        refused, broken = result.refused, result.reconnected
        return RouteCheck(Route.UNREACHABLE, evidence=evidence, refused=refused, broken=broken)

    def excerpt(self, result: HttpResult) -> str:
        """A short, single-line, escaped, secret-free piece of a response body."""
        flat = " ".join(result.text.split())
        return clean(flat, 200, self._auth.secrets, cut=not result.complete)

    def classify_registration(self, result: HttpResult) -> RegisterOutcome:
        if result.error is not None:
            fatal = isinstance(result.error, TlsError | http.client.InvalidURL)
            verdict = Verdict.FATAL if fatal else Verdict.RETRY
            text = self.describe_error(result.error)
            return RegisterOutcome(
                verdict, error=text, refused=result.refused, unsent=result.unsent
            )
        code = result.status_code
        assert code is not None
        if 200 <= code < 300:
            return RegisterOutcome(Verdict.ACCEPTED, status_code=code)
        label = f"{code} {http.client.responses.get(code, 'Unknown Status')} from {self.endpoint}"
        body = self.excerpt(result)
        if code >= 500 or code in _RETRIED_4XX:
            header = result.headers.get("Retry-After") if code in _RETRY_AFTER_CODES else None
            retry_after = parse_retry_after(header, time.time())
            detail = f"{label}: {body}" if body else label
            return RegisterOutcome(Verdict.RETRY, code, detail, retry_after=retry_after)
        if code in (401, 403):
            hint = self._auth.hint(self.token_hint, self.token_how)
        elif 300 <= code < 400:
            # Not even a redacted Location: its query may carry a token of its own.
            hint = (
                "redirected elsewhere (the Location is not shown: it may carry credentials); "
                "point the URL at the bootstrap server itself"
            )
        elif code in (404, 405):
            hint = "check the bootstrap URL: this server does not take registrations there"
        elif code == 413:
            hint = "the payload is larger than the server accepts"
        else:
            hint = f"check the payload ({body})" if body else "check the payload"
        return RegisterOutcome(Verdict.FATAL, status_code=code, error=f"{label}: {hint}")
