"""A small HTTP server for probes that a flood of connections cannot stall: one reader thread
reads request heads without blocking, with a deadline per connection; only complete requests
reach a fixed pool of workers (wsgiref's handler). Each bound and why: docs/reliability.md,
"The health server under probes". `bind` serves the reference bootstrap server too."""

from __future__ import annotations

import contextlib
import io
import logging
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from ..core._diagnosis import hostport

logger = logging.getLogger("registrar.surfaces.httpserver")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

LISTEN_BACKLOG = 1024
HEAD_TIMEOUT = 2.0  # seconds from the accept to the end of the request head
SEND_TIMEOUT = 2.0
MAX_PENDING = 512  # connections still sending their head; past it the oldest is closed
WORKERS = 4
MAX_HEAD_BYTES = 16 * 1024
_TOO_LARGE = b"HTTP/1.0 431 Request Header Fields Too Large\r\nContent-Length: 0\r\n\r\n"


def bind(
    host: str, port: int, *, backlog: int | None = None, reuse_port: bool = False
) -> socket.socket:
    """A socket bound to `host:port`, listening when given a `backlog` (closed if either fails)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if backlog is not None:
            sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


class _Handler(WSGIRequestHandler):
    """wsgiref's handler, fed the head the reader holds: no client can pin it by sending slowly."""

    def setup(self) -> None:
        self.connection, head = self.request
        self.connection.settimeout(SEND_TIMEOUT)
        self.rfile = io.BytesIO(head)
        self.wfile = self.connection.makefile("wb", buffering=0)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class HealthServer(contextlib.AbstractContextManager["HealthServer"]):
    """Serves a WSGI app on `host:port` (0: an ephemeral one; `port`, `url` say which) until
    `stop()`. One request per connection (the answer says HTTP/1.0 and closes), as probes do."""

    def __init__(self, app: WSGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        self._listener = bind(host, port, backlog=LISTEN_BACKLOG)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://{hostport(host, self.port)}"
        self._app = app
        # What wsgiref's handler reads of a server: `base_environ` (wsgiref's own) and `get_app`.
        self.server_name, self.server_port = host, self.port
        WSGIServer.setup_environ(self)  # type: ignore[arg-type]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}
        self._work: queue.SimpleQueue[tuple[socket.socket, bytes] | None] = queue.SimpleQueue()
        self._closing = False
        name = f"registrar-health-{self.port}"
        loops = {name: self._read_loop} | {f"{name}-{n}": self._work_loop for n in range(WORKERS)}
        self._threads = [threading.Thread(target=t, name=n, daemon=True) for n, t in loops.items()]
        for thread in self._threads:
            thread.start()

    def get_app(self) -> WSGIApp:
        return self._app

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop accepting, close every open connection, and end the threads."""
        if self._closing:
            return
        self._closing = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        for _ in range(WORKERS):
            self._work.put(None)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))

    def _read_loop(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closing:
                now = time.monotonic()
                for sock in [s for s, (deadline, _) in self._pending.items() if deadline <= now]:
                    self._drop(sock)
                soonest = min((d for d, _ in self._pending.values()), default=now + 1.0)
                for key, _ in self._selector.select(max(0.0, soonest - now)):
                    if key.fileobj is self._listener:
                        self._accept()
                    elif key.fileobj is not self._wake_r:
                        self._read(key.fileobj)  # type: ignore[arg-type]
        except Exception:
            logger.exception("the health server's reader failed; health endpoints are down")
        finally:
            for sock in list(self._pending):
                self._drop(sock)
            self._selector.close()
            self._listener.close()
            self._wake_r.close()
            self._wake_w.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: again at the next event
                logger.warning("health server cannot accept a connection: %s", exc)
                return
            if len(self._pending) >= MAX_PENDING:
                # The oldest has had the longest to send its request: a fresh probe wins.
                self._drop(min(self._pending, key=lambda s: self._pending[s][0]))
            sock.setblocking(False)
            self._pending[sock] = (time.monotonic() + HEAD_TIMEOUT, bytearray())
            self._selector.register(sock, selectors.EVENT_READ)

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            return
        buffer = self._pending[sock][1]
        buffer += data
        if b"\r\n\r\n" not in buffer and b"\n\n" not in buffer:
            if len(buffer) > MAX_HEAD_BYTES:
                with contextlib.suppress(OSError):
                    sock.send(_TOO_LARGE)
                self._drop(sock)
            return
        self._selector.unregister(sock)
        del self._pending[sock]
        self._work.put((sock, bytes(buffer)))

    def _drop(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()

    def _work_loop(self) -> None:
        while (item := self._work.get()) is not None:
            sock, head = item
            try:
                _Handler((sock, head), sock.getpeername(), self)  # type: ignore[arg-type]
            except Exception as exc:  # a client that went away: nothing to answer
                logger.debug("health request failed: %r", exc)
            finally:
                with contextlib.suppress(OSError):
                    sock.close()
