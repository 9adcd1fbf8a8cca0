"""The reference bootstrap server's test lab, for tests and benchmarks on 127.0.0.1 (never
production): `BootstrapLab` is registrar's own `BootstrapServer`
(registrar/devtools/bootstrap_server.py) with what only tests ask of it. It misbehaves on purpose
(an injected `Fault` takes the next matching requests), records every request (`records()`),
copies an older SGLang release (`release=`, from 0.5.10; docs/testing.md) and shows its memory
and connections (`routes()`, `ready`, `open_connections`)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

from registrar.devtools.bootstrap_server import BootstrapServer, Handler, Reply, RouteTable

__all__ = ["LATEST_RELEASE", "BootstrapLab", "Fault", "RequestRecord"]

LATEST_RELEASE = "0.5.23"
"""The release registrar's route table copies (registrar/devtools/bootstrap_server.py)."""

FIELDS_SINCE: dict[str, tuple[int, int, int]] = {
    "enable_dsa_cache_layer_split": (0, 5, 16),
    "prefill_http_port": (0, 5, 16),
    "dsv41_spec_layout": (0, 5, 21),  # with its 400 when the ranks differ
    "decode_allocation_policy": (0, 5, 22),  # with its 400 when the ranks differ
    "kv_layout": (0, 5, 23),
    "enable_kv_cache_sharding": (0, 5, 23),
}
"""The optional payload fields the server stores, and the release that added each."""


def release_fields(release: str) -> frozenset[str]:
    """The optional fields SGLang `release` ("0.5.19", "0.5.13.post1") stores."""
    parts = release.split(".")
    try:
        version = tuple(int(part) for part in parts[:3])
    except ValueError:
        version = ()
    if len(version) != 3 or not all(p.startswith("post") for p in parts[3:]):
        raise ValueError(f"release={release!r}: give an SGLang version such as '0.5.19'")
    if version < (0, 5, 10):
        raise ValueError(
            f"release={release!r}: the reference server speaks the protocol of SGLang 0.5.10 "
            "and later (older releases have no worker count nor 503); give 0.5.10 or newer"
        )
    return frozenset(name for name, since in FIELDS_SINCE.items() if version >= since)


@dataclass
class OlderTable(RouteTable):
    """The route table of a release without the optional fields in `absent`: it reads none of
    them from a payload (so none is checked nor stored) and its server info has none of them."""

    absent: frozenset[str] = frozenset()

    def put(self, body: bytes) -> Reply:
        data = json.loads(body)
        if isinstance(data, dict):
            body = json.dumps({k: v for k, v in data.items() if k not in self.absent}).encode()
        return super().put(body)

    def info(self) -> dict[str, Any]:
        return {k: v for k, v in super().info().items() if k not in self.absent}


@dataclass(frozen=True)
class RequestRecord:
    """One request the server received: `status` is the one answered (None when the connection
    was dropped or hung)."""

    at: float
    method: str
    path: str
    query: dict[str, str]
    status: int | None
    body: bytes = b""
    authorization: str | None = None

    @property
    def rank_port(self) -> int | None:
        """A PUT's payload's `rank_port` (it tells which client sent it), if it has one."""
        try:
            return int(json.loads(self.body)["rank_port"]) if self.method == "PUT" else None
        except (ValueError, TypeError, KeyError, RecursionError):
            return None


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


class BootstrapLab(BootstrapServer):
    """`BootstrapServer` (the same options) copying SGLang `release`, with faults and records,
    speaking TLS with `certfile` and `keyfile`."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        release: str = LATEST_RELEASE,
        certfile: str | None = None,
        keyfile: str | None = None,
        sock: socket.socket | None = None,
        **options: Any,
    ) -> None:
        self._absent = frozenset(FIELDS_SINCE) - release_fields(release)
        self._tls: ssl.SSLContext | None = None
        if certfile is not None:
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._tls.load_cert_chain(certfile, keyfile)
        super().__init__(host, port, sock=None if sock is None else self._wrap(sock), **options)
        self._faults: deque[Fault] = deque()
        self._records: deque[RequestRecord] = deque(maxlen=200_000)
        self._let_go = threading.Event()  # set: the requests a delay or hang holds must go
        self.restarts = 0

    @property
    def url(self) -> str:
        return super().url.replace("http://", "https://", 1) if self._tls else super().url

    def _wrap(self, sock: socket.socket) -> socket.socket:
        """A bound socket, listening in TLS once it listens (with `certfile`)."""
        return self._tls.wrap_socket(sock, server_side=True) if self._tls else sock

    def _bind(self) -> socket.socket:
        return self._wrap(super()._bind())

    def _new_table(self) -> RouteTable:
        return OlderTable(absent=self._absent) if self._absent else super()._new_table()

    def start(self) -> BootstrapLab:
        # What a delay or hang holds from now on is let go at the next stop or restart.
        if self._server is None:
            self._let_go = threading.Event()
        super().start()
        return self

    def _stop(self, hold: bool) -> None:
        self._let_go.set()
        super()._stop(hold)

    def restart(self, down_for: float = 0.0) -> None:
        with self._lock:
            self.restarts += 1
        super().restart(down_for)

    def _next_lifetime(self) -> None:
        super()._next_lifetime()
        with self._lock:
            self._let_go.set()
            self._let_go = threading.Event()

    def forget(self) -> None:
        """Lose every route (and, with `instance_id`, take a new id), as a new process would;
        the connections stay (a proxy in front of the server keeps them)."""
        with self._lock:
            self._table = self._new_table()
            self.instance_id = self.instance_id and uuid.uuid4().hex

    def drop_connections(self) -> None:
        """Close every open connection (keep-alive ones too) without forgetting anything."""
        self._drop_connections()

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

    def _next_fault(self, method: str) -> tuple[Fault | None, threading.Event]:
        with self._lock:
            let_go = self._let_go
            for fault in self._faults:
                if fault.method is None or fault.method == method:
                    fault.count -= 1
                    if fault.count <= 0:
                        self._faults.remove(fault)
                    return fault, let_go
        return None, let_go

    def _handle(self, h: Handler) -> None:
        fault, let_go = self._next_fault(h.command)
        if fault is None:
            super()._handle(h)
            return
        body = self._read_body(h)
        if body is None:
            return
        if fault.kind == "status":
            headers = {"Retry-After": fault.retry_after} if fault.retry_after else {}
            if fault.close:
                headers["Connection"] = "close"
            self._reply(h, (fault.status, fault.body, fault.content_type), body, headers)
            return
        if fault.kind in ("delay", "hang"):
            let_go.wait(fault.seconds if fault.kind == "delay" else None)
        if fault.kind not in ("hang", "drop", "reset"):
            self._reply(h, self._answer(h, body), body)
            return
        self._reply(h, None, body)  # recorded before the client can see anything
        if fault.kind in ("drop", "reset"):  # part of an answer, then a close or a TCP reset
            with contextlib.suppress(OSError):
                h.wfile.write(b'HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{"partial')
                h.wfile.flush()
                if fault.kind == "reset":
                    linger = struct.pack("ii", 1, 0)
                    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)

    def _reply(
        self,
        h: Handler,
        reply: Reply | None,
        body: bytes = b"",
        headers: Mapping[str, str] | None = None,
    ) -> None:
        parts = urlsplit(h.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        status = None if reply is None else reply[0]
        auth = h.headers.get("Authorization")
        record = RequestRecord(time.time(), h.command, parts.path, query, status, body, auth)
        with self._lock:
            self._records.append(record)
        super()._reply(h, reply, body, headers)
