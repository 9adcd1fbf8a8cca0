"""A reference bootstrap server with SGLang's HTTP semantics and fault injection, for tests,
benchmarks and the demo (docs/sglang.md, "The reference bootstrap server")."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..core._diagnosis import hostport
from ..surfaces._httpserver import bind
from ._route_table import CRASH, LATEST_RELEASE, Reply, RouteTable, release_fields

_CLOSE = {"Connection": "close"}

__all__ = ["BootstrapServer", "Fault", "RequestRecord"]

logger = logging.getLogger(__name__)


class Listener(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    # SGLang's listen backlog (aiohttp's default), not socketserver's 5: a fleet that overflows
    # one overflows the other.
    request_queue_size = 128
    owner: BootstrapServer


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer leaves in one write: headers and body written apart, unbuffered, meet the
    # client's delayed ACK on a kept-alive connection (Nagle holds the body back ~40 ms).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    server: Listener
    server_version = "registrar-bootstrap"
    lifetime = 0  # the server lifetime that accepted this connection

    def setup(self) -> None:
        super().setup()
        self.lifetime = self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)

    def _dispatch(self) -> None:
        self.server.owner._handle(self)

    do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _dispatch

    def send(
        self, reply: Reply, body: bytes = b"", headers: Mapping[str, str] | None = None
    ) -> None:
        """Record the request (its `body`), then send `reply` whole (a client that has gone away
        is not an error); `Connection: close` closes the connection after it (`send_header`)."""
        status, text, content_type, port = reply
        self.server.owner._record(self, status, body, port)
        data = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", f"{content_type}; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True


@dataclass(frozen=True)
class RequestRecord:
    """One request the server received: `status` is the one answered (None when the connection
    was dropped or hung), `rank_port` a PUT's payload's (it tells which client sent it)."""

    at: float
    method: str
    path: str
    query: dict[str, str]
    status: int | None
    rank_port: int | None = None
    body: bytes = b""
    authorization: str | None = None


@dataclass
class Fault:
    """What to do to the next `count` matching requests (of `method`, None: any) instead of
    answering them normally.

    `kind` is "status" (answer `status` with `body` and optional `retry_after`; with `close`,
    say `Connection: close` and close), "drop" (send part of an answer, then close), "reset"
    (part of an answer, then a TCP reset), "delay" (answer normally after `seconds`), or "hang"
    (never answer until the server goes down).
    """

    kind: str
    count: int = 1
    status: int = 503
    body: str = ""
    content_type: str = "text/plain"
    retry_after: str | None = None
    seconds: float = 0.0
    method: str | None = None
    close: bool = False


class BootstrapServer:
    """An in-memory bootstrap server on `host:port` (0: an ephemeral port, kept across
    restarts), or on `sock`, bound and not listening until `start()`, copying SGLang `release`
    (docs/sglang.md). Use as a context manager, or `start()` and `close()`."""

    def __init__(  # noqa: PLR0913 (the reference server's documented keyword options)
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_body_bytes: int = 1024 * 1024,
        certfile: str | None = None,
        keyfile: str | None = None,
        sock: socket.socket | None = None,
        release: str = LATEST_RELEASE,
    ) -> None:
        self.host = host
        self._fields = release_fields(release)
        self._tls: ssl.SSLContext | None = None
        if certfile is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(certfile, keyfile)
        self._down = sock  # bound and not listening: holds the port while the server is down
        self.port: int = port if sock is None else sock.getsockname()[1]
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._table = RouteTable(fields=self._fields)
        self._faults: deque[Fault] = deque()
        self._connections: set[socket.socket] = set()
        self._records: deque[RequestRecord] = deque(maxlen=200_000)
        self._server: Listener | None = None
        self._thread: threading.Thread | None = None
        self._release = threading.Event()  # set: the requests a delay or hang holds must go
        self.restarts = 0
        self._lifetime = 0  # a connection of an earlier lifetime is a dead process's

    @property
    def url(self) -> str:
        return f"{'https' if self._tls is not None else 'http'}://{hostport(self.host, self.port)}"

    def start(self) -> BootstrapServer:
        """Listen (again); a no-op when already listening."""
        if self._server is not None:
            return self
        sock, self._down = self._down or bind(self.host, self.port, reuse_port=True), None
        # The listener takes `sock` over (and closes it in `server_close`).
        server = Listener(sock.getsockname()[:2], Handler, bind_and_activate=False)
        server.socket.close()
        server.socket, server.owner = sock, self
        server.server_activate()
        if self._tls is not None:
            server.socket = self._tls.wrap_socket(sock, server_side=True)
        self.port = server.server_address[1]
        self._release = threading.Event()
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"bootstrap-server-{self.port}",
            daemon=True,
        )
        self._thread.start()
        logger.info("bootstrap server listening on %s", self.url)
        return self

    def stop(self) -> None:
        """Stop listening and drop every connection: clients see refused connections, and the
        port stays held until `close()` (docs/sglang.md). The routes are kept."""
        self._stop(hold=True)

    def close(self) -> None:
        """Stop for good and let the port go."""
        self._stop(hold=False)
        down, self._down = self._down, None
        if down is not None:
            down.close()

    def _stop(self, hold: bool) -> None:
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = None
        self._release.set()
        server.shutdown()
        # The successor is bound while the listener still holds the port (SO_REUSEPORT).
        if hold:
            with contextlib.suppress(OSError):  # a socket handed in without SO_REUSEPORT
                self._down = bind(self.host, self.port, reuse_port=True)
        server.server_close()
        # Connections accepted from a socket without SO_REUSEADDR keep the port from a new
        # bind while they are open: they go first.
        self.drop_connections()
        if hold and self._down is None:
            self._down = bind(self.host, self.port, reuse_port=True)
        if thread is not None:
            thread.join(5)

    def forget(self) -> None:
        """Lose every route, as a new process would."""
        with self._lock:
            self._table = RouteTable(fields=self._fields)

    def restart(self, down_for: float = 0.0) -> None:
        """Restart with empty memory: drop every connection, forget, come back after
        `down_for` seconds (refusing connections meanwhile). `down_for=0` keeps the listening
        socket, a restart so fast that no client can see the server down. As with a new
        process, a request read before the restart is never answered nor applied after it."""
        with self._lock:
            self.restarts += 1
        if down_for <= 0 and self._server is not None:
            self._next_lifetime()
            self.drop_connections()
            return
        self.stop()
        self._next_lifetime()
        time.sleep(down_for)
        self.start()

    def _next_lifetime(self) -> None:
        with self._lock:
            self._table = RouteTable(fields=self._fields)
            self._lifetime += 1
            self._release.set()
            self._release = threading.Event()

    def __enter__(self) -> BootstrapServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def inject(self, fault: Fault) -> None:
        """Apply `fault` to the next matching requests (faults queue up in order)."""
        with self._lock:
            self._faults.append(fault)

    def fail_next(self, count: int, status: int, **options: Any) -> None:
        """Answer `status` to the next `count` requests; `options` are `Fault`'s (`retry_after`,
        `body`, `content_type`, `method`, `close`)."""
        self.inject(Fault("status", count, status=status, **options))

    @property
    def pending_faults(self) -> int:
        """Requests still to be met by an injected fault (a fault is taken as a request starts)."""
        with self._lock:
            return sum(fault.count for fault in self._faults)

    @property
    def registered_count(self) -> int:
        """Accepted PUTs since the last restart (a PUT for a present rank counts too)."""
        with self._lock:
            return self._table.count

    @property
    def ready(self) -> bool:
        with self._lock:
            try:
                return self._table.ready()
            except TypeError:  # a wrongly typed size: the real server answers 500 to everything
                return False

    @property
    def open_connections(self) -> int:
        """Connections a handler is serving now: at 0, every request received is recorded."""
        with self._lock:
            return len(self._connections)

    def routes(self) -> dict[tuple[int, int, int, int], dict[str, Any]]:
        """(dp, cp, tp, pp) -> {"rank_ip", "rank_port"}."""
        with self._lock:
            return {k: dict(v) for k, v in self._table.ranks.items()}

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    def drop_connections(self) -> None:
        """Close every open connection (keep-alive ones too) without forgetting anything."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    def _track(self, conn: socket.socket, add: bool) -> int:
        """Add or remove an open connection; the current lifetime."""
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
            return self._lifetime

    def _next_fault(self, method: str) -> tuple[Fault | None, threading.Event]:
        with self._lock:
            release = self._release
            for fault in self._faults:
                if fault.method is None or fault.method == method:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                    return fault, release
        return None, release

    def _record(
        self, h: Handler, status: int | None, body: bytes = b"", port: int | None = None
    ) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        auth = h.headers.get("Authorization")
        record = RequestRecord(time.time(), h.command, parts.path, query, status, port, body, auth)
        with self._lock:
            self._records.append(record)

    def _handle(self, h: Handler) -> None:
        fault, release = self._next_fault(h.command)
        kind = fault.kind if fault is not None else None
        body = self._read_body(h)
        if body is None:
            return
        if fault is not None and kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            if fault.close:
                headers.update(_CLOSE)
            h.send((fault.status, fault.body, fault.content_type, None), body, headers)
            return
        if fault is not None and kind in ("delay", "hang"):
            release.wait(fault.seconds if kind == "delay" else None)
        answer = None if kind in ("hang", "drop", "reset") else self._answer(h, body)
        if answer is None:
            # A fault, or a request read before a restart and acted on after it: a real
            # server's process would have died with it, unanswered, and never counted it in
            # the next one's memory.
            self._record(h, None, body)
            if kind in ("drop", "reset"):  # part of an answer, then a close or a TCP reset
                with contextlib.suppress(OSError):
                    h.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
                    h.wfile.flush()
                    if kind == "reset":
                        linger = struct.pack("ii", 1, 0)
                        h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
            h.close_connection = True
            return
        h.send(answer, body)

    def _read_body(self, h: Handler) -> bytes | None:
        length_text = h.headers.get("Content-Length")
        try:
            length = int(length_text) if length_text else 0
        except ValueError:
            length = -1
        if length < 0:
            h.send((400, "Bad Content-Length", "text/plain", None), headers=_CLOSE)
            return None
        if length > self.max_body_bytes:
            text = f"Request body over {self.max_body_bytes} bytes"
            h.send((413, text, "text/plain", None), headers=_CLOSE)
            return None
        return h.rfile.read(length) if length else b""

    def _answer(self, h: Handler, body: bytes) -> Reply | None:  # noqa: PLR0911 - in SGLang's order
        """The answer of SGLang's server, or None for a request of a lifetime that has ended."""
        path = urlsplit(h.path).path
        if path == "/health":
            if h.command != "GET":  # aiohttp's own answers for a route it does not serve
                return 405, "405: Method Not Allowed", "text/plain", None
            return 200, "OK", "text/plain", None
        if path != "/route":
            return 404, "404: Not Found", "text/plain", None
        if h.command not in ("GET", "PUT"):
            return 405, "Method not allowed", "application/json", None
        if (
            h.command == "PUT"
            and self.token is not None
            and h.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return 401, "Unauthorized", "text/plain", None
        # Under the lock, and for the current lifetime only: a restart cannot come between the
        # check and the use.
        with self._lock:
            if h.lifetime != self._lifetime:
                return None
            try:
                return self._table.get(h.path) if h.command == "GET" else self._table.put(body)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return 500, CRASH, "text/plain", None
