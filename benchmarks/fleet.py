"""A fleet of N clients in one process, driven over stdin by the benchmark (`benchmarks.race`).

Run as a script (`python benchmarks/fleet.py WHO URL N [WATCH]`) by any interpreter: the
current registrar, the release measured beside it (installed in another virtual environment),
or the upstream SGLang loop (`WHO=upstream`, needs only requests), or the physical limit
(`WHO=limit`: each client sends its PUT and one check at once through a bare socket,
nothing else). It imports nothing from the benchmarks package, and of registrar only what every
release has (`Registrar`, `State`), so the same script drives every contender.

Commands, one per line; each is answered with one JSON line:
  start  -> {"t": monotonic}          start every client
  count  -> {"once": k, "twice": k}   clients registered at least once / at least twice
  cpu    -> {"cpu": s, "t": s}        this process's CPU time and the monotonic clock
  stop   -> {"events": [...], "stops": [...]}, then exit
`events` are [rank, monotonic time] of every transition into REGISTERED (upstream: its one
accepted PUT); `stops` the seconds each `stop()` took. Clocks are CLOCK_MONOTONIC, shared by
every process on the machine, so times compare with the servers' own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
import threading
import time
from typing import Any

import requests


def payload(rank: int, size: int) -> dict[str, Any]:
    """Rank `rank` of a tensor-parallel topology of `size` (attn_tp_rank is the rank)."""
    return {
        "attn_tp_size": size,
        "attn_tp_rank": rank,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "attn_dp_size": 1,
        "attn_dp_rank": 0,
        "pp_size": 1,
        "pp_rank": 0,
        "system_dp_size": 1,
        "system_dp_rank": 0,
        "rank_ip": "127.0.0.1",
        "rank_port": 40000 + rank,
        "page_size": 16,
        "kv_cache_dtype": "auto",
    }


class Upstream:
    """The upstream SGLang loop (`_register_topology_row`, as described in its PR): up to 5
    PUTs with a 5 s timeout; between them `min(1 * 2**a, 30) * (0.75 + 0.25 * (monotonic % 1))`;
    no sleep after the last; then it gives up for good and never registers again."""

    def __init__(self, url: str, body: dict[str, Any], on_done: Any) -> None:
        self.url = f"{url}/route"
        self.body = body
        self.on_done = on_done
        self.halt = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.halt.set()
        self.thread.join(10)

    def run(self) -> None:
        with requests.Session() as session:
            for attempt in range(5):
                if self.halt.is_set():
                    return
                try:
                    answer = session.put(self.url, json=self.body, timeout=5)
                    if answer.status_code == 200:
                        self.on_done()
                        return
                except requests.RequestException:
                    pass
                if attempt < 4:
                    delay = min(1.0 * 2**attempt, 30.0) * (0.75 + 0.25 * (time.monotonic() % 1))
                    self.halt.wait(delay)


class Limit(Upstream):
    """The physical limit: one PUT and its check, at once, nothing else (the server is up),
    on one connection through bare sockets with the requests' bytes made in advance: the
    least CPU a Python client can spend on them, so no client can do better."""

    def __init__(self, url: str, body: dict[str, Any], on_done: Any) -> None:
        super().__init__(url, body, on_done)
        host, port = url.split("//", 1)[1].rsplit(":", 1)
        self.address = (host, int(port))
        data = json.dumps(body).encode()
        head = f"Host: {host}:{port}\r\n"
        self.put = (
            f"PUT /route HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n"
        ).encode() + data
        query = (
            "prefill_dp_rank=0&prefill_cp_rank=0&target_pp_rank=0"
            f"&target_tp_rank={body['attn_tp_rank']}"
        )
        self.get = f"GET /route?{query} HTTP/1.1\r\n{head}\r\n".encode()

    @staticmethod
    def exchange(sock: socket.socket, request: bytes) -> bytes:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        while len(body) < length:
            body += sock.recv(65536)
        return head

    def run(self) -> None:
        with socket.create_connection(self.address, timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.exchange(sock, self.put)
            self.exchange(sock, self.get)
        self.on_done()


def main() -> int:
    who, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    watch = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "default" else None
    log = os.environ.get("BENCH_FLEET_LOG")  # a file to diagnose a run with; else silence
    if log:
        logging.basicConfig(
            filename=log, level=logging.INFO, format="%(relativeCreated)d %(thread)d %(message)s"
        )
        logging.getLogger("transitions").setLevel(logging.WARNING)
    else:
        logging.disable(logging.CRITICAL)  # the figures are the output, not thousands of retries
    events: list[tuple[int, float]] = []
    lock = threading.Lock()
    registered: dict[int, int] = {}

    def mark(rank: int) -> None:
        with lock:
            events.append((rank, time.monotonic()))
            registered[rank] = registered.get(rank, 0) + 1

    clients: list[Any] = []
    if who == "limit":
        clients = [Limit(url, payload(r, n), lambda r=r: mark(r)) for r in range(n)]
    elif who == "upstream":
        clients = [Upstream(url, payload(r, n), lambda r=r: mark(r)) for r in range(n)]
    else:
        from registrar import Registrar, State  # noqa: PLC0415 - only this contender needs it

        kwargs: dict[str, Any] = {} if watch is None else {"watch_interval": watch}
        for rank in range(n):
            reg = Registrar(url, payload(rank, n), **kwargs)

            def listener(old: Any, new: Any, status: Any, rank: int = rank) -> None:
                if new is State.REGISTERED:
                    mark(rank)

            reg.add_listener(listener)
            clients.append(reg)
    out = sys.stdout
    for line in sys.stdin:
        command = line.strip()
        if command == "start":
            started = time.monotonic()
            for client in clients:
                client.start()
            answer: dict[str, Any] = {"t": started}
        elif command == "count":
            with lock:
                once = sum(1 for c in registered.values() if c >= 1)
                twice = sum(1 for c in registered.values() if c >= 2)
            answer = {"once": once, "twice": twice}
        elif command == "cpu":
            answer = {"cpu": time.process_time(), "t": time.monotonic()}
        elif command == "stop":
            stops = []
            for client in clients:
                began = time.perf_counter()
                client.stop()
                stops.append(time.perf_counter() - began)
            with lock:
                answer = {"events": list(events), "stops": stops}
            out.write(json.dumps(answer) + "\n")
            out.flush()
            return 0
        else:
            answer = {"error": f"unknown command {command!r}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
