"""The generic HTTP transport: the payload sent as JSON, classified by status.

It implements `registrar.core.transport.Transport`; the SGLang protocol builds on it. It speaks
HTTP/1.1 through the standard library's `http.client` on one kept-alive connection, used by the
registrar's thread only, which it opens, reuses and re-opens itself: a kept-alive connection the
server dropped is evidence that the server process restarted, and this module sees every one.
It does not go through `requests`: a registration is two or three small requests, and requests'
session, adapter and pool layers cost about five times the CPU of the exchange itself (0.65 ms
against 0.12 ms per request, measured against SGLang's bootstrap server), which a fleet of
ranks in one process pays when a server appears and every rank registers at once.

Nothing a server does may hold the registrar's thread or its memory: every request has a
wall-clock deadline (a socket timeout bounds each read, not their sum, so a server sending one
byte every 400 ms, an endless chunked body or endless `100 Continue` answers would hold it for
ever), enforced by a helper thread that shuts the request's socket down; and an answer is read
and decoded (gzip, deflate) up to a cap, by this module, never by urllib3 (which inflates a
whole chunk at once before 2.6).
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import http
import http.client
import json as _json
import logging
import math
import os
import re
import select
import socket
import ssl
import struct
import threading
import time
import zlib
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import mktime_tz, parsedate_tz
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from .._version import __version__
from ..core.errors import ConfigError, describe_exception, root_cause
from ..core.outcome import RegisterOutcome, RouteCheck, Verdict
from ..core.redact import Secrets, clean, redact_url
from ..core.transport import Timeout, Token, validate_timeout, validate_url
from ..core.waker import Waker

__all__ = [
    "DEFAULT_MAX_ANSWER_BYTES",
    "EXCERPT_BYTES",
    "MAX_HARMLESS_CLOSES",
    "RETRY_AFTER_CEILING",
    "ConnectTimeout",
    "DeadlineExceeded",
    "HttpResult",
    "HttpTransport",
    "ReadTimeout",
    "TlsError",
    "TlsFiles",
    "TokenUnavailable",
    "parse_retry_after",
    "validate_token",
]

logger = logging.getLogger(__name__)

_RETRIED_4XX = frozenset({408, 429})
_RETRY_AFTER_CODES = frozenset({429, 503})
# A pooled connection idle for longer than this may have been closed by the server's own idle
# timeout (aiohttp: 75 s), so re-opening it then proves nothing about a restart.
KEEPALIVE_WINDOW = 60.0
RETRY_AFTER_CEILING = 365 * 24 * 3600.0
"""A year: no Retry-After is read as longer (the registrar's own cap is far smaller)."""
_DELTA_SECONDS = re.compile("[0-9]+")
MAX_HARMLESS_CLOSES = 2
"""Closes of the idle connection that a check showed harmless, after which this server's
closes are no longer taken as signs of a restart (the watch interval remains)."""
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024
"""A successful answer is read and decoded up to this many bytes (SGLang's are under 200)."""
EXCERPT_BYTES = 1024
"""An error answer is read up to this many bytes: its excerpt shows no more than that."""
_CHUNK = 16 * 1024
_RAW_SLACK = 4
"""Compressed bytes read may exceed the decoded cap this many times over (a gzip stream of
empty blocks inflates to nothing), plus one chunk."""
# Everything by which an exchange fails rather than answers. Anything else raised inside a
# request is a bug, left to the registrar's loop to log and classify (see core/registrar.py).
_EXCHANGE_ERRORS = (http.client.HTTPException, OSError, ValueError)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks to wait, parsed as urllib3 does: ASCII digits or an
    HTTP-date; None when it is neither. Never raises: `str.isdigit()` accepts `²`, which
    `float()` refuses, and a date may overflow. Anything beyond `RETRY_AFTER_CEILING` is that
    ceiling (the registrar applies its own, smaller cap: `max_retry_after`)."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELTA_SECONDS.fullmatch(text):
        # Compare digit counts before converting: int() refuses over 4300 digits.
        if len(text.lstrip("0")) > len(str(int(RETRY_AFTER_CEILING))):
            return RETRY_AFTER_CEILING
        return min(float(int(text)), RETRY_AFTER_CEILING)
    seconds = _seconds_until(text, now)
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_CEILING)


def _seconds_until(date: str, now: float) -> float | None:
    """Seconds from `now` to an HTTP-date, None when it is not one (or overflows)."""
    try:
        moment = parsedate_tz(date)
        if moment is None:
            return None
        return float(mktime_tz(moment)) - now
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


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
    complete: bool = True
    """The whole body was read and decoded; False when it was cut at the cap."""


class DeadlineExceeded(TimeoutError):
    """No complete answer within the request's deadline (however slowly bytes came)."""


class ConnectTimeout(TimeoutError):
    """Connecting (TCP, then the TLS handshake) took longer than the connect timeout."""


class ReadTimeout(TimeoutError):
    """No byte of the answer within the read timeout."""


class TlsError(ConnectionError):
    """TLS refused the exchange: the server's certificate failed verification, the handshake
    failed, or the server's TLS layer answered with an alert (say, about our certificate).
    Retrying does not fix it: the registration fails with what to change."""


class _LocalError(OSError):
    """A file this side needs (CA bundle, client certificate) could not be read: the attempt
    fails and is retried (it may be mid-rotation); it says nothing of the server."""


class TokenUnavailable(RuntimeError):
    """The token provider failed (say, the token file is missing mid-rotation): the request is
    not sent and is retried like a network failure."""


class _Deadlines:
    """One helper thread for the whole process that ends requests past their deadline.

    Each transport's `_Watchdog` arms it per request. A thread per transport cost a thread
    per registrar and a wake-up of it per request (about a tenth of a registration's CPU in a
    fleet of 200); this one sleeps until the earliest deadline and is woken only when a sooner
    one is armed. Entries of requests that ended are dropped when they come due. After a fork
    the child starts afresh (the parent's thread does not exist there)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self.cond = threading.Condition()
        self._heap: list[tuple[float, int, _Watchdog]] = []
        self._count = 0
        self._thread: threading.Thread | None = None

    def arm(self, watchdog: _Watchdog, at: float) -> None:
        """Called with `cond` held."""
        self._count += 1
        soonest = self._heap[0][0] if self._heap else None
        heapq.heappush(self._heap, (at, self._count, watchdog))
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="registrar-deadline", daemon=True
            )
            self._thread.start()
        elif soonest is None or at < soonest:
            self.cond.notify()

    def _run(self) -> None:
        with self.cond:
            while True:
                if not self._heap:
                    self.cond.wait()
                    continue
                at, _, watchdog = self._heap[0]
                if watchdog.at != at:  # that request ended (or was re-armed) meanwhile
                    heapq.heappop(self._heap)
                    continue
                left = at - time.monotonic()
                if left > 0:
                    self.cond.wait(left)
                    continue
                heapq.heappop(self._heap)
                watchdog.expire()


_DEADLINES = _Deadlines()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_DEADLINES._reset)


class _Watchdog:
    """Bounds each request of one transport in wall-clock time.

    When the request in flight outlives its deadline, the process's deadline thread
    (`_Deadlines`) shuts the transport's sockets down: that wakes a blocked connect, TLS
    handshake or read at once, where a socket timeout would wait again after every byte.
    Sockets are the connections' own (a TLS socket is handed over before its handshake), so
    the shutdown reaches a handshake too."""

    def __init__(self) -> None:
        self.at: float | None = None
        """When the request in flight is due to end; None between requests."""
        self._fired = False
        self.by_abort = False
        """The request's end came from `fire()` (a stop), not from its deadline."""
        self._sockets: set[socket.socket] = set()

    def begin(self, seconds: float) -> float:
        """Arm for a request of at most `seconds`; when it is due (monotonic)."""
        with _DEADLINES.cond:
            self.at = due = time.monotonic() + seconds
            self.by_abort = False
            self._fired = False
            _DEADLINES.arm(self, due)
            return due

    def end(self) -> bool:
        """Disarm; whether the deadline fired during the request."""
        with _DEADLINES.cond:
            self.at = None
            return self._fired

    def fire(self) -> None:
        """End the request in flight now, if any (from any thread). Not the next one: a
        transport may still have requests to make as it closes (etcd revokes its lease)."""
        with _DEADLINES.cond:
            if self.at is not None:
                self.by_abort = True
                self.at = time.monotonic()
                _DEADLINES.arm(self, self.at)

    def expire(self) -> None:
        """The deadline passed (called by the deadline thread, with its lock held)."""
        self._fired = True
        self.at = None
        for sock in self._sockets:
            _shutdown(sock)

    def track(self, sock: socket.socket) -> None:
        with _DEADLINES.cond:
            self._sockets.add(sock)
            if self._fired:  # opened after the deadline passed, within the same request
                _shutdown(sock)

    def untrack(self, sock: socket.socket) -> None:
        with _DEADLINES.cond:
            self._sockets.discard(sock)

    def close(self) -> None:
        """Nothing to end: the deadline thread is the process's, and holds no socket of a
        transport between its requests."""
        self.end()


def _ready(fds: list[int], timeout: float, write: bool = False) -> set[int]:
    """The descriptors among `fds` ready to read (or to write) within `timeout` seconds, or
    closed, reset or in error. `poll()`, not `select()`: a fleet of registrars in one process
    holds thousands of descriptors, and `select()` refuses any numbered 1024 or above."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return {fd for fd, _ in poller.poll(max(0, math.ceil(timeout * 1000)))}


def _shutdown(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        # Reset when closed, not closed gracefully: a request given up at its deadline must not
        # reach the server later from the send queue (a PUT counted after a look found nothing).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):  # already closed by its peer or its connection
        # The plain socket's shutdown, on a TLS socket too: `SSLSocket.shutdown` would also
        # unwrap it under the thread that is reading it.
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class TlsFiles:
    """The TLS context for `verify` (True: the system's CAs; False: no verification; a path:
    that CA bundle or folder) and an optional client certificate (`cert`: certificate file,
    key file). `context()` builds it when a connection opens and keeps it while those files
    are unchanged: a rotated CA bundle or certificate is read again, and one missing for now
    fails that connection (`OSError`, retried) instead of the registrar."""

    def __init__(self, verify: bool | str, cert: tuple[str, str] | None) -> None:
        self._verify = verify
        self._cert = cert
        self._files = ([verify] if isinstance(verify, str) else []) + list(cert or ())
        self._built: tuple[tuple[float, ...], ssl.SSLContext] | None = None

    def context(self) -> ssl.SSLContext:
        try:
            stamp = tuple(os.stat(path).st_mtime for path in self._files)
        except OSError as exc:
            which = "CA certificate bundle" if exc.filename == self._verify else "certificate"
            raise _LocalError(
                f"could not read the TLS {which} {exc.filename!s}: {exc.strerror}"
            ) from None
        if self._built is not None and self._built[0] == stamp:
            return self._built[1]
        try:
            if self._verify is False:
                context = ssl.create_default_context()
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
            elif isinstance(self._verify, str):
                if os.path.isdir(self._verify):
                    context = ssl.create_default_context(capath=self._verify)
                else:
                    context = ssl.create_default_context(cafile=self._verify)
            else:
                context = ssl.create_default_context()
        except (OSError, ValueError) as exc:
            raise _LocalError(
                f"could not load the TLS CA certificate bundle {self._verify}: "
                f"{describe_exception(exc)}"
            ) from None
        if self._cert is not None:
            try:
                context.load_cert_chain(*self._cert)
            except (OSError, ValueError) as exc:
                raise _LocalError(
                    f"could not load the TLS client certificate {self._cert[0]}: "
                    f"{describe_exception(exc)}"
                ) from None
        self._built = (stamp, context)
        return context


class _Link:
    """The transport's one connection to the server, used by one thread at a time.

    Opened on demand (on the socket a probe already connected, when there is one), counted
    (a kept-alive connection that had to be opened again is evidence that the server
    restarted), and watched: its socket goes to the watchdog, whose shutdown then reaches it
    even inside a TLS handshake."""

    def __init__(self, host: str, port: int, tls: TlsFiles | None, watchdog: _Watchdog) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.watchdog = watchdog
        self.conn: http.client.HTTPConnection | None = None
        self.watched: socket.socket | None = None
        self.opened = 0
        self.probe: socket.socket | None = None

    @property
    def sock(self) -> socket.socket | None:
        sock = self.conn.sock if self.conn is not None else None
        return sock if isinstance(sock, socket.socket) and sock.fileno() >= 0 else None

    def ensure(self, connect_timeout: float) -> None:
        """A usable connection: the kept one, unless the server closed it meanwhile (or wrote
        on it unasked: it cannot be reused either way), else a new one."""
        sock = self.sock
        if sock is not None:
            try:
                readable = _ready([sock.fileno()], 0)
            except (OSError, ValueError):
                readable = {-1}
            if not readable:
                return
        self.close()
        self.opened += 1
        fresh = self.take_probe()
        try:
            if fresh is None:
                fresh = socket.create_connection((self.host, self.port), connect_timeout)
                fresh.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except TimeoutError as exc:
            raise ConnectTimeout(f"connect timed out after {connect_timeout:g} s") from exc
        conn = http.client.HTTPConnection(self.host, self.port)
        conn.sock = fresh
        self.conn = conn
        self._watch(fresh)
        if self.tls is None:
            return
        fresh.settimeout(connect_timeout)
        try:
            # Wrapped first, shaken hands after: the watchdog then holds the TLS socket (the
            # same descriptor; `fresh` is detached by the wrap) during the handshake too.
            wrapped = self.tls.context().wrap_socket(
                fresh, server_hostname=self.host, do_handshake_on_connect=False
            )
            conn.sock = wrapped
            self._watch(wrapped)
            wrapped.do_handshake()
        except TimeoutError as exc:
            raise ConnectTimeout(f"TLS handshake timed out after {connect_timeout:g} s") from exc
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            raise  # the server closed the connection: a broken connection, not a TLS verdict
        except (ssl.SSLError, ssl.CertificateError) as exc:
            raise TlsError(describe_exception(exc)) from exc

    def _watch(self, sock: socket.socket) -> None:
        """Hand the connection's own socket to the watchdog (no duplicate: one descriptor
        per connection, so a fleet of registrars in one process stays within its limit)."""
        if self.watched is not None:
            self.watchdog.untrack(self.watched)
        self.watched = sock
        self.watchdog.track(sock)

    def take_probe(self) -> socket.socket | None:
        sock, self.probe = self.probe, None
        return sock

    def discard_probe(self) -> None:
        sock = self.take_probe()
        if sock is not None:
            sock.close()

    def close(self) -> None:
        # Untracked before it is closed: the deadline thread never shuts down a descriptor
        # that may have been closed and numbered again for another connection.
        watched, self.watched = self.watched, None
        if watched is not None:
            self.watchdog.untrack(watched)
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()


def _decoder(encoding: str) -> Any:
    """A zlib decompressor for a Content-Encoding, None for identity; ValueError otherwise."""
    name = encoding.strip().lower()
    if name in ("", "identity"):
        return None
    if name in ("gzip", "x-gzip"):
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    if name == "deflate":
        return zlib.decompressobj()
    raise ValueError(f"answer in an unsupported Content-Encoding {clean(encoding, 40)!r}")


def _read_capped(response: http.client.HTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` decoded bytes of the body, and whether that was all of it. Inflation is
    bounded as it happens (`max_length`), so a small bomb costs no more than `limit`."""
    decoder = _decoder(response.headers.get("Content-Encoding", ""))
    body = bytearray()
    read = 0
    while True:
        chunk = response.read(_CHUNK)
        if not chunk:
            if response.length:  # http.client ends a short body quietly: it is not complete
                raise http.client.IncompleteRead(bytes(body), response.length)
            if decoder is not None:
                body += decoder.flush()[: limit + 1 - len(body)]
            return bytes(body[:limit]), len(body) <= limit
        read += len(chunk)
        if decoder is None:
            body += chunk
        else:
            while chunk and len(body) <= limit:
                try:
                    body += decoder.decompress(chunk, limit + 1 - len(body))
                except zlib.error as exc:
                    name = clean(response.headers.get("Content-Encoding", ""), 40)
                    raise ValueError(f"undecodable {name} answer: {exc}") from None
                chunk = decoder.unconsumed_tail
        if len(body) > limit or read > _RAW_SLACK * limit + _CHUNK:
            return bytes(body[:limit]), False


class HttpTransport:
    """Registers by sending the payload as JSON (`PUT {url}{path}` by default).

    `verify` is True (system CAs), False, or the path of a CA bundle. Credentials in the URL are
    sent as basic auth and never shown; the token is sent as `Authorization: Bearer` (one or the
    other: both is a `ConfigError`, so a 401 can only blame the credential that was sent).
    `token_source` names where the token came from, for messages (never the token itself).

    `timeout` is the request's deadline: a float bounds the whole request (connect, TLS, headers
    and body together) and each step within it; a (connect, read) pair bounds connecting and
    each read, and the whole request by their sum. `max_answer_bytes` caps what is read and
    decoded of a successful answer; an error answer is read up to `EXCERPT_BYTES`.
    """

    token_hint = "check the auth token"
    token_how = "pass one with token="

    def __init__(
        self,
        url: str,
        *,
        path: str = "/route",
        method: str = "PUT",
        token: Token | None = None,
        token_source: str = "token",
        timeout: Timeout = 5.0,
        verify: bool | str = True,
        max_answer_bytes: int = DEFAULT_MAX_ANSWER_BYTES,
        cert: tuple[str, str] | None = None,
    ) -> None:
        self._url = validate_url(url)
        if not callable(token):
            token = validate_token(token, token_source)
        parts = urlsplit(self._url)
        userinfo = parts.username is not None or parts.password is not None
        if token and userinfo:
            raise ConfigError(
                f"url carries credentials (user:password@) and {token_source} sets a bearer "
                "token; give one of them (a request carries one Authorization header)"
            )
        self._display_url = redact_url(self._url)
        self._path = path if path.startswith("/") else f"/{path}"
        self._method = method
        self._timeout = validate_timeout(timeout)
        self._deadline = sum(self._timeout) if isinstance(self._timeout, tuple) else self._timeout
        if (
            isinstance(max_answer_bytes, bool)
            or not isinstance(max_answer_bytes, int)
            or max_answer_bytes < 1
        ):
            raise ConfigError(
                f"max_answer_bytes must be a positive integer, got {max_answer_bytes!r}"
            )
        self._max_answer_bytes = max_answer_bytes
        # A provider is asked before each request (rotation); a fixed token is set once.
        self._token_provider = token if callable(token) else None
        self._tokens_seen: set[str] = set() if callable(token) or not token else {token}
        self._has_token = bool(token)
        self._token_source = token_source
        self._userinfo = userinfo
        self._basic = (parts.username or "", parts.password or "") if userinfo else None
        self._secrets = Secrets.of(self._tokens_seen, basic=self._basic)
        self._watchdog = _Watchdog()
        default_port = 443 if parts.scheme == "https" else 80
        self._address = (parts.hostname or "", parts.port or default_port)
        # A client certificate (mutual TLS) is for etcd; proxies from the environment are not
        # followed (the bootstrap server is on the cluster's own network).
        tls = TlsFiles(verify, cert) if parts.scheme == "https" else None
        self._link = _Link(self._address[0], self._address[1], tls, self._watchdog)
        self._prefix = parts.path.rstrip("/")
        self._headers = {
            "User-Agent": f"registrar/{__version__}",
            # Only what this module decodes, with a cap.
            "Accept-Encoding": "gzip, deflate",
        }
        if isinstance(token, str) and token:
            self._headers["Authorization"] = f"Bearer {token}"
        elif self._basic is not None:
            user, password = (unquote(part) for part in self._basic)
            basic = b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()
            self._headers["Authorization"] = f"Basic {basic}"
        self._last_end: float | None = None
        self._kept_alive = False
        self._refused = False  # the last exchange was refused: probe before the next request
        self._probe_address: tuple[float, Any] | None = None
        self._signal_age: float | None = None
        """Idle seconds at which the server closed our connection, while the check it triggered
        has not yet said whether the route survived."""
        self._closes_idle_after: float | None = None
        """Idle seconds after which this server closes connections on its own (learned)."""
        self._harmless_closes = 0

    @property
    def display_url(self) -> str:
        return self._display_url

    @property
    def endpoint(self) -> str:
        """The registration URL, credentials redacted."""
        return f"{self._display_url}{self._path}"

    @property
    def deadline(self) -> float:
        """Seconds one request may take in all."""
        return self._deadline

    def close(self) -> None:
        self._link.discard_probe()
        self._link.close()
        self._watchdog.close()

    def abort(self) -> None:
        """End the request in flight now, as if its deadline had passed (any thread)."""
        self._watchdog.fire()

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait on the idle kept-alive connection: a server process that exits (restart, crash)
        closes it at once, which is read as a sign that the route may be gone (True).

        A server that closes idle connections on its own would make that a loop of checks:
        once a close was followed by a check that found the route in place
        (`settle_idle_signal`), closes after that much idle time are taken as the server's
        idle timeout and the rest of the wait is on the timer; so are closes after
        KEEPALIVE_WINDOW, and every close once MAX_HARMLESS_CLOSES proved harmless (a server
        that closes at once, where idle times are too short to tell apart). A connection that
        was not kept alive (HTTP/1.0, `Connection: close`) is not watched at all."""
        deadline = time.monotonic() + timeout
        try:
            wake = waker.fileno()
        except ValueError:  # closed: the registrar is ending; still wait, never spin
            waker.wait(timeout)
            return False
        sock = self._idle_socket()
        if sock is None:
            waker.wait(timeout)
            return False
        try:
            readable = _ready([sock.fileno(), wake], timeout)
        except (OSError, ValueError):
            waker.wait(max(0.0, deadline - time.monotonic()))
            return False
        if not readable or waker.is_set():
            return False
        # Readable while idle: the server closed (or reset, or wrote on) the connection; it
        # cannot be reused either way.
        age = time.monotonic() - (self._last_end if self._last_end is not None else 0.0)
        self._drop_pooled()
        if (
            age < KEEPALIVE_WINDOW
            and self._harmless_closes < MAX_HARMLESS_CLOSES
            and (self._closes_idle_after is None or age < 0.5 * self._closes_idle_after)
        ):
            self._signal_age = age
            return True
        # The server's own idle timeout: opening the connection again proves nothing.
        self._kept_alive = False
        remaining = deadline - time.monotonic()
        if remaining > 0:
            waker.wait(remaining)
        return False

    def settle_idle_signal(self, route_survived: bool) -> None:
        """Say what the check after a `wait_idle` sign found. A route that survived means the
        server closed the connection on its own after that much idle time (its idle timeout),
        so later closes after as long are not taken as signs."""
        age, self._signal_age = self._signal_age, None
        if age is None or not route_survived:
            return
        self._harmless_closes += 1
        if self._closes_idle_after is None or age < self._closes_idle_after:
            self._closes_idle_after = age
            logger.info(
                "%s closes idle connections after about %.1f s; such closes no longer trigger "
                "a route check",
                self._display_url,
                age,
            )

    def _idle_socket(self) -> socket.socket | None:
        return self._link.sock if self._kept_alive else None

    def _drop_pooled(self) -> None:
        self._link.close()

    def _probe(self) -> ConnectionRefusedError | None:
        """After a refusal, try a bare TCP connect first: another refusal costs a few tens of
        µs of CPU instead of ~0.1 ms for a whole request (and wakes no
        watchdog thread: the connect is non-blocking, bounded by the connect timeout). A
        connected socket is handed to the next connection, so the server sees one connection
        either way. The address is resolved once per second at most while refused."""
        now = time.monotonic()
        if self._probe_address is None or now - self._probe_address[0] > 1.0:
            try:
                info = socket.getaddrinfo(*self._address, 0, socket.SOCK_STREAM)[0]
            except OSError:
                return None  # the request itself will meet the error and name it
            self._probe_address = (now, info)
        family, kind, proto, _, address = self._probe_address[1]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            code = sock.connect_ex(address)
            if code in (errno.EINPROGRESS, errno.EWOULDBLOCK):
                ready = _ready([sock.fileno()], self._connect_timeout(), write=True)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if ready else -1
        except OSError:
            sock.close()
            return None
        if code == errno.ECONNREFUSED:
            sock.close()
            return ConnectionRefusedError(code, os.strerror(code))
        if code != 0:
            sock.close()
            return None
        sock.setblocking(True)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._link.discard_probe()
        self._link.probe = sock
        return None

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
        limit: int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        """One request within the deadline; failures are returned, never raised. The body is
        read up to `limit` bytes whatever the status, by default up to `max_answer_bytes` for
        a success and `EXCERPT_BYTES` otherwise. `headers` are added to this request only."""
        if self._refused:
            refusal = self._probe()
            if refusal is not None:
                self._last_end = time.monotonic()
                return HttpResult(None, {}, "", refusal, reconnected=False, refused=True)
        try:
            return self._send(method, path, json=json, params=params, limit=limit, headers=headers)
        finally:
            self._link.discard_probe()

    def _send(
        self,
        method: str,
        path: str,
        *,
        json: Any,
        params: Mapping[str, str | int] | None,
        limit: int | None,
        headers: Mapping[str, str] | None = None,
    ) -> HttpResult:
        opened_before = self._link.opened
        started = time.monotonic()
        was_alive = (
            self._kept_alive
            and self._last_end is not None
            and started - self._last_end < KEEPALIVE_WINDOW
        )
        prepared = self._prepare(method, path, json, params, headers)
        if isinstance(prepared, HttpResult):
            return prepared
        target, data, sent = prepared
        response: http.client.HTTPResponse | None = None
        error: BaseException | None = None
        body, complete = b"", False
        due = self._watchdog.begin(self._deadline)
        try:
            self._link.ensure(self._connect_timeout())
            response, body, complete = self._exchange(method, target, data, sent, limit)
        except _EXCHANGE_ERRORS as exc:
            error = exc
        finally:
            fired = self._watchdog.end()
        self._last_end = time.monotonic()
        self._refused = False
        # A socket timeout as long as the deadline can end the request a moment before the
        # deadline thread does (a busy machine): it ran out of the same time.
        if fired or (isinstance(error, TimeoutError) and self._last_end >= due):
            return self._abandoned()
        if error is not None or response is None:
            return self._failed(error, was_alive)
        # Only an answer read whole leaves its connection reusable: one cut at the cap is
        # closed here, and re-opening it is our own doing, not evidence of a restart.
        self._kept_alive = complete and response.version == 11 and not response.will_close
        if not self._kept_alive:
            self._link.close()
        reconnected = was_alive and self._link.opened > opened_before
        text = body.decode("utf-8", "replace")
        answer_headers: Mapping[str, str] = response.headers  # type: ignore[assignment]
        return HttpResult(
            response.status, answer_headers, text, None, reconnected, complete=complete
        )

    def _prepare(
        self,
        method: str,
        path: str,
        json: Any,
        params: Mapping[str, str | int] | None,
        headers: Mapping[str, str] | None,
    ) -> tuple[str, bytes | None, dict[str, str]] | HttpResult:
        """The request's target, body and headers, or the result of a request that cannot be
        made (a token provider that failed, a payload that is not JSON)."""
        try:
            auth = self._auth_header()
        except Exception as exc:  # a provider that fails fails this request, like the network
            return HttpResult(None, {}, "", TokenUnavailable(describe_exception(exc)), False)
        sent = dict(self._headers)
        if auth is not None:
            sent.update(auth)
        if headers:
            sent.update(headers)
        data: bytes | None = None
        if json is not None:
            try:
                data = _json.dumps(json, allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                return HttpResult(None, {}, "", ValueError(f"payload is not JSON: {exc}"), False)
            sent["Content-Type"] = "application/json"
        elif method in ("PUT", "POST", "PATCH"):
            data = b""
        target = f"{self._prefix}{path}"
        if params:
            target = f"{target}?{urlencode(params)}"
        return target, data, sent

    def _abandoned(self) -> HttpResult:
        """The deadline (or a stop) ended the request: whatever the shutdown made the exchange
        look like (an EOF inside the headers can even pass for a complete answer), it ran out
        of time."""
        self._kept_alive = False
        self._link.close()
        exceeded = DeadlineExceeded(
            "request abandoned: stopping"
            if self._watchdog.by_abort
            else f"no complete answer within the request deadline of {self._deadline:g} s"
        )
        return HttpResult(None, {}, "", exceeded, reconnected=False)

    def _failed(self, error: BaseException | None, was_alive: bool) -> HttpResult:
        self._kept_alive = False
        self._link.close()
        # A kept-alive connection that breaks under a request was closed by the server: the
        # same evidence of a restart as having to open it again.
        broken = isinstance(error, OSError | http.client.HTTPException) and not isinstance(
            error, TimeoutError | TlsError | _LocalError
        )
        # A refusal is evidence of its own; this is about the connection we had.
        refused = isinstance(error, ConnectionRefusedError)
        lost = was_alive and broken and not refused
        self._refused = refused
        return HttpResult(None, {}, "", error, reconnected=lost, refused=refused)

    def _exchange(
        self,
        method: str,
        target: str,
        data: bytes | None,
        headers: Mapping[str, str],
        limit: int | None,
    ) -> tuple[http.client.HTTPResponse, bytes, bool]:
        """Send one request on the link's connection and read the answer, its body up to
        `limit` (by default, by status); a timeout or a TLS alert is named for what it is."""
        conn = self._link.conn
        assert conn is not None
        sock = conn.sock
        if isinstance(sock, socket.socket):
            sock.settimeout(self._read_timeout())
        try:
            conn.request(method, target, body=data, headers=dict(headers))
            response = conn.getresponse()
            try:
                if limit is None:
                    ok = 200 <= response.status < 300
                    limit = self._max_answer_bytes if ok else EXCERPT_BYTES
                body, complete = _read_capped(response, limit)
            finally:
                # Its buffered reader holds the socket open; the connection keeps its own.
                response.close()
            return response, body, complete
        except TimeoutError as exc:
            raise ReadTimeout(
                f"no answer within the read timeout of {self._read_timeout():g} s"
            ) from exc
        except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
            raise  # the server closed the connection
        except ssl.SSLError as exc:
            raise TlsError(describe_exception(exc)) from exc

    def _auth_header(self) -> dict[str, str] | None:
        """The Authorization header from the token provider, if there is one; every token it
        answers joins the secrets kept out of error texts."""
        if self._token_provider is None:
            return None
        token = self._token_provider()
        if not token:
            return None
        # The same rule as a fixed token; the error names the provider, never the token.
        token = validate_token(token, f"the token from {self._token_source}")
        assert token is not None
        if token not in self._tokens_seen:
            self._tokens_seen.add(token)
            self._secrets = Secrets.of(self._tokens_seen, basic=self._basic)
        return {"Authorization": f"Bearer {token}"}

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        result = self.send(self._method, self._path, json=dict(payload))
        return self.classify_registration(result)

    def describe_error(self, exc: BaseException) -> str:
        """Root cause of a failed exchange: one line, escaped, capped, secret-free."""
        if isinstance(exc, DeadlineExceeded):
            text = str(exc)
        elif isinstance(exc, TokenUnavailable):
            text = f"no bearer token: {exc}"
        elif isinstance(exc, TlsError):
            if isinstance(root_cause(exc), ssl.SSLCertVerificationError | ssl.CertificateError):
                text = (
                    f"TLS certificate verification failed for {self.endpoint}: "
                    f"{describe_exception(exc)}; pass the server's CA bundle (ca_bundle=...)"
                )
            else:
                text = f"TLS failed with {self.endpoint}: {describe_exception(exc)}"
        elif isinstance(exc, ConnectTimeout):
            text = f"connect timed out after {self._connect_timeout()} s"
        elif isinstance(exc, ReadTimeout):
            text = f"no answer within the read timeout of {self._read_timeout()} s"
        else:
            text = describe_exception(exc)
        return clean(text, secrets=self._secrets)

    def credentials_hint(self) -> str:
        """What to check after a 401/403: the credential that was actually sent."""
        if self._has_token:
            return f"{self.token_hint} (from {self._token_source})"
        if self._userinfo:
            return "check the user name and password in the URL (sent as basic auth)"
        return f"the server wants credentials and none were sent; {self.token_how}"

    def _connect_timeout(self) -> float:
        return self._timeout[0] if isinstance(self._timeout, tuple) else self._timeout

    def _read_timeout(self) -> float:
        return self._timeout[1] if isinstance(self._timeout, tuple) else self._timeout

    def excerpt(self, result: HttpResult | str, limit: int = 200) -> str:
        """A short, single-line, escaped, secret-free piece of a response body."""
        text = result if isinstance(result, str) else result.text
        cut = not isinstance(result, str) and not result.complete
        flat = " ".join(text.split())
        return clean(flat, limit, self._secrets, cut=cut)

    def classify_registration(self, result: HttpResult) -> RegisterOutcome:
        """Map one registration exchange to a verdict."""
        if result.error is not None:
            fatal = isinstance(result.error, TlsError | http.client.InvalidURL)
            return RegisterOutcome(
                Verdict.FATAL if fatal else Verdict.RETRY,
                error=self.describe_error(result.error),
                refused=result.refused,
            )
        code = result.status_code
        assert code is not None
        if 200 <= code < 300:
            return RegisterOutcome(Verdict.ACCEPTED, status_code=code)
        label = f"{code} {_phrase(code)} from {self.endpoint}"
        body = self.excerpt(result)
        if code >= 500 or code in _RETRIED_4XX:
            retry_after = None
            if code in _RETRY_AFTER_CODES:
                retry_after = parse_retry_after(result.headers.get("Retry-After"), time.time())
            detail = f"{label}: {body}" if body else label
            return RegisterOutcome(
                Verdict.RETRY, status_code=code, error=detail, retry_after=retry_after
            )
        if code in (401, 403):
            hint = self.credentials_hint()
        elif 300 <= code < 400:
            # Not even a redacted Location: its path or query may carry a token of its own.
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


def validate_token(token: object, source: str = "token") -> str | None:
    """`token` (None or empty: no token), or `ConfigError` naming its source but never its
    value: it must be one line of visible ASCII, which every HTTP stack can send as a header
    (a newline would end the header; a character outside latin-1 cannot be encoded at all)."""
    if token is None or token == "":
        return None
    if not isinstance(token, str):
        raise ConfigError(f"{source} must be a string, got {type(token).__name__}")
    bad = next((i for i, c in enumerate(token) if not "!" <= c <= "~"), None)
    if bad is not None:
        raise ConfigError(
            f"{source} must be one line of visible ASCII characters (no spaces, no control or "
            f"non-ASCII characters); character {bad + 1} of {len(token)} is not"
        )
    return token


def _phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "Unknown Status"
