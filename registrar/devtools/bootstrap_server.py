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
from collections.abc import Callable
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


class _Gone(Exception):
    """The request came on a connection of a server lifetime that has ended since."""


@dataclass
class _Table:
    """The server's memory, kept field for field as SGLang's `CommonKVBootstrapServer` keeps it
    (first writer wins for the topology, last writer for a rank), lost on every restart.
    Values are stored as the payload gave them, so a wrongly typed one fails later exactly where
    it fails on the real server."""

    attn_tp_size: Any = None
    attn_cp_size: Any = None
    dp_size: Any = None
    pp_size: Any = None
    page_size: Any = None
    kv_cache_dtype: Any = None
    kv_layout: Any = None
    dsv41_spec_layout: Any = None
    follow_bootstrap_room: bool | None = None
    enable_dsa_cache_layer_split: bool | None = None
    enable_kv_cache_sharding: bool | None = None
    prefill_http_port: int | None = None
    decode_allocation_policy: Any = "early"
    ranks: dict[tuple[Any, Any, Any, Any], dict[str, Any]] = field(default_factory=dict)
    count: int = 0

    def ready(self) -> bool:
        """The real `_is_ready`: raises TypeError, as it does, on wrongly typed sizes."""
        sizes = (self.attn_tp_size, self.attn_cp_size, self.pp_size, self.dp_size)
        if any(size is None for size in sizes):
            return False
        return bool(self.count >= self.expected())

    def expected(self) -> Any:
        return self.dp_size * self.attn_cp_size * self.attn_tp_size * self.pp_size

    def info(self) -> dict[str, Any]:
        """The answer to the all-`-1` query: `PrefillServerInfo` as the real server sends it."""
        info: dict[str, Any] = {
            "attn_tp_size": int(self.attn_tp_size),
            "attn_cp_size": int(self.attn_cp_size),
            "dp_size": int(self.dp_size),
            "pp_size": int(self.pp_size),
            "page_size": int(self.page_size) if self.page_size is not None else None,
            "kv_cache_dtype": str(self.kv_cache_dtype) if self.kv_cache_dtype is not None else None,
            "follow_bootstrap_room": bool(
                self.follow_bootstrap_room if self.follow_bootstrap_room is not None else True
            ),
            "enable_dsa_cache_layer_split": bool(self.enable_dsa_cache_layer_split),
            "dsv41_spec_layout": self.dsv41_spec_layout,
            "kv_layout": self.kv_layout,
            "decode_allocation_policy": self.decode_allocation_policy,
            "enable_kv_cache_sharding": bool(self.enable_kv_cache_sharding),
            "prefill_http_port": self.prefill_http_port,
            "target_tp_rank": None,
            "target_tp_ranks": None,
            "target_cp_ranks": None,
            "target_pp_ranks": None,
            "required_dst_info_num": None,
            "required_prefill_response_num": None,
        }
        for optional in ("dsv41_spec_layout", "kv_layout"):
            if info[optional] is None:
                del info[optional]
        return info


_CRASH = "500 Internal Server Error\n\nServer got itself in trouble"
"""aiohttp's answer when a handler raises: the real server lets bad input escape its handlers."""


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    block_on_close = False
    request_queue_size = 128
    """The listen backlog of SGLang's server (aiohttp's default), not socketserver's 5: a fleet
    that overflows one overflows the other."""

    def __init__(self, owner: BootstrapServer, address: tuple[str, int], family: int) -> None:
        self.address_family = family
        self.owner = owner
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # An answer leaves in one write: headers and body written apart, unbuffered, meet the
    # client's delayed ACK on a kept-alive connection (Nagle holds the body back ~40 ms).
    wbufsize = 64 * 1024
    disable_nagle_algorithm = True
    server: _HTTPServer
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
        self._lifetime = 0
        """Which process this is: a connection accepted in an earlier lifetime belongs to a
        process that is gone (see `_Handler.lifetime`)."""

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
        socket, a restart so fast that no client can see the server down. As with a new
        process, a request read before the restart is never answered nor applied after it."""
        with self._lock:
            self.restarts += 1
        if down_for <= 0 and self._server is not None:
            with self._lock:
                self._table = _Table()
                self._lifetime += 1
                self._release.set()
                self._release = threading.Event()
            self.drop_connections()
            return
        self.stop()
        with self._lock:
            self._table = _Table()
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
        try:
            status, text, ctype, port = self._answer(h, method, body)
        except _Gone:
            # Read before a restart and acted on after it: a real server's process would have
            # died with it, unanswered, and never counted it in the next one's memory.
            self._record(h, method, None, body)
            h.close_connection = True
            return
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
            if method != "GET":  # aiohttp's own answers for a route it does not serve
                return 405, "405: Method Not Allowed", "text/plain", None
            return 200, "OK", "text/plain", None
        if path != "/route":
            return 404, "404: Not Found", "text/plain", None
        return self._route(h, method, body)

    def _route(self, h: _Handler, method: str, body: bytes) -> tuple[int, str, str, int | None]:
        if method == "PUT":
            if self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}":
                return 401, "Unauthorized", "text/plain", None
            try:
                return self._put(h, body)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return 500, _CRASH, "text/plain", None
        if method == "GET":
            try:
                status, text, ctype = self._get(h)
            except (ValueError, TypeError, KeyError, AttributeError):
                return 500, _CRASH, "text/plain", None
            return status, text, ctype, None
        return 405, "Method not allowed", "application/json", None

    def _put(self, h: _Handler, body: bytes) -> tuple[int, str, str, int | None]:
        """SGLang's `_handle_route_put`, step for step: the same reads, checks and order, so the
        same payload fails the same way (an exception is a bare 500, sometimes after the table
        has changed, as on the real server)."""
        data = json.loads(body)
        fields = {name: data[name] for name in _REQUIRED}
        rank_port = int(fields["rank_port"])
        int(fields["page_size"])  # a null page_size fails here, before the table changes
        dsv41_spec_layout = data.get("dsv41_spec_layout")
        with self._lock:
            self._same_process(h)
            t = self._table
            if t.count and t.dsv41_spec_layout != dsv41_spec_layout:
                text = "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks"
                return 400, text, "text/plain", rank_port
            policy = data.get("decode_allocation_policy", "early")
            if t.count and t.decode_allocation_policy != policy:
                return 400, "Inconsistent prefill allocation policies", "text/plain", rank_port
            t.dsv41_spec_layout = dsv41_spec_layout
            t.decode_allocation_policy = policy
            single = fields["system_dp_size"] == 1
            _first_writer_wins(t, data, fields, single)
            dp = fields["attn_dp_rank"] if single else fields["system_dp_rank"]
            key = (dp, fields["attn_cp_rank"], fields["attn_tp_rank"], fields["pp_rank"])
            t.ranks[key] = {"rank_ip": fields["rank_ip"], "rank_port": rank_port}
            t.count += 1
            t.expected()  # computed for a log line after the count: a bad size fails here
        return 200, "OK", "text/plain", rank_port

    def _same_process(self, h: _Handler) -> None:
        """Called with the lock held, so that a restart cannot come between this and the use
        of the table."""
        if h.lifetime != self._lifetime:
            raise _Gone

    def _get(self, h: _Handler) -> tuple[int, str, str]:
        """SGLang's `_handle_route_get`, step for step (the first value of a repeated
        parameter; an empty one counts as missing; int() only where the real one calls it)."""
        query = parse_qs(urlsplit(h.path).query)
        values = [query[name][0] if name in query else "" for name in _RANK_QUERY]
        if not all(values):
            return 400, "Missing inputs for bootstrap server.", "text/plain"
        dp, cp, tp, pp = values
        with self._lock:
            self._same_process(h)
            t = self._table
            not_ready = f"Prefill server not fully registered yet ({t.count} workers registered)."
            if int(dp) == -1 and int(cp) == -1 and int(tp) == -1 and int(pp) == -1:
                if not t.ready():
                    return 503, not_ready, "text/plain"
                return 200, json.dumps(t.info()), "application/json"
            if not t.ready():
                return 503, not_ready, "text/plain"
            # Keys are the payload's values; the real nested lookup by int finds the same ones.
            found = t.ranks.get((int(dp), int(cp), int(tp), int(pp)))
        if found is None:
            text = (
                f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} "
                f"pp_rank={pp}"
            )
            return 404, text, "text/plain"
        return 200, json.dumps(found), "application/json"


def _first_writer_wins(
    t: Any, data: dict[str, Any], fields: dict[str, Any], single: bool
) -> None:
    """The topology's fields are set by the first registration that carries them, in SGLang's
    order of assignments (so that a bad value fails at the same point)."""
    port = data.get("prefill_http_port")
    policy = data.get("load_balance_method", "follow_bootstrap_room")
    firsts: tuple[tuple[str, Callable[[], Any]], ...] = (
        ("attn_tp_size", lambda: fields["attn_tp_size"]),
        ("attn_cp_size", lambda: fields["attn_cp_size"]),
        ("dp_size", lambda: fields["attn_dp_size"] if single else fields["system_dp_size"]),
        ("pp_size", lambda: fields["pp_size"]),
        ("page_size", lambda: int(fields["page_size"])),
        ("kv_cache_dtype", lambda: fields["kv_cache_dtype"]),
        ("kv_layout", lambda: data.get("kv_layout")),
        ("prefill_http_port", lambda: None if port is None else int(port)),
        ("follow_bootstrap_room", lambda: policy == "follow_bootstrap_room"),
        ("enable_dsa_cache_layer_split", lambda: bool(data.get("enable_dsa_cache_layer_split"))),
        ("enable_kv_cache_sharding", lambda: bool(data.get("enable_kv_cache_sharding"))),
    )
    for name, value in firsts:
        if getattr(t, name) is None:
            chosen = value()
            if chosen is not None:
                setattr(t, name, chosen)
