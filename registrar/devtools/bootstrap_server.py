"""A reference bootstrap server with SGLang's HTTP semantics and fault injection.

A development and test tool: it starts in-process on an ephemeral loopback port and lets a test
(or the demo) make it refuse connections, drop or reset a connection mid-answer, answer any
status for the next requests, answer slowly or never, and restart with empty memory the way a
restarted process does (every open connection dropped). The real server stays SGLang's; the
behaviour copied here is the table in docs/sglang.md.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["BootstrapServer", "Fault", "RequestRecord"]

logger = logging.getLogger(__name__)

_RANK_QUERY = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")
_REQUIRED = (
    "attn_tp_size",
    "attn_tp_rank",
    "attn_cp_size",
    "attn_cp_rank",
    "attn_dp_size",
    "attn_dp_rank",
    "pp_size",
    "pp_rank",
    "system_dp_size",
    "system_dp_rank",
    "rank_ip",
    "rank_port",
    "page_size",
    "kv_cache_dtype",
)


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


@dataclass
class _Table:
    """The server's memory: lost on every restart."""

    topology: dict[str, Any] | None = None
    ranks: dict[tuple[int, int, int, int], dict[str, Any]] = field(default_factory=dict)
    count: int = 0

    def required(self) -> int:
        if self.topology is None:
            return 1
        t = self.topology
        return int(t["dp_size"] * t["attn_cp_size"] * t["attn_tp_size"] * t["pp_size"])

    def ready(self) -> bool:
        return self.topology is not None and self.count >= self.required()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False

    def __init__(self, owner: BootstrapServer, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer
    server_version = "registrar-bootstrap"

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

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


class BootstrapServer:
    """An in-memory bootstrap server on `host:port` (0: an ephemeral port, kept across
    restarts). Use as a context manager, or `start()` and `close()`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_body_bytes: int = 1024 * 1024,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> None:
        self.host = host
        self._tls: ssl.SSLContext | None = None
        if certfile is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(certfile, keyfile)
        self.port = port
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._lock = threading.Lock()
        self._table = _Table()
        self._faults: deque[Fault] = deque()
        self._connections: set[socket.socket] = set()
        self._records: deque[RequestRecord] = deque(maxlen=200_000)
        self._server: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._release = threading.Event()
        self.restarts = 0

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
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        server = _HTTPServer(self, (self.host, self.port), family)
        if self._tls is not None:
            server.socket = self._tls.wrap_socket(server.socket, server_side=True)
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
        """Stop listening and drop every connection: clients see refused connections. The
        routes are kept (use `forget()` or `restart()` for an empty memory)."""
        server, thread = self._server, self._thread
        if server is None:
            return
        self._server = None
        self._release.set()
        server.shutdown()
        server.server_close()
        self.drop_connections()
        if thread is not None:
            thread.join(5)

    def close(self) -> None:
        """Stop for good."""
        self.stop()

    def forget(self) -> None:
        """Lose every route, as a new process would."""
        with self._lock:
            self._table = _Table()

    def restart(self, down_for: float = 0.0) -> None:
        """Restart with empty memory: drop every connection, forget, come back after
        `down_for` seconds (refusing connections meanwhile). `down_for=0` keeps the listening
        socket, a restart so fast that no client can see the server down."""
        with self._lock:
            self.restarts += 1
        if down_for <= 0 and self._server is not None:
            with self._lock:
                self._table = _Table()
                self._release.set()
                self._release = threading.Event()
            self.drop_connections()
            return
        self.stop()
        self.forget()
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

    def fail_next(
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
    def registered_count(self) -> int:
        """Accepted PUTs since the last restart (a PUT for a present rank counts too)."""
        with self._lock:
            return self._table.count

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._table.ready()

    def routes(self) -> dict[tuple[int, int, int, int], dict[str, Any]]:
        """(dp, cp, tp, pp) -> {"rank_ip", "rank_port"}."""
        with self._lock:
            return {k: dict(v) for k, v in self._table.ranks.items()}

    def records(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._records)

    # ----------------------------------------------------------------- internals

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

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
        h: _Handler,
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

    def _handle(self, h: _Handler, method: str) -> None:
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
                self._cut(h, reset=fault.kind == "reset")
                return
            elif fault.kind == "status":
                headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                self._record(h, method, fault.status, body)
                self._send(
                    h,
                    fault.status,
                    fault.body,
                    fault.content_type,
                    headers=headers,
                    close=fault.close,
                )
                return
        status, text, ctype, port = self._answer(h, method, body)
        self._record(h, method, status, body, port)
        self._send(h, status, text, ctype)

    def _read_body(self, h: _Handler, method: str) -> bytes | None:
        length_text = h.headers.get("Content-Length")
        try:
            length = int(length_text) if length_text else 0
        except ValueError:
            length = -1
        if length < 0:
            self._record(h, method, 400)
            self._send(h, 400, "Bad Content-Length", close=True)
            return None
        if length > self.max_body_bytes:
            self._record(h, method, 413)
            self._send(h, 413, f"Request body over {self.max_body_bytes} bytes", close=True)
            return None
        return h.rfile.read(length) if length else b""

    def _cut(self, h: _Handler, reset: bool) -> None:
        try:
            h.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
            h.wfile.flush()
            if reset:
                h.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
        except OSError:
            pass
        h.close_connection = True

    def _send(
        self,
        h: _Handler,
        status: int,
        text: str,
        content_type: str = "text/plain",
        *,
        headers: dict[str, str] | None = None,
        close: bool = False,
    ) -> None:
        data = text.encode()
        try:
            h.send_response(status)
            h.send_header("Content-Type", f"{content_type}; charset=utf-8")
            h.send_header("Content-Length", str(len(data)))
            for key, value in (headers or {}).items():
                h.send_header(key, value)
            if close:
                h.send_header("Connection", "close")
                h.close_connection = True
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            h.close_connection = True

    def _answer(self, h: _Handler, method: str, body: bytes) -> tuple[int, str, str, int | None]:
        path = urlsplit(h.path).path
        if path == "/health":
            if method != "GET":
                return 405, "Method Not Allowed", "text/plain", None
            return 200, "OK", "text/plain", None
        if path != "/route":
            return 404, "Not Found", "text/plain", None
        if method == "PUT":
            return self._put(h, body)
        if method == "GET":
            status, text, ctype = self._get(h)
            return status, text, ctype, None
        return 405, "Method Not Allowed", "text/plain", None

    def _put(self, h: _Handler, body: bytes) -> tuple[int, str, str, int | None]:
        if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
            return 401, "Unauthorized", "text/plain", None
        try:
            data = json.loads(body)
            fields = {name: data[name] for name in _REQUIRED}
            rank_port = int(fields["rank_port"])
            int(fields["page_size"])
        except (ValueError, TypeError, KeyError):
            # The real server lets these escape its handler: a bare 500.
            return (
                500,
                "500 Internal Server Error\n\nServer got itself in trouble",
                "text/plain",
                None,
            )
        dp_size = (
            fields["system_dp_size"] if fields["system_dp_size"] > 1 else fields["attn_dp_size"]
        )
        dp = fields["system_dp_rank"] if fields["system_dp_size"] > 1 else fields["attn_dp_rank"]
        key = (
            int(dp),
            int(fields["attn_cp_rank"]),
            int(fields["attn_tp_rank"]),
            int(fields["pp_rank"]),
        )
        policy = data.get("decode_allocation_policy")
        with self._lock:
            table = self._table
            if table.topology is None:
                table.topology = {
                    "attn_tp_size": fields["attn_tp_size"],
                    "attn_cp_size": fields["attn_cp_size"],
                    "dp_size": dp_size,
                    "pp_size": fields["pp_size"],
                    "page_size": int(fields["page_size"]),
                    "kv_cache_dtype": fields["kv_cache_dtype"],
                    "decode_allocation_policy": policy,
                }
            elif policy is not None and table.topology.get("decode_allocation_policy") not in (
                None,
                policy,
            ):
                return 400, "Inconsistent decode_allocation_policy", "text/plain", rank_port
            table.ranks[key] = {"rank_ip": fields["rank_ip"], "rank_port": rank_port}
            table.count += 1
        return 200, "OK", "text/plain", rank_port

    def _get(self, h: _Handler) -> tuple[int, str, str]:
        query = parse_qs(urlsplit(h.path).query)
        try:
            values = [int(query[name][-1]) for name in _RANK_QUERY]
        except (KeyError, ValueError):
            return 400, "Missing inputs for bootstrap server.", "text/plain"
        with self._lock:
            table = self._table
            not_ready = (
                f"Prefill server not fully registered yet ({table.count} workers registered)."
            )
            if not table.ready():
                return 503, not_ready, "text/plain"
            assert table.topology is not None
            if all(v == -1 for v in values):
                info = {k: v for k, v in table.topology.items() if v is not None}
                return 200, json.dumps(info), "application/json"
            dp, cp, tp, pp = values
            found = table.ranks.get((dp, cp, tp, pp))
        if found is None:
            return 404, "Bootstrap info not Found", "text/plain"
        return 200, json.dumps(found), "application/json"
