"""A reference bootstrap server with SGLang's HTTP semantics and fault injection.

A development and test tool: it starts in-process on an ephemeral loopback port and lets a test
(or the demo) make it refuse connections, drop or reset a connection mid-answer, answer any
status for the next requests, answer slowly or never, and restart with empty memory the way a
restarted process does (every open connection dropped). The real server stays SGLang's; the
behaviour copied here is the table in docs/sglang.md.

This module holds the lifecycle, the faults and the records; what a PUT or GET does to the
table is `route_table`'s (SGLang's handlers, step for step), the sockets and raw writes are
`bootstrap_http`'s.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .bootstrap_http import Handler, Listener, bind, cut, send
from .route_table import CRASH, LATEST_RELEASE, RouteTable, parse_get, parse_put, release_fields

_CLOSE = {"Connection": "close"}
"""The header of an answer after which the server closes the connection."""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestRecord:
    """One request the server received."""

    at: float
    method: str
    path: str
    query: dict[str, str]
    status: int | None
    """The status answered, or None when the connection was dropped or hung."""
    rank_port: int | None = None
    """For a PUT, the payload's `rank_port` (it tells which client sent it)."""
    body: bytes = b""
    authorization: str | None = None
    """The Authorization header as received (tests check what a client sent)."""


@dataclass
class Fault:
    """What to do to the next `count` matching requests instead of answering them normally.

    `kind` is "status" (answer `status` with `body` and optional `retry_after`), "drop" (send
    part of an answer, then close), "reset" (part of an answer, then a TCP reset), "delay"
    (answer normally after `seconds`), or "hang" (never answer until the server goes down).
    """

    kind: str
    count: int = 1
    status: int = 503
    body: str = ""
    content_type: str = "text/plain"
    retry_after: str | None = None
    seconds: float = 0.0
    method: str | None = None
    """Only requests with this method match (None: any)."""
    close: bool = False
    """With "status": say `Connection: close` and close the connection after answering."""


class _Gone(Exception):
    """The request came on a connection of a server lifetime that has ended since."""


class BootstrapServer:
    """An in-memory bootstrap server on `host:port` (0: an ephemeral port, kept across
    restarts), or on `sock`, a bound socket that does not listen yet (it holds the port, and
    refuses connections, until `start()`). `release` is the SGLang release whose server it
    copies (its optional fields and checks: `route_table.FIELDS_SINCE`). Use as a context
    manager, or `start()` and `close()`."""

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
        self.release = release
        self._fields = release_fields(release)
        self._tls: ssl.SSLContext | None = None
        if certfile is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(certfile, keyfile)
        self._down = sock
        """The bound, non-listening socket that holds the port while the server is down."""
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
        self._release = threading.Event()
        self.restarts = 0
        self._lifetime = 0
        """Which process this is: a connection accepted in an earlier lifetime belongs to a
        process that is gone (see `Handler.lifetime`)."""

    # ----------------------------------------------------------------- lifecycle

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "https" if self._tls is not None else "http"
        return f"{scheme}://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> BootstrapServer:
        """Listen (again); a no-op when already listening."""
        if self._server is not None:
            return self
        sock, self._down = self._down or bind(self.host, self.port), None
        server = Listener(self, sock, self._tls)
        self.port = server.port
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
        """Stop listening and drop every connection: clients see refused connections. The
        port stays this server's, held by a bound socket that does not listen, until `close()`
        (another process cannot take it before `start()` listens again). The routes are kept
        (use `forget()` or `restart()` for an empty memory)."""
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
        if hold:  # the successor is bound while the listener still holds the port
            with contextlib.suppress(OSError):  # a socket handed in without SO_REUSEPORT
                self._down = bind(self.host, self.port)
        server.server_close()
        # Connections accepted from a socket without SO_REUSEADDR keep the port from a new
        # bind while they are open: they go first.
        self.drop_connections()
        if hold and self._down is None:
            self._down = bind(self.host, self.port)
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
            with self._lock:
                self._table = RouteTable(fields=self._fields)
                self._lifetime += 1
                self._release.set()
                self._release = threading.Event()
            self.drop_connections()
            return
        self.stop()
        with self._lock:
            self._table = RouteTable(fields=self._fields)
            self._lifetime += 1
        time.sleep(down_for)
        self.start()

    def __enter__(self) -> BootstrapServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # ----------------------------------------------------------------- faults and views

    def inject(self, fault: Fault) -> None:
        """Apply `fault` to the next matching requests (faults queue up in order)."""
        with self._lock:
            self._faults.append(fault)

    def fail_next(  # noqa: PLR0913 (a public helper's documented keyword options)
        self,
        count: int,
        status: int,
        *,
        retry_after: str | None = None,
        body: str = "",
        content_type: str = "text/plain",
        method: str | None = None,
    ) -> None:
        """Answer `status` to the next `count` requests."""
        self.inject(
            Fault(
                "status",
                count,
                status=status,
                body=body,
                content_type=content_type,
                retry_after=retry_after,
                method=method,
            )
        )

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()
            self._release.set()
            self._release = threading.Event()

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

    # ----------------------------------------------------------------- internals

    def _track(self, conn: socket.socket, add: bool) -> int:
        """Add or remove an open connection; the current lifetime."""
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)
            return self._lifetime

    def drop_connections(self) -> None:
        """Close every open connection (keep-alive ones too) without forgetting anything."""
        with self._lock:
            connections = list(self._connections)
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

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
        self,
        h: Handler,
        method: str,
        status: int | None,
        body: bytes = b"",
        port: int | None = None,
    ) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        auth = h.headers.get("Authorization")
        record = RequestRecord(time.time(), method, parts.path, query, status, port, body, auth)
        with self._lock:
            self._records.append(record)

    def _handle(self, h: Handler, method: str) -> None:
        fault, release = self._next_fault(method)
        body = self._read_body(h, method)
        if body is None:
            return
        if fault is not None:
            if fault.kind == "delay":
                release.wait(fault.seconds)
            elif fault.kind == "hang":
                release.wait()
                self._record(h, method, None, body)
                h.close_connection = True
                return
            elif fault.kind in ("drop", "reset"):
                self._record(h, method, None, body)
                cut(h, reset=fault.kind == "reset")
                return
            elif fault.kind == "status":
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                if fault.close:
                    headers["Connection"] = "close"
                self._record(h, method, fault.status, body)
                send(h, fault.status, fault.body, fault.content_type, headers)
                return
        try:
            status, text, ctype, port = self._answer(h, method, body)
        except _Gone:
            # Read before a restart and acted on after it: a real server's process would have
            # died with it, unanswered, and never counted it in the next one's memory.
            self._record(h, method, None, body)
            h.close_connection = True
            return
        self._record(h, method, status, body, port)
        send(h, status, text, ctype)

    def _read_body(self, h: Handler, method: str) -> bytes | None:
        length_text = h.headers.get("Content-Length")
        try:
            length = int(length_text) if length_text else 0
        except ValueError:
            length = -1
        if length < 0:
            self._record(h, method, 400)
            send(h, 400, "Bad Content-Length", headers=_CLOSE)
            return None
        if length > self.max_body_bytes:
            self._record(h, method, 413)
            send(h, 413, f"Request body over {self.max_body_bytes} bytes", headers=_CLOSE)
            return None
        return h.rfile.read(length) if length else b""

    def _answer(self, h: Handler, method: str, body: bytes) -> tuple[int, str, str, int | None]:
        path = urlsplit(h.path).path
        if path == "/health":
            if method != "GET":  # aiohttp's own answers for a route it does not serve
                return 405, "405: Method Not Allowed", "text/plain", None
            return 200, "OK", "text/plain", None
        if path != "/route":
            return 404, "404: Not Found", "text/plain", None
        return self._route(h, method, body)

    def _route(self, h: Handler, method: str, body: bytes) -> tuple[int, str, str, int | None]:
        if method == "PUT":
            if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
                return 401, "Unauthorized", "text/plain", None
            try:
                return self._put(h, body)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return 500, CRASH, "text/plain", None
        if method == "GET":
            try:
                status, text, ctype = self._get(h)
            except (ValueError, TypeError, KeyError, AttributeError):
                return 500, CRASH, "text/plain", None
            return status, text, ctype, None
        return 405, "Method not allowed", "application/json", None

    def _put(self, h: Handler, body: bytes) -> tuple[int, str, str, int | None]:
        request = parse_put(body)
        with self._lock:
            self._same_process(h)
            status, text = self._table.put(request)
        return status, text, "text/plain", request.rank_port

    def _same_process(self, h: Handler) -> None:
        """Called with the lock held, so that a restart cannot come between this and the use
        of the table."""
        if h.lifetime != self._lifetime:
            raise _Gone

    def _get(self, h: Handler) -> tuple[int, str, str]:
        ranks = parse_get(h.path)
        if ranks is None:
            return 400, "Missing inputs for bootstrap server.", "text/plain"
        with self._lock:
            self._same_process(h)
            return self._table.get(*ranks)
