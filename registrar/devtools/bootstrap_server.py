"""A reference bootstrap server with SGLang's HTTP semantics, for `registrar bootstrap` and the
demo (docs/sglang.md, "The reference bootstrap server"): SGLang 0.5.23's route table and `/route`
handlers step for step (same reads, checks and order: the same payload fails the same way), then
the HTTP side. The tests' lab (tests/bootstrap_lab.py) copies earlier releases (docs/testing.md)
and subclasses the server through `_handle`, `_reply`, `_new_table` and `_bind`."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..core._diagnosis import hostport
from ..protocols._sglang import INSTANCE_HEADER, REQUIRED_FIELDS
from ..surfaces._httpserver import bind

__all__ = ["BootstrapServer"]

logger = logging.getLogger(__name__)

_RANK_QUERY = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")

CRASH = "500 Internal Server Error\n\nServer got itself in trouble"
"""aiohttp's answer when a handler raises: the real server lets bad input escape its handlers."""

Reply = tuple[int, str, str]
"""An answer: its status, text and content type."""


@dataclass
class RouteTable:
    """`CommonKVBootstrapServer`'s memory. Values are kept as the payload gave them, so a wrongly
    typed one fails later where it fails on the real server. The server's lock guards it."""

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
        return None not in sizes and bool(self.count >= self.expected())

    def expected(self) -> Any:
        return self.dp_size * self.attn_cp_size * self.attn_tp_size * self.pp_size

    def put(self, body: bytes) -> Reply:
        """SGLang's `_handle_route_put`: reads first (a null page_size fails before any change)."""
        data = json.loads(body)
        fields = {name: data[name] for name in REQUIRED_FIELDS}
        rank_port = int(fields["rank_port"])
        int(fields["page_size"])
        # The layout checks; the last writer's values kept.
        layout = data.get("dsv41_spec_layout")
        if self.count and self.dsv41_spec_layout != layout:
            return 400, "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks", "text/plain"
        policy = data.get("decode_allocation_policy", "early")
        if self.count and self.decode_allocation_policy != policy:
            return 400, "Inconsistent prefill allocation policies", "text/plain"
        self.decode_allocation_policy = policy
        self.dsv41_spec_layout = layout
        single = fields["system_dp_size"] == 1
        balance = data.get("load_balance_method", "follow_bootstrap_room")
        # The topology's fields are set by the first registration that carries them, in
        # SGLang's order of assignments (so that a bad value fails at the same point: the port's
        # int() is the one that can).
        firsts = {
            "attn_tp_size": fields["attn_tp_size"],
            "attn_cp_size": fields["attn_cp_size"],
            "dp_size": fields["attn_dp_size"] if single else fields["system_dp_size"],
            "pp_size": fields["pp_size"],
            "page_size": int(fields["page_size"]),
            "kv_cache_dtype": fields["kv_cache_dtype"],
            "kv_layout": data.get("kv_layout"),
            "prefill_http_port": data.get("prefill_http_port"),
            "follow_bootstrap_room": balance == "follow_bootstrap_room",
            "enable_dsa_cache_layer_split": bool(data.get("enable_dsa_cache_layer_split")),
            "enable_kv_cache_sharding": bool(data.get("enable_kv_cache_sharding")),
        }
        for name, value in firsts.items():
            if getattr(self, name) is None and value is not None:
                setattr(self, name, int(value) if name == "prefill_http_port" else value)
        dp = fields["attn_dp_rank"] if single else fields["system_dp_rank"]
        key = (dp, fields["attn_cp_rank"], fields["attn_tp_rank"], fields["pp_rank"])
        self.ranks[key] = {"rank_ip": fields["rank_ip"], "rank_port": rank_port}
        self.count += 1
        self.expected()  # computed for a log line after the count: a bad size fails here
        return 200, "OK", "text/plain"

    def get(self, path: str) -> Reply:
        """SGLang's `_handle_route_get` (a repeated parameter's first; int() where it calls it)."""
        query = parse_qs(urlsplit(path).query)
        values = [query[name][0] if name in query else "" for name in _RANK_QUERY]
        if not all(values):
            return 400, "Missing inputs for bootstrap server.", "text/plain"
        dp, cp, tp, pp = values
        everything = int(dp) == -1 and int(cp) == -1 and int(tp) == -1 and int(pp) == -1
        if not self.ready():
            text = f"Prefill server not fully registered yet ({self.count} workers registered)."
            return 503, text, "text/plain"
        if everything:
            return 200, json.dumps(self.info()), "application/json"
        # Keys are the payload's values; the real nested lookup by int finds the same ones.
        if (found := self.ranks.get((int(dp), int(cp), int(tp), int(pp)))) is None:
            ranks = f"dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
            return 404, f"Bootstrap info not found for {ranks}", "text/plain"
        return 200, json.dumps(found), "application/json"

    def info(self) -> dict[str, Any]:
        """The answer to the all-`-1` query: `PrefillServerInfo` as the real server sends it."""
        info: dict[str, Any] = {
            "attn_tp_size": int(self.attn_tp_size),
            "attn_cp_size": int(self.attn_cp_size),
            "dp_size": int(self.dp_size),
            "pp_size": int(self.pp_size),
            "page_size": int(self.page_size) if self.page_size is not None else None,
            "kv_cache_dtype": str(self.kv_cache_dtype) if self.kv_cache_dtype is not None else None,
            "follow_bootstrap_room": self.follow_bootstrap_room is not False,  # None: True
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
        layouts = ("dsv41_spec_layout", "kv_layout")  # only when set
        return {k: v for k, v in info.items() if v is not None or k not in layouts}


class Listener(ThreadingHTTPServer):  # daemon threads: ThreadingHTTPServer's own
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
    """An in-memory bootstrap server on `host:port` (0: an ephemeral port, kept across restarts), or
    on `sock`, bound and not listening until `start()` (docs/sglang.md). Upstream pull requests not
    in 0.5.23, each behind its knob: `token` requires it on `PUT /route` (#39416: 401 without it or
    with another, GETs open); `instance_id` sends a new id per lifetime on every answer (#34289)."""

    def __init__(  # noqa: PLR0913 - a keyword per knob
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        token: str | None = None,
        max_body_bytes: int = 1024 * 1024,
        sock: socket.socket | None = None,
        instance_id: bool = False,
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
        self.instance_id = uuid.uuid4().hex if instance_id else None

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
            self.instance_id = self.instance_id and uuid.uuid4().hex

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
        if (body := self._read_body(h)) is not None:
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
            if self.instance_id:
                h.send_header(INSTANCE_HEADER, self.instance_id)
            for key, value in (headers or {}).items():
                h.send_header(key, value)
            h.end_headers()
            h.wfile.write(data)
            h.wfile.flush()
        except OSError:
            h.close_connection = True

    def _read_body(self, h: Handler) -> bytes | None:
        try:
            length = int(h.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            reply: Reply = (400, "Bad Content-Length", "text/plain")
        elif length > self.max_body_bytes:
            reply = (413, f"Request body over {self.max_body_bytes} bytes", "text/plain")
        else:
            return h.rfile.read(length)
        self._reply(h, reply, headers={"Connection": "close"})
        return None

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
        denied = self.token is not None and h.headers.get("Authorization") != f"Bearer {self.token}"
        if h.command == "PUT" and denied:
            return 401, "Unauthorized", "text/plain"
        # Under the lock, for the current lifetime only: no restart between the check and the use.
        with self._lock:
            if h.lifetime != self._lifetime:
                return None
            try:
                return self._table.get(h.path) if h.command == "GET" else self._table.put(body)
            except (ValueError, TypeError, KeyError, AttributeError, RecursionError):
                return 500, CRASH, "text/plain"
