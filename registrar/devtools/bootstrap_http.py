"""The reference bootstrap server's HTTP plumbing: a threading HTTP server that listens on a
socket bound beforehand (so a port can be held, refusing connections, while the server is down),
a handler that hands every request to its owner, and the raw writes an answer or a fault needs.
What is answered is `bootstrap_server`'s and `route_table`'s.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

logger = logging.getLogger(__name__)


class Owner(Protocol):
    """What a handler calls on the server it belongs to."""

    def _track(self, conn: socket.socket, add: bool) -> int: ...

    def _handle(self, h: Handler, method: str) -> None: ...


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to `host:port` (0: an ephemeral port) and not listening: a connect to it
    is refused, as to a server that is down, and no other socket can take the port. With
    SO_REUSEPORT, so that a successor can be bound while it listens (see
    `BootstrapServer.stop`)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


class Listener(ThreadingHTTPServer):
    """Listens on `sock`, a bound socket it takes over (and closes in `server_close`)."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 128
    """The listen backlog of SGLang's server (aiohttp's default), not socketserver's 5: a fleet
    that overflows one overflows the other."""

    def __init__(self, owner: Owner, sock: socket.socket, tls: ssl.SSLContext | None) -> None:
        self.address_family = sock.family
        self.owner = owner
        super().__init__(sock.getsockname()[:2], Handler, bind_and_activate=False)
        self.socket.close()
        self.socket = sock
        self.server_address = sock.getsockname()[:2]
        self.server_activate()
        if tls is not None:
            self.socket = tls.wrap_socket(sock, server_side=True)

    @property
    def port(self) -> int:
        port: int = self.server_address[1]
        return port


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer leaves in one write: headers and body written apart, unbuffered, meet the
    # client's delayed ACK on a kept-alive connection (Nagle holds the body back ~40 ms).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    server: Listener
    server_version = "registrar-bootstrap"

    lifetime = 0
    """The server lifetime that accepted this connection."""

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

    def do_GET(self) -> None:
        self.server.owner._handle(self, "GET")

    def do_PUT(self) -> None:
        self.server.owner._handle(self, "PUT")

    def do_POST(self) -> None:
        self.server.owner._handle(self, "POST")

    def do_DELETE(self) -> None:
        self.server.owner._handle(self, "DELETE")

    def do_PATCH(self) -> None:
        self.server.owner._handle(self, "PATCH")


def cut(h: Handler, reset: bool) -> None:
    """Send part of an answer, then close (with `reset`: a TCP reset)."""
    try:
        h.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
        h.wfile.flush()
        if reset:
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    h.close_connection = True


def send(
    h: Handler,
    status: int,
    text: str,
    content_type: str = "text/plain",
    headers: Mapping[str, str] | None = None,
) -> None:
    """One whole answer (a client that has gone away is not an error); a `Connection: close`
    header closes the connection after it."""
    data = text.encode()
    try:
        h.send_response(status)
        h.send_header("Content-Type", f"{content_type}; charset=utf-8")
        h.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            h.send_header(key, value)
        if (headers or {}).get("Connection") == "close":
            h.close_connection = True
        h.end_headers()
        h.wfile.write(data)
        h.wfile.flush()
    except OSError:
        h.close_connection = True
