"""One connection on urllib3's classes, one exchange on it read up to a cap, errors named."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Callable, Mapping

import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import DecodeError, HTTPError, ReadTimeoutError
from urllib3.exceptions import SSLError as Urllib3SSLError
from urllib3.util.ssl_ import create_urllib3_context

from ..core._errors import describe_exception
from ..core._redact import clean
from ._deadline import Watchdog
from ._resolver import RESOLVER, Resolved, SocketOptions, connect

_CHUNK = 16 * 1024
_NODELAY = ((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),)
_RAW_SLACK = 4  # compressed bytes may exceed the cap this many times (empty gzip blocks)
# The encodings asked for (urllib3 passes an unknown one through undecoded): any other is an error.
_DECODED = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})


class ConnectTimeout(TimeoutError):
    """Connecting (TCP, then the TLS handshake) took longer than the connect timeout."""


class ReadTimeout(TimeoutError):
    """No byte of the answer within the read timeout."""


class TlsError(ConnectionError):
    """TLS refused the exchange (verification, handshake, an alert): retrying does not fix it."""


class LocalError(OSError):
    """A CA bundle or client certificate is unreadable: retried (it may be mid-rotation)."""


Request = tuple[str, str, bytes | None, Mapping[str, str]]  # method, target, body, headers
_HANDSHAKING = threading.local()  # the watch of the connection this thread is opening


class _WatchedSSLSocket(ssl.SSLSocket):
    """Our contexts' TLS socket, handed to the watchdog before its handshake (the wrap detaches
    the plain socket it held), so a deadline reaches a handshake too."""

    def do_handshake(self, block: bool = False) -> None:
        watch: Callable[[socket.socket], None] | None = getattr(_HANDSHAKING, "watch", None)
        if watch is not None:
            watch(self)
        super().do_handshake(block)


class TlsFiles:
    """The TLS context for `verify` and a client `cert` (certificate file, key file), kept while
    those files are unchanged: a rotated one is read again, a missing one fails that connection."""

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
            message = f"could not read the TLS {which} {exc.filename!s}: {exc.strerror}"
            raise LocalError(message) from None
        if self._built is not None and self._built[0] == stamp:
            return self._built[1]
        what = f"CA certificate bundle {self._verify}"
        try:
            context = create_urllib3_context(cert_reqs=None if self._verify else ssl.CERT_NONE)
            if isinstance(self._verify, str):
                where = "capath" if os.path.isdir(self._verify) else "cafile"
                context.load_verify_locations(**{where: self._verify})
            elif self._verify:
                context.load_default_certs()
            if self._cert is not None:
                what = f"client certificate {self._cert[0]}"
                context.load_cert_chain(*self._cert)
        except (OSError, ValueError) as exc:
            raise LocalError(f"could not load the TLS {what}: {describe_exception(exc)}") from None
        context.sslsocket_class = _WatchedSSLSocket
        self._built = (stamp, context)
        return context


class _Http(HTTPConnection):
    """urllib3's connection, on the socket its link opens."""

    link: Link

    def _new_conn(self) -> socket.socket:
        return self.link.opened(self.timeout, self.socket_options or ())


class _Https(HTTPSConnection, _Http):
    """The same over TLS (the certificate is checked against the host name, not the address)."""


class Link:
    """The transport's one connection, used by one thread at a time: opened on demand (on a
    probe's socket, if any), counted (re-opening a kept-alive one is evidence of a restart)."""

    def __init__(self, host: str, port: int, tls: TlsFiles | None, watchdog: Watchdog) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.watchdog = watchdog
        self.conn: HTTPConnection | None = None
        self.watched: socket.socket | None = None
        self.opened_count = 0
        self.probe: socket.socket | None = None
        self.address: str | None = None  # the last connection's, kept while the name has it
        self.moves = 0  # times the name lost that address: evidence of a replaced server
        self._resolved = Resolved(())

    @property
    def sock(self) -> socket.socket | None:
        sock = self.conn.sock if self.conn is not None else None
        return sock if isinstance(sock, socket.socket) and sock.fileno() >= 0 else None

    def ensure(self, connect_timeout: float) -> HTTPConnection:
        """The kept connection if usable (not closed, written on, or moved), else a new one."""
        # Resolved within the request's deadline; an answer without the address in use is a move.
        self._resolved = RESOLVER.resolve(self.host, self.port, connect_timeout, self.watchdog)
        if self.address is not None and self.address not in self._resolved.hosts:
            self.moves += 1
            self.address = None
            self.discard_probe()
            self.close()
        with contextlib.suppress(OSError, ValueError):
            if self.conn is not None and self.sock is not None and self.conn.is_connected:
                return self.conn
        self.close()
        self.opened_count += 1
        conn: _Http
        if self.tls is None:
            conn = _Http(self.host, self.port)
        else:
            conn = _Https(self.host, self.port, ssl_context=self.tls.context())
        conn.link = self
        conn.timeout = connect_timeout
        self.conn = conn
        _HANDSHAKING.watch = self.watch
        try:
            conn.connect()
        except ConnectTimeout:
            raise
        except TimeoutError as exc:
            raise ConnectTimeout(f"TLS handshake timed out after {connect_timeout:g} s") from exc
        except OSError as exc:
            raise _named(exc) from exc
        finally:
            _HANDSHAKING.watch = None
        if conn.sock is not None:
            self.watch(conn.sock)
        return conn

    def opened(self, timeout: float | None, options: SocketOptions) -> socket.socket:
        """The new connection's socket: the probe's, or one connected to the addresses `ensure()`
        found (urllib3 would call `getaddrinfo` outside the deadline)."""
        sock, self.probe = self.probe, None
        if sock is None:
            try:
                sock = connect(self._resolved, timeout, self.address, options)
            except TimeoutError as exc:
                raise ConnectTimeout(f"connect timed out after {timeout:g} s") from exc
        else:
            sock.settimeout(timeout)
        with contextlib.suppress(OSError):
            self.address = str(sock.getpeername()[0])
        self.watch(sock)
        return sock

    def watch(self, sock: socket.socket) -> None:
        """Hand the connection's own socket to the watchdog (no duplicate: one descriptor per
        connection keeps a fleet of registrars in one process within its limit)."""
        if self.watched is sock:
            return
        if self.watched is not None:
            self.watchdog.untrack(self.watched)
        self.watched = sock
        self.watchdog.track(sock)

    def probe_port(self, timeout: float) -> ConnectionRefusedError | None:
        """After a refusal, a bare connect first (another refusal costs tens of µs, not a whole
        request); a connected socket becomes the next connection's. The refusal, or None."""
        try:
            first = RESOLVER.resolve(self.host, self.port, timeout).addresses[0]
            sock = connect(Resolved((first,)), timeout, options=_NODELAY)
        except ConnectionRefusedError as exc:
            return exc
        except OSError:
            return None
        self.discard_probe()
        self.probe = sock
        return None

    def discard_probe(self) -> None:
        sock, self.probe = self.probe, None
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


def _named(exc: Exception) -> Exception:
    """Name a failure: the peer's close (no TLS verdict), TLS's verdict, or what urllib3 wrapped."""
    cause = exc.__cause__ if isinstance(exc, HTTPError) else exc
    if isinstance(cause, ssl.SSLEOFError | ssl.SSLZeroReturnError):
        return cause
    if isinstance(exc, ssl.SSLError | Urllib3SSLError):
        return TlsError(describe_exception(exc))
    return cause if isinstance(cause, Exception) else exc


def exchange(
    conn: HTTPConnection, request: Request, read_timeout: float, limit: Callable[[int], int]
) -> tuple[urllib3.BaseHTTPResponse, bytes, bool]:
    """One request on `conn`, the body up to `limit(status)` decoded bytes; errors named."""
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
    except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
        raise  # the server closed the connection
    except (HTTPError, ssl.SSLError) as exc:  # HTTPError: ProtocolError, SSLError, InvalidHeader
        raise _named(exc) from exc


def _read_capped(response: urllib3.BaseHTTPResponse, limit: int) -> tuple[bytes, bool]:
    """Up to `limit` decoded bytes of the body, and whether that was all: `read(amt)` inflates at
    most `amt` bytes, and compressed bytes inflating to nothing are bounded too."""
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
