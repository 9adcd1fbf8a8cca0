"""The generic HTTP transport: the payload sent as JSON, classified by status.

It implements `registrar.core.transport.Transport`; the SGLang protocol builds on it. It uses
one `requests.Session`, used by the registrar's thread only, with `max_retries=0` (registrar owns
retrying) and a hook on urllib3's connection class that counts new connections: urllib3
silently re-opens a pooled keep-alive connection the server dropped, and a dropped connection is
evidence that the server process restarted.
"""

from __future__ import annotations

import http
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .. import __version__
from ..core.errors import describe_exception, root_cause
from ..core.outcome import RegisterOutcome, RouteCheck, Verdict
from ..core.redact import redact_text, redact_url
from ..core.transport import Timeout, validate_timeout, validate_url

__all__ = [
    "HttpResult",
    "HttpTransport",
    "parse_retry_after",
]

logger = logging.getLogger(__name__)

_RETRIED_4XX = frozenset({408, 429})
_RETRY_AFTER_CODES = frozenset({429, 503})
# A pooled connection idle for longer than this may have been closed by the server's own idle
# timeout (aiohttp: 75 s), so re-opening it then proves nothing about a restart.
KEEPALIVE_WINDOW = 60.0


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or HTTP-date), or None."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment.tzinfo is None:
        return None
    return max(0.0, moment.timestamp() - now)


@dataclass(frozen=True)
class HttpResult:
    """One HTTP exchange: an answer, or the exception that stopped it."""

    status_code: int | None
    headers: Mapping[str, str]
    text: str
    error: BaseException | None
    reconnected: bool
    """The kept-alive connection to the server had to be opened again for this request, or
    broke under it."""
    refused: bool = False
    """The connection was refused: nothing listens there."""


class _ConnectionCounter:
    def __init__(self) -> None:
        self.opened = 0


class _CountingAdapter(HTTPAdapter):
    """An adapter whose pools build connections that count themselves when they connect."""

    def __init__(self, counter: _ConnectionCounter) -> None:
        self._counter = counter
        super().__init__(max_retries=0, pool_connections=1, pool_maxsize=1)

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        counter = self._counter

        class CountingHTTPConnection(HTTPConnection):
            def connect(self) -> None:
                counter.opened += 1
                super().connect()

        class CountingHTTPSConnection(HTTPSConnection):
            def connect(self) -> None:
                counter.opened += 1
                super().connect()

        class Pool(HTTPConnectionPool):
            ConnectionCls = CountingHTTPConnection

        class SecurePool(HTTPSConnectionPool):
            ConnectionCls = CountingHTTPSConnection

        self.poolmanager.pool_classes_by_scheme = {"http": Pool, "https": SecurePool}


class HttpTransport:
    """Registers by sending the payload as JSON (`PUT {url}{path}` by default).

    `verify` is True (system CAs), False, or the path of a CA bundle. Credentials in the URL are
    sent as basic auth and never shown; the token is sent as `Authorization: Bearer`.
    """

    token_hint = "check the auth token"

    def __init__(
        self,
        url: str,
        *,
        path: str = "/route",
        method: str = "PUT",
        token: str | None = None,
        timeout: Timeout = 5.0,
        verify: bool | str = True,
    ) -> None:
        self._url = validate_url(url)
        self._display_url = redact_url(self._url)
        self._path = path if path.startswith("/") else f"/{path}"
        self._method = method
        self._timeout = validate_timeout(timeout)
        self._token = token
        self._secrets = tuple(s for s in (token, urlsplit(self._url).password) if s)
        self._counter = _ConnectionCounter()
        self._session = requests.Session()
        self._session.trust_env = False
        self._session.verify = verify
        adapter = _CountingAdapter(self._counter)
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.headers["User-Agent"] = f"registrar/{__version__}"
        if token:
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._last_end: float | None = None
        self._kept_alive = False

    @property
    def display_url(self) -> str:
        return self._display_url

    @property
    def endpoint(self) -> str:
        """The registration URL, credentials redacted."""
        return f"{self._display_url}{self._path}"

    def close(self) -> None:
        self._session.close()

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """A generic service has no route query; the SGLang transport overrides this."""
        return None

    def send(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
    ) -> HttpResult:
        """One request; exceptions are caught and returned, never raised."""
        opened_before = self._counter.opened
        started = time.monotonic()
        was_alive = (
            self._kept_alive
            and self._last_end is not None
            and started - self._last_end < KEEPALIVE_WINDOW
        )
        try:
            response = self._session.request(
                method,
                f"{self._url}{path}",
                json=json,
                params=params,
                timeout=self._timeout,
                allow_redirects=False,
            )
            text = response.text
        except requests.RequestException as exc:
            self._kept_alive = False
            self._last_end = time.monotonic()
            # A kept-alive connection that breaks under a request was closed by the server: the
            # same evidence of a restart as having to open it again.
            broken = isinstance(
                exc, requests.ConnectionError | requests.exceptions.ChunkedEncodingError
            ) and not isinstance(exc, requests.exceptions.ConnectTimeout)
            # A refusal is evidence of its own; this is about the connection we had.
            refused = broken and isinstance(root_cause(exc), ConnectionRefusedError)
            lost = was_alive and broken and not refused
            return HttpResult(None, {}, "", exc, reconnected=lost, refused=refused)
        self._last_end = time.monotonic()
        connection = response.headers.get("Connection", "").lower()
        self._kept_alive = response.raw.version == 11 and connection != "close"
        reconnected = was_alive and self._counter.opened > opened_before
        return HttpResult(response.status_code, response.headers, text, None, reconnected)

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        result = self.send(self._method, self._path, json=dict(payload))
        return self.classify_registration(result)

    def describe_error(self, exc: BaseException) -> str:
        """Root cause of a failed exchange, secret-free."""
        if isinstance(exc, requests.exceptions.SSLError):
            text = (
                f"TLS certificate verification failed for {self.endpoint}: "
                f"{describe_exception(exc)}; pass the server's CA bundle (ca_bundle=...)"
            )
        elif isinstance(exc, requests.exceptions.ConnectTimeout):
            text = f"connect timed out after {self._connect_timeout()} s"
        elif isinstance(exc, requests.exceptions.ReadTimeout):
            text = f"no answer within the read timeout of {self._read_timeout()} s"
        else:
            text = describe_exception(exc)
        return redact_text(text, self._secrets)

    def _connect_timeout(self) -> float:
        return self._timeout[0] if isinstance(self._timeout, tuple) else self._timeout

    def _read_timeout(self) -> float:
        return self._timeout[1] if isinstance(self._timeout, tuple) else self._timeout

    def excerpt(self, text: str, limit: int = 200) -> str:
        """A short, single-line, secret-free piece of a response body."""
        flat = " ".join(text.split())
        if len(flat) > limit:
            flat = flat[:limit] + "..."
        return redact_text(flat, self._secrets)

    def classify_registration(self, result: HttpResult) -> RegisterOutcome:
        """Map one registration exchange to a verdict."""
        if result.error is not None:
            fatal = isinstance(
                result.error,
                requests.exceptions.SSLError | requests.exceptions.InvalidURL,
            )
            return RegisterOutcome(
                Verdict.FATAL if fatal else Verdict.RETRY,
                error=self.describe_error(result.error),
            )
        code = result.status_code
        assert code is not None
        if 200 <= code < 300:
            return RegisterOutcome(Verdict.ACCEPTED, status_code=code)
        label = f"{code} {_phrase(code)} from {self.endpoint}"
        body = self.excerpt(result.text)
        if code >= 500 or code in _RETRIED_4XX:
            retry_after = None
            if code in _RETRY_AFTER_CODES:
                retry_after = parse_retry_after(result.headers.get("Retry-After"), time.time())
            detail = f"{label}: {body}" if body else label
            return RegisterOutcome(
                Verdict.RETRY, status_code=code, error=detail, retry_after=retry_after
            )
        if code in (401, 403):
            hint = self.token_hint
        elif 300 <= code < 400:
            hint = (
                f"redirected to {redact_url(result.headers.get('Location', '?'))}; "
                "point the URL at the bootstrap server itself"
            )
        elif code in (404, 405):
            hint = "check the bootstrap URL: this server does not take registrations there"
        elif code == 413:
            hint = "the payload is larger than the server accepts"
        else:
            hint = f"check the payload ({body})" if body else "check the payload"
        return RegisterOutcome(Verdict.FATAL, status_code=code, error=f"{label}: {hint}")


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "Unknown Status"
