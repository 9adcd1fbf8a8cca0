"""One kept-alive HTTP/1.1 connection on urllib3, and one exchange on it read up to a cap.

urllib3 does the HTTP: its connection classes (`urllib3.connection.HTTPConnection` and
`HTTPSConnection`, without a pool: the transport keeps one connection, used by one thread, and
must see every time it is opened again), its TLS context (`create_urllib3_context`), its
Content-Length enforcement and its decoding, bounded as it inflates
(`HTTPResponse.read(amt, decode_content=True)`). Its exceptions are mapped here to the ones
the transport classifies. What no library offers is kept: the connection's socket goes to the
transport's `Watchdog` before anything is sent or shaken on it, a socket a bare connect
probe already opened becomes the next connection's, and the host name is resolved inside the
request's deadline (`registrar.protocols.resolver`, in place of the `getaddrinfo` that urllib3's
`create_connection` makes outside it), looked up again before each request: an address that
moved closes the kept connection, as a restarted server would.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Callable, Mapping

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    DecodeError,
    HTTPError,
    NewConnectionError,
    ReadTimeoutError,
)
from urllib3.exceptions import SSLError as Urllib3SSLError
from urllib3.util.ssl_ import create_urllib3_context

from ..core.errors import describe_exception
from ..core.redact import clean
from .deadline import Watchdog
from .resolver import RESOLVER, Resolved, Resolver, connect

__all__ = [
    "ConnectTimeout",
    "Link",
    "LocalError",
    "ReadTimeout",
    "TlsError",
    "TlsFiles",
    "exchange",
    "reusable",
]

_CHUNK = 16 * 1024
_RAW_SLACK = 4
"""Compressed bytes read may exceed the decoded cap this many times over (a gzip stream of
empty blocks inflates to nothing), plus one chunk."""
_DECODED = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})
"""The Content-Encodings asked for (`Accept-Encoding: gzip, deflate`): urllib3 would pass an
unknown one through undecoded, and decodes brotli or zstd when their packages happen to be
installed; an answer in any other is an error, not garbage."""


class ConnectTimeout(TimeoutError):
    """Connecting (TCP, then the TLS handshake) took longer than the connect timeout."""


class ReadTimeout(TimeoutError):
    """No byte of the answer within the read timeout."""


class TlsError(ConnectionError):
    """TLS refused the exchange: the server's certificate failed verification, the handshake
    failed, or the server's TLS layer answered with an alert (say, about our certificate).
    Retrying does not fix it: the registration fails with what to change."""


class LocalError(OSError):
    """A file this side needs (CA bundle, client certificate) could not be read: the attempt
    fails and is retried (it may be mid-rotation); it says nothing of the server."""


_HANDSHAKING = threading.local()
"""The watchdog of the connection this thread is opening, if any."""


class _WatchedSSLSocket(ssl.SSLSocket):
    """The TLS socket `SSLContext.wrap_socket` makes for our contexts (`sslsocket_class`):
    handed to the opening connection's watchdog before its handshake, since the plain socket
    the watchdog held is detached by the wrap, so a deadline reaches a handshake too."""

    def do_handshake(self, block: bool = False) -> None:
        watch: Callable[[socket.socket], None] | None = getattr(_HANDSHAKING, "watch", None)
        if watch is not None:
            watch(self)
        super().do_handshake(block)


class TlsFiles:
    """The TLS context for `verify` (True: the system's CAs; False: no verification; a path:
    that CA bundle or folder) and an optional client certificate (`cert`: certificate file,
    key file), built by urllib3 (`create_urllib3_context`: TLS 1.2 at least, its ciphers).
    `context()` builds it when a connection opens and keeps it while those files are
    unchanged: a rotated CA bundle or certificate is read again, and one missing for now fails
    that connection (`OSError`, retried) instead of the registrar."""

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
            raise LocalError(
                f"could not read the TLS {which} {exc.filename!s}: {exc.strerror}"
            ) from None
        if self._built is not None and self._built[0] == stamp:
            return self._built[1]
        context = self._verifying()
        if self._cert is not None:
            try:
                context.load_cert_chain(*self._cert)
            except (OSError, ValueError) as exc:
                raise LocalError(
                    f"could not load the TLS client certificate {self._cert[0]}: "
                    f"{describe_exception(exc)}"
                ) from None
        context.sslsocket_class = _WatchedSSLSocket
        self._built = (stamp, context)
        return context

    def _verifying(self) -> ssl.SSLContext:
        try:
            if self._verify is False:
                return create_urllib3_context(cert_reqs=ssl.CERT_NONE)
            context = create_urllib3_context()
            if isinstance(self._verify, str):
                if os.path.isdir(self._verify):
                    context.load_verify_locations(capath=self._verify)
                else:
                    context.load_verify_locations(cafile=self._verify)
            else:
                context.load_default_certs()
        except (OSError, ValueError) as exc:
            raise LocalError(
                f"could not load the TLS CA certificate bundle {self._verify}: "
                f"{describe_exception(exc)}"
            ) from None
        return context


class _Http(HTTPConnection):
    """urllib3's connection, on the socket the link gives it."""

    def __init__(self, link: Link) -> None:
        super().__init__(link.host, link.port)
        self._link = link

    def _new_conn(self) -> socket.socket:
        return self._link.opened(lambda: _dial(self, self._link), self.timeout)


class _Https(HTTPSConnection):
    """urllib3's TLS connection, on the socket the link gives it (the certificate is checked
    against the host name, whatever address it resolved to)."""

    def __init__(self, link: Link, context: ssl.SSLContext) -> None:
        super().__init__(link.host, link.port, ssl_context=context)
        self._link = link

    def _new_conn(self) -> socket.socket:
        return self._link.opened(lambda: _dial(self, self._link), self.timeout)


def _dial(conn: HTTPConnection, link: Link) -> socket.socket:
    """What urllib3's `_new_conn` does, on the addresses the link resolved within the deadline
    (urllib3's own `create_connection` would call `getaddrinfo` outside it)."""
    timeout = conn.timeout if isinstance(conn.timeout, int | float) else None
    try:
        return connect(link.answer(timeout), timeout, link.address, conn.socket_options or ())
    except TimeoutError as exc:
        raise ConnectTimeoutError(
            conn, f"Connection to {conn.host} timed out. (connect timeout={timeout})"
        ) from exc


class Link:
    """The transport's one connection to the server, used by one thread at a time.

    Opened on demand (on the socket a probe already connected, when there is one), counted
    (a kept-alive connection that had to be opened again is evidence that the server
    restarted), and watched: its socket goes to the watchdog, whose shutdown then reaches it
    even inside a TLS handshake."""

    def __init__(
        self,
        host: str,
        port: int,
        tls: TlsFiles | None,
        watchdog: Watchdog,
        resolver: Resolver = RESOLVER,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.watchdog = watchdog
        self.resolver = resolver
        self.conn: HTTPConnection | None = None
        self.watched: socket.socket | None = None
        self.opened_count = 0
        self.probe: socket.socket | None = None
        self.address: str | None = None
        """The address the last connection went to (kept while the name still has it)."""
        self.moves = 0
        """Times the name's answer no longer had that address: evidence, as a re-opened
        connection is, that the server process was replaced."""
        self._resolved: Resolved | None = None

    @property
    def sock(self) -> socket.socket | None:
        sock = self.conn.sock if self.conn is not None else None
        return sock if isinstance(sock, socket.socket) and sock.fileno() >= 0 else None

    def ensure(self, connect_timeout: float) -> HTTPConnection:
        """A usable connection: the kept one, unless the server closed it meanwhile (or wrote
        on it unasked: it cannot be reused either way) or its name moved, else a new one."""
        self.look(connect_timeout)
        if self.conn is not None and self.sock is not None:
            try:
                if self.conn.is_connected:
                    return self.conn
            except (OSError, ValueError):
                pass
        self.close()
        self.opened_count += 1
        conn = _Http(self) if self.tls is None else _Https(self, self.tls.context())
        conn.timeout = connect_timeout
        self.conn = conn
        _HANDSHAKING.watch = self.watch
        try:
            conn.connect()
        except ConnectTimeoutError as exc:
            if isinstance(exc, NewConnectionError) and isinstance(exc.__cause__, OSError):
                raise exc.__cause__ from None  # refused, unreachable: the OS's own words
            raise ConnectTimeout(f"connect timed out after {connect_timeout:g} s") from exc
        except OSError as exc:
            raise _connect_error(exc, connect_timeout) from exc
        finally:
            _HANDSHAKING.watch = None
        if conn.sock is not None:
            self.watch(conn.sock)
        return conn

    def look(self, timeout: float) -> None:
        """Resolve the host within the request's deadline (`Unresolved` when it has no address):
        an answer without the address in use closes the kept connection (and a probe's) and
        counts a move."""
        resolved = self.resolver.resolve(self.host, self.port, timeout, self.watchdog)
        if self.address is not None and self.address not in resolved.hosts:
            self.moves += 1
            self.address = None
            self.discard_probe()
            self.close()
        self._resolved = resolved

    def answer(self, timeout: float | None) -> Resolved:
        """The addresses `look()` found for this request (resolved now without one)."""
        if self._resolved is None:
            self.look(timeout if timeout is not None else 5.0)
        assert self._resolved is not None
        return self._resolved

    def opened(self, connect: Callable[[], socket.socket], timeout: float | None) -> socket.socket:
        """The new connection's socket (the probe's, or `connect()`'s), watched from now on."""
        sock = self.take_probe()
        if sock is None:
            sock = connect()
        else:
            sock.settimeout(timeout)
        with contextlib.suppress(OSError):
            self.address = str(sock.getpeername()[0])
        self.watch(sock)
        return sock

    def resolution(self) -> str | None:
        """What the resolver does to this host, when it matters (for the status)."""
        return self.resolver.describe(self.host)

    def watch(self, sock: socket.socket) -> None:
        """Hand the connection's own socket to the watchdog (no duplicate: one descriptor
        per connection, so a fleet of registrars in one process stays within its limit)."""
        if self.watched is sock:
            return
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


def _connect_error(exc: OSError, connect_timeout: float) -> OSError:
    """What a failed TLS handshake was: too slow, a closed connection, or a TLS verdict."""
    if isinstance(exc, TimeoutError):
        return ConnectTimeout(f"TLS handshake timed out after {connect_timeout:g} s")
    if isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return exc  # the server closed the connection: broken, not a TLS verdict
    if isinstance(exc, ssl.SSLError | ssl.CertificateError | Urllib3SSLError):
        return TlsError(describe_exception(exc))
    return exc


def exchange(
    conn: HTTPConnection,
    request: tuple[str, str, bytes | None, Mapping[str, str]],
    read_timeout: float,
    limit: Callable[[int], int],
) -> tuple[urllib3.BaseHTTPResponse, bytes, bool]:
    """Send one request on `conn` and read the answer, its body up to `limit(status)` decoded
    bytes; a timeout, a TLS alert or a broken connection is named for what it is."""
    method, target, data, headers = request
    conn.timeout = read_timeout
    try:
        conn.request(method, target, body=data, headers=headers, preload_content=False)
        response = conn.getresponse()
        try:
            body, complete = _read_capped(response, limit(response.status))
        finally:
            response.close()
        return response, body, complete
    except (TimeoutError, ReadTimeoutError) as exc:
        raise ReadTimeout(f"no answer within the read timeout of {read_timeout:g} s") from exc
    except HTTPError as exc:  # ProtocolError, SSLError, InvalidHeader: what it wrapped
        raise _cause(exc) from exc
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        raise  # the server closed the connection
    except ssl.SSLError as exc:
        raise TlsError(describe_exception(exc)) from exc


def _cause(exc: HTTPError) -> Exception:
    """The error urllib3 wrapped while reading: the connection's own (reset, a short body
    against its Content-Length) or the TLS layer's verdict."""
    cause = exc.__cause__
    if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return cause
    if isinstance(exc, Urllib3SSLError):
        return TlsError(describe_exception(cause if cause is not None else exc))
    return cause if isinstance(cause, Exception) else exc


def _read_capped(response: urllib3.BaseHTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` decoded bytes of the body, and whether that was all of it. urllib3 bounds
    inflation as it happens (`read(amt)` decodes at most `amt` bytes), so a small bomb costs
    no more than `limit`; compressed bytes that inflate to nothing are bounded too."""
    encoding = response.headers.get("Content-Encoding", "")
    name = encoding.strip().lower()
    if name not in _DECODED:
        raise ValueError(f"answer in an unsupported Content-Encoding {clean(encoding, 40)!r}")
    body = bytearray()
    while True:
        try:
            chunk = response.read(_CHUNK, decode_content=True)
        except DecodeError as exc:
            raise ValueError(f"undecodable {name} answer: {exc.__cause__ or exc}") from None
        if not chunk:
            return bytes(body), True
        body += chunk
        if len(body) > limit or response.tell() > _RAW_SLACK * limit + _CHUNK:
            return bytes(body[:limit]), False
        if name in ("", "identity") and response.length_remaining == 0:
            return bytes(body), True  # all its Content-Length: no read to find the end


def reusable(conn: HTTPConnection, response: urllib3.BaseHTTPResponse) -> bool:
    """Whether the connection may carry another request after this answer, read whole: an
    HTTP/1.1 answer that did not close it (`http.client`, under urllib3, closes the connection
    of an answer that ends it, `Connection: close` or HTTP/1.0)."""
    return response.version == 11 and conn.sock is not None
