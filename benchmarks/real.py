"""Scenarios with real threads and real HTTP on 127.0.0.1: registrar's defaults and the
baseline, each fleet against its own reference server, both servers started (or restarted) at
the same moment."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

from registrar import Registrar, RequestEvent, State, Status, make_payload
from registrar.devtools.bootstrap_server import BootstrapServer

from .baseline import BaselineClient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def payload(rank: int, size: int) -> dict[str, Any]:
    return make_payload("127.0.0.1", 40000 + rank, attn_tp_rank=rank, attn_tp_size=size)


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def peak_rate_wall(
    server: BootstrapServer, start: float, end: float, method: str | None = None
) -> float:
    bins: dict[int, int] = {}
    for record in server.records():
        if start <= record.at < end and (method is None or record.method == method):
            bins[int(record.at - start)] = bins.get(int(record.at - start), 0) + 1
    return float(max(bins.values(), default=0))


class _Fleet:
    """n registrars with request and registration times recorded."""

    def __init__(self, url: str, n: int, **kwargs: Any) -> None:
        self.request_times: list[float] = []
        self.registered_at: list[float | None] = [None] * n
        self.regs = []
        for rank in range(n):
            reg = Registrar(url, payload(rank, n), **kwargs)
            reg.add_request_listener(self._on_request)
            reg.add_listener(self._on_change(rank))
            self.regs.append(reg)

    def _on_request(self, event: RequestEvent) -> None:
        self.request_times.append(time.monotonic())

    def _on_change(self, rank: int) -> Any:
        def listener(old: State, new: State, status: Status) -> None:
            if new is State.REGISTERED:
                self.registered_at[rank] = time.monotonic()

        return listener

    def stop(self) -> None:
        for reg in self.regs:
            reg.stop(timeout=5)


def startup_race(n: int, up_after: float, patience: float = 45.0) -> dict[str, Any]:
    """Both fleets start at once; both servers come up `up_after` seconds later."""
    reg_server = BootstrapServer("127.0.0.1", free_port())
    base_server = BootstrapServer("127.0.0.1", free_port())
    fleet = _Fleet(reg_server.url, n)
    base_times: list[float] = []
    bases = [BaselineClient(base_server.url, payload(r, n), base_times.append) for r in range(n)]
    started = time.monotonic()
    for reg in fleet.regs:
        reg.start()
    for base in bases:
        base.start()
    time.sleep(max(0.0, started + up_after - time.monotonic()))
    reg_server.start()
    base_server.start()
    up = time.monotonic()
    up_wall = time.time()
    deadline = up + patience
    while time.monotonic() < deadline:
        done_reg = all(t is not None for t in fleet.registered_at)
        done_base = all(b.registered_at is not None or b.gave_up for b in bases)
        if done_reg and done_base:
            break
        time.sleep(0.02)
    fleet.stop()
    for base in bases:
        base.stop()
    result = {
        "registrar": _startup_figures(
            fleet.registered_at,
            fleet.request_times,
            n,
            up,
            started,
            peak_rate_wall(reg_server, up_wall, up_wall + patience),
        ),
        "baseline": _startup_figures(
            [b.registered_at for b in bases],
            base_times,
            n,
            up,
            started,
            peak_rate_wall(base_server, up_wall, up_wall + patience),
        ),
    }
    reg_server.close()
    base_server.close()
    return result


def _startup_figures(
    registered: list[float | None],
    requests: list[float],
    n: int,
    up: float,
    started: float,
    peak: float,
) -> dict[str, Any]:
    after = [t - up for t in registered if t is not None]
    down = sum(1 for t in requests if t < up)
    return {
        "registered_fraction": len(after) / n,
        "p50": quantile(after, 0.5),
        "p99": quantile(after, 0.99),
        "last": max(after) if len(after) == n else None,
        "requests_while_down_per_client": down / n,
        "rate_while_down_per_client": down / n / max(up - started, 1e-9),
        "peak_rate": peak,
    }


def restart(n: int, down_for: float, patience: float = 30.0) -> dict[str, Any]:
    """Both fleets registered; both servers restart with empty memory, down for `down_for`."""
    reg_server = BootstrapServer("127.0.0.1", 0).start()
    base_server = BootstrapServer("127.0.0.1", 0).start()
    fleet = _Fleet(reg_server.url, n)
    bases = [BaselineClient(base_server.url, payload(r, n)) for r in range(n)]
    for reg in fleet.regs:
        reg.start()
    for base in bases:
        base.start()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        len(reg_server.routes()) == n and len(base_server.routes()) == n
    ):
        time.sleep(0.02)
    time.sleep(2.0)  # let the watch settle into its rhythm
    before = len(fleet.request_times)
    other = threading.Thread(target=base_server.restart, args=(down_for,))
    other.start()
    reg_server.restart(down_for=down_for)
    other.join()
    back = time.monotonic()
    back_wall = time.time()
    recovered = None
    while time.monotonic() < back + patience:
        if len(reg_server.routes()) == n and reg_server.ready:
            recovered = time.monotonic() - back
            break
        time.sleep(0.02)
    window_end = back_wall + (recovered if recovered is not None else patience) + 1.0
    result = {
        "registrar": {
            "recovered_fraction": len(reg_server.routes()) / n,
            "time_to_all_back": recovered,
            "peak_rate": peak_rate_wall(reg_server, back_wall, window_end),
            "peak_put_rate": peak_rate_wall(reg_server, back_wall, window_end, "PUT"),
            "requests_per_client": (len(fleet.request_times) - before) / n,
            "registered_count_exact": reg_server.registered_count == n,
        },
        "baseline": {
            "recovered_fraction": len(base_server.routes()) / n,
            "time_to_all_back": None,
            "peak_rate": peak_rate_wall(base_server, back_wall, window_end),
            "requests_per_client": 0.0,
        },
    }
    fleet.stop()
    for base in bases:
        base.stop()
    reg_server.close()
    base_server.close()
    return result
