"""A reference bootstrap server with SGLang's HTTP semantics, for `registrar bootstrap` and the
demo (docs/sglang.md, "The reference bootstrap server"). The tests' lab (tests/bootstrap_lab.py)
subclasses it through `_handle`, `_reply`, `_new_table` and `_bind`."""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from ..core._diagnosis import hostport
from ..surfaces._httpserver import bind
from ._route_table import CRASH, Reply, RouteTable

_CLOSE = {"Connection": "close"}

__all__ = ["BootstrapServer"]

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


class BootstrapServer:
    """An in-memory bootstrap server on `host:port` (0: an ephemeral port, kept across restarts),
    or on `sock`, bound and not listening until `start()` (docs/sglang.md)."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_body_bytes: int = 1024 * 1024,
        sock: socket.socket | None = None,
    ) -> None:
        self.host = host
        self._down = sock  # bound and not listening: holds the port while the server is down
        self.port: int = port if sock is None else sock.getsockname()[1]
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._table = self._new_table()
        self._connections: set[socket.socket] = set()
        self._server: Listener | None = None
        self._thread: threading.Thread | None = None
        self._lifetime = 0  # a connection of an earlier lifetime is a dead process's

    @property
    def url(self) -> str:
        return f"http://{hostport(self.host, self.port)}"

    def start(self) -> BootstrapServer:
        """Listen (again); a no-op when already listening."""
        if self._server is not None:
            return self
        sock, self._down = self._down or self._bind(), None
        # The listener takes `sock` over (and closes it in `server_close`).
        server = Listener(sock.getsockname()[:2], Handler, bind_and_activate=False)
        server.socket.close()
        server.socket, server.owner = sock, self
        server.server_activate()
        self.port = server.server_address[1]
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
        server.shutdown()
        # The successor is bound while the listener still holds the port (SO_REUSEPORT).
        if hold:
            with contextlib.suppress(OSError):  # a socket handed in without SO_REUSEPORT
                self._down = self._bind()
        server.server_close()
        # Connections accepted from a socket without SO_REUSEADDR keep the port from a new
        # bind while they are open: they go first.
        self._drop_connections()
        if hold and self._down is None:
            self._down = self._bind()
        if thread is not None:
            thread.join(5)

    def _bind(self) -> socket.socket:
        return bind(self.host, self.port, reuse_port=True)

    def restart(self, down_for: float = 0.0) -> None:
        """Restart with empty memory and every connection dropped, refusing new ones for
        `down_for` seconds (0: the listening socket kept, too fast to be seen down). As with a
        new process, a request read before the restart is never answered nor applied after it."""
        if down_for <= 0 and self._server is not None:
            self._next_lifetime()
            self._drop_connections()
            return
        self.stop()
        self._next_lifetime()
        time.sleep(down_for)
        self.start()

    def _next_lifetime(self) -> None:
        with self._lock:
            self._table = self._new_table()
            self._lifetime += 1

    def _new_table(self) -> RouteTable:
        """The memory of a new process: SGLang's route table (the lab's copies older releases)."""
        return RouteTable()

    def __enter__(self) -> BootstrapServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def registered_count(self) -> int:
        """Accepted PUTs since the last restart (a PUT for a present rank counts too)."""
        with self._lock:
            return self._table.count

    def _drop_connections(self) -> None:
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

    def _handle(self, h: Handler) -> None:
        body = self._read_body(h)
        if body is not None:
            self._reply(h, self._answer(h, body), body)

    def _reply(
        self,
        h: Handler,
        reply: Reply | None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Every request ends here: `reply` is sent whole (a client gone is no error), or (None)
        the connection closes unanswered. `body` is the request's (the tests' lab records it);
        `Connection: close` in `headers` closes the connection after the answer."""
        if reply is None:
            # A request of an ended lifetime: a real server's process would have died with it.
            h.close_connection = True
            return
        status, text, content_type = reply
        data = text.encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", f"{content_type}; charset=utf-8")
            h.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                h.send_header(key, value)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            h.close_connection = True

    def _read_body(self, h: Handler) -> bytes | None:
        length_text = h.headers.get("Content-Length")
        try:
            length = int(length_text) if length_text else 0
        except ValueError:
            length = -1
        if length < 0:
            self._reply(h, (400, "Bad Content-Length", "text/plain"), headers=_CLOSE)
            return None
        if length > self.max_body_bytes:
            text = f"Request body over {self.max_body_bytes} bytes"
            self._reply(h, (413, text, "text/plain"), headers=_CLOSE)
            return None
        return h.rfile.read(length) if length else b""

    def _answer(self, h: Handler, body: bytes) -> Reply | None:  # noqa: PLR0911 - in SGLang's order
        """The answer of SGLang's server, or None for a request of a lifetime that has ended."""
        path = urlsplit(h.path).path
        if path == "/health":
            if h.command != "GET":  # aiohttp's own answers for a route it does not serve
                return 405, "405: Method Not Allowed", "text/plain"
            return 200, "OK", "text/plain"
        if path != "/route":
            return 404, "404: Not Found", "text/plain"
        if h.command not in ("GET", "PUT"):
            return 405, "Method not allowed", "application/json"
        if (
            h.command == "PUT"
            and self.token is not None
            and h.headers.get("Authorization") != f"Bearer {self.token}"
        ):
            return 401, "Unauthorized", "text/plain"
        # Under the lock, for the current lifetime only: no restart between the check and the use.
        with self._lock:
            if h.lifetime != self._lifetime:
                return None
            try:
                return self._table.get(h.path) if h.command == "GET" else self._table.put(body)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return 500, CRASH, "text/plain"
