"""A misbehaving HTTP server on 127.0.0.1, for what the reference server cannot show:
bytes trickled one at a time, endless bodies and `100 Continue`, compression bombs, huge pages,
hostile headers and JSON. Each request is answered by the next behaviour of a script (the last
one repeats); every thread and connection it opens is closed by `close()`."""

from __future__ import annotations

import contextlib
import functools
import gzip
import socket
import ssl
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = [
    "Behaviour",
    "Conn",
    "HostileServer",
    "Request",
    "answer",
    "big_page",
    "bomb",
    "endless_chunks",
    "endless_continue",
    "silence",
    "trickle_body",
    "trickle_headers",
]


@dataclass(frozen=True)
class Request:
    """One request the server read."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class Conn:
    """The connection a behaviour writes to, and the server's stop flag."""

    def __init__(self, sock: socket.socket, stopping: threading.Event) -> None:
        self.sock = sock
        self.stopping = stopping

    def send(self, data: bytes) -> bool:
        """False once the peer or the server has gone away."""
        try:
            self.sock.sendall(data)
        except OSError:
            return False
        return True

    def drip(self, data: Iterable[bytes], interval: float) -> None:
        """Send each piece `interval` seconds apart until the pieces, the peer or the server end."""
        for piece in data:
            if self.stopping.wait(interval) or not self.send(piece):
                return


Behaviour = Callable[[Conn, Request], bool]
"""Answers one request; True keeps the connection open for the next one."""


def _head(status: int, headers: Iterable[tuple[str, str]], reason: str = "X") -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def answer(
    status: int,
    body: bytes | str = b"",
    headers: Iterable[tuple[str, str]] = (),
    reason: str = "X",
) -> Behaviour:
    """A complete answer with a Content-Length; the connection stays open."""
    data = body.encode() if isinstance(body, str) else body
    extra = list(headers)

    def behave(conn: Conn, request: Request) -> bool:
        head = _head(status, [*extra, ("Content-Length", str(len(data)))], reason)
        return conn.send(head) and conn.send(data)  # no copy of a large body

    return behave


def silence() -> Behaviour:
    """Read the request and never answer, until the server closes."""

    def behave(conn: Conn, request: Request) -> bool:
        conn.stopping.wait()
        return False

    return behave


def trickle_headers(interval: float = 0.4) -> Behaviour:
    """A status line, then one header byte every `interval` seconds for ever: no socket read
    ever waits longer than `interval`."""

    def behave(conn: Conn, request: Request) -> bool:
        if conn.send(b"HTTP/1.1 200 OK\r\nX-Slow: "):
            conn.drip(iter(lambda: b"a", None), interval)
        return False

    return behave


def trickle_body(interval: float = 0.4, status: int = 200) -> Behaviour:
    """Headers promising a large body, then one body byte every `interval` seconds."""

    def behave(conn: Conn, request: Request) -> bool:
        if conn.send(_head(status, [("Content-Length", "1000000")])):
            conn.drip(iter(lambda: b"a", None), interval)
        return False

    return behave


def endless_chunks(interval: float = 0.01, size: int = 4096, status: int = 200) -> Behaviour:
    """A chunked body that never ends: a chunk of `size` bytes every `interval` seconds."""

    def behave(conn: Conn, request: Request) -> bool:
        chunk = f"{size:x}\r\n".encode() + b"x" * size + b"\r\n"
        if conn.send(_head(status, [("Transfer-Encoding", "chunked")])):
            conn.drip(iter(lambda: chunk, None), interval)
        return False

    return behave


def endless_continue(interval: float = 0.05) -> Behaviour:
    """`100 Continue` interim answers for ever (http.client skips each and waits again)."""

    def behave(conn: Conn, request: Request) -> bool:
        conn.drip(iter(lambda: b"HTTP/1.1 100 Continue\r\n\r\n", None), interval)
        return False

    return behave


@functools.cache
def _zeros(encoding: str, size: int) -> bytes:
    data = bytes(size)
    if encoding == "gzip":
        return gzip.compress(data, compresslevel=9)
    return zlib.compress(data, 9)


def bomb(status: int = 200, size: int = 100 * 1024 * 1024, encoding: str = "gzip") -> Behaviour:
    """A small `Content-Encoding: gzip` (or deflate) body inflating to `size` zero bytes."""
    body = _zeros(encoding, size)
    return answer(status, body, [("Content-Encoding", encoding)])


def big_page(status: int = 503, size: int = 8 * 1024 * 1024) -> Behaviour:
    """An HTML error page of `size` bytes, lines and all."""
    line = b"<p>Service Unavailable: the server is overloaded, please retry later.</p>\n"
    body = (line * (size // len(line) + 1))[:size]
    return answer(status, body, [("Content-Type", "text/html")])


class HostileServer:
    """Answers request n with behaviour n of the script (the last one repeats)."""

    def __init__(
        self,
        *script: Behaviour,
        tls: ssl.SSLContext | None = None,
        greet: Callable[[Conn], None] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        """`greet`, when given, is all a connection gets, before any request is read (e.g. a
        TLS handshake trickled byte by byte); `tls` wraps connections in TLS first."""
        if not script and greet is None:
            raise ValueError("a HostileServer needs at least one behaviour")
        self._script = list(script)
        self._greet = greet
        self._tls = tls
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._listener = socket.create_server((host, 0))
        self._listener.settimeout(0.2)
        self.port: int = self._listener.getsockname()[1]
        self.requests: list[Request] = []
        self.connections = 0
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._acceptor = threading.Thread(target=self._accept, name="hostile-accept", daemon=True)

    @property
    def url(self) -> str:
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def script(self, *script: Behaviour) -> None:
        """Answer the next requests with these behaviours instead."""
        with self._lock:
            self._script = list(script)

    def start(self) -> HostileServer:
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop every behaviour, close every connection, and join every thread."""
        self._stopping.set()
        self._acceptor.join(5)
        self._listener.close()
        with self._lock:
            conns = list(self._open)
        for sock in conns:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(5)
        assert not any(t.is_alive() for t in self._threads), "a hostile connection hung"

    def __enter__(self) -> HostileServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._open.add(sock)
            thread = threading.Thread(
                target=self._serve, args=(sock,), name="hostile-conn", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _serve(self, raw: socket.socket) -> None:
        sock = raw
        try:
            raw.settimeout(10)
            if self._greet is not None:
                self._greet(Conn(raw, self._stopping))
                return
            if self._tls is not None:
                sock = self._tls.wrap_socket(raw, server_side=True)
            reader = sock.makefile("rb")
            conn = Conn(sock, self._stopping)
            while not self._stopping.is_set():
                request = self._read(reader)
                if request is None:
                    return
                with self._lock:
                    self.requests.append(request)
                    behave = self._script.pop(0) if len(self._script) > 1 else self._script[0]
                if not behave(conn, request):
                    return
        except (OSError, ValueError):
            return
        finally:
            with self._lock:
                self._open.discard(raw)
            sock.close()

    @staticmethod
    def _read(reader: object) -> Request | None:
        readline = reader.readline  # type: ignore[attr-defined]
        line = readline(65537)
        if not line:
            return None
        method, path, _ = line.decode("latin-1").split(" ", 2)
        headers: dict[str, str] = {}
        while True:
            line = readline(65537)
            if line in (b"\r\n", b"\n", b""):
                break
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        body = reader.read(length) if length else b""  # type: ignore[attr-defined]
        return Request(method, path, headers, body)
