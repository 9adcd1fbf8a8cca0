"""A small HTTP server for probes that a flood of connections cannot stall: one reader thread
reads request heads without blocking, with a deadline per connection; only complete requests
reach a fixed pool of workers (wsgiref's handler). Each bound and why: docs/reliability.md,
"The health server under probes"."""

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
from wsgiref.simple_server import WSGIRequestHandler

logger = logging.getLogger("registrar.surfaces.httpserver")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

LISTEN_BACKLOG = 1024
HEAD_TIMEOUT = 2.0
"""Seconds a connection has, from its accept, to send its whole request head."""
SEND_TIMEOUT = 2.0
MAX_PENDING = 512
"""Connections still sending their request head; past it the oldest one is closed."""
WORKERS = 4
MAX_HEAD_BYTES = 16 * 1024


class _Handler(WSGIRequestHandler):
    """wsgiref's handler, fed the request head the reader already holds: it never waits on
    the client for input, so a client cannot pin it."""

    server: ProbeServer  # type: ignore[assignment]

    def setup(self) -> None:
        self.connection, head = self.request
        self.connection.settimeout(SEND_TIMEOUT)
        self.rfile = io.BytesIO(head)
        self.wfile = self.connection.makefile("wb", buffering=0)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            self.wfile.close()

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("%s %s", self.address_string(), format % args)


class ProbeServer:
    """Serve a WSGI app on `host:port` (0: an ephemeral port) until `stop()`. Each connection
    carries one request (the answer says HTTP/1.0 and closes), as probes use it."""

    def __init__(self, app: WSGIApp, host: str = "127.0.0.1", port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(LISTEN_BACKLOG)
            self._listener.setblocking(False)
        except OSError:
            self._listener.close()
            raise
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._app = app
        self.base_environ = {  # what wsgiref's handler reads of a server, with `get_app`
            "SERVER_NAME": host,
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(self.port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pending: dict[socket.socket, tuple[float, bytearray]] = {}
        self._work: queue.SimpleQueue[tuple[socket.socket, bytes] | None] = queue.SimpleQueue()
        self._closing = False
        name = f"registrar-health-{self.port}"
        self._threads = [threading.Thread(target=self._read_loop, name=name)]
        self._threads += [
            threading.Thread(target=self._work_loop, name=f"{name}-{n}") for n in range(WORKERS)
        ]
        for thread in self._threads:
            thread.daemon = True
            thread.start()

    def get_app(self) -> WSGIApp:
        return self._app

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def __enter__(self) -> ProbeServer:
        return self

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

    # ----------------------------------------------------------------- the reader

    def _read_loop(self) -> None:
        self._selector.register(self._listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        try:
            while not self._closing:
                now = time.monotonic()
                self._expire(now)
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
                self._refuse(sock, b"431 Request Header Fields Too Large")
            return
        self._selector.unregister(sock)
        del self._pending[sock]
        self._work.put((sock, bytes(buffer)))

    def _refuse(self, sock: socket.socket, reason: bytes) -> None:
        with contextlib.suppress(OSError):
            sock.send(b"HTTP/1.0 " + reason + b"\r\nContent-Length: 0\r\n\r\n")
        self._drop(sock)

    def _expire(self, now: float) -> None:
        for sock in [s for s, (deadline, _) in self._pending.items() if deadline <= now]:
            self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        self._pending.pop(sock, None)
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(sock)
        sock.close()

    # ----------------------------------------------------------------- the workers

    def _work_loop(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            sock, head = item
            try:
                sock.setblocking(True)
                _Handler((sock, head), sock.getpeername(), self)  # type: ignore[arg-type]
            except Exception as exc:  # a client that went away: nothing to answer
                logger.debug("health request failed: %r", exc)
            finally:
                with contextlib.suppress(OSError):
                    sock.close()
