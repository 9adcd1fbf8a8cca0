"""The chaos soak: 50 registrars of one topology in one process against one reference server
that is restarted at random moments 10 times, sometimes staying down for seconds."""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from support import settled, sglang_payload, wait_until

from registrar import Backoff, Registrar, State

TP, PP = 10, 5  # 50 ranks
RESTARTS = 10


@pytest.fixture
def unhandled() -> Iterator[list[BaseException]]:
    """Collects exceptions that escape any thread during the test."""
    caught: list[BaseException] = []
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        caught.append(args.exc_value or RuntimeError("thread died"))

    threading.excepthook = hook
    yield caught
    threading.excepthook = previous


def recovered(server: BootstrapLab, regs: list[Registrar]) -> bool:
    """The server of this lifetime knows every rank at its own address, and every registrar
    says it is registered (routes live in the server's memory, so they prove a re-registration
    in this lifetime)."""
    routes = server.routes()
    return (
        server.ready
        and len(routes) == len(regs)
        and all(
            routes.get((0, 0, r.payload["attn_tp_rank"], r.payload["pp_rank"]), {}).get("rank_port")
            == r.payload["rank_port"]
            and r.state is State.REGISTERED
            for r in regs
        )
    )


@pytest.mark.soak
@pytest.mark.timeout(120)
def test_chaos_soak(
    server: BootstrapLab,
    registrars: list,
    unhandled: list[BaseException],
    record_property: Any,
) -> None:
    rng = random.Random(20261130)
    regs = []
    for pp in range(PP):
        for tp in range(TP):
            payload = sglang_payload(
                tp_rank=tp, tp_size=TP, pp_size=PP, pp_rank=pp, port=30000 + pp * TP + tp
            )
            reg = Registrar(
                server.url,
                payload,
                watch_interval=0.5,
                max_attempts=None,
                backoff=Backoff(initial=0.2, multiplier=2.0, maximum=2.0),
                timeout=(1.0, 2.0),
            )
            registrars.append(reg)
            regs.append(reg.start())
    deadline = time.monotonic() + 20
    while not recovered(server, regs) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert recovered(server, regs), "the topology never registered in the first place"

    recoveries: list[float] = []
    started = time.monotonic()
    for lifetime in range(1, RESTARTS + 1):
        down = rng.choice([0.0, 0.0, 0.2, 1.0, 2.5])
        server.restart(down_for=down)
        back = time.monotonic()
        calm = rng.uniform(0.3, 3.0)  # the next restart may come before recovery
        while time.monotonic() - back < calm:
            if recovered(server, regs) and len(recoveries) < lifetime:
                recoveries.append(time.monotonic() - back)
            time.sleep(0.02)
        if len(recoveries) < lifetime:
            recoveries.append(float("nan"))  # overtaken by the next restart
    last_back = time.monotonic()
    deadline = last_back + 20
    while not recovered(server, regs) and time.monotonic() < deadline:
        time.sleep(0.02)
    final = time.monotonic() - last_back
    assert recovered(server, regs), "not every rank came back after the last restart"
    routes = server.routes()
    for reg in regs:
        p = reg.payload
        assert routes[(0, 0, p["attn_tp_rank"], p["pp_rank"])] == {
            "rank_ip": "127.0.0.1",
            "rank_port": p["rank_port"],
        }
    assert server.registered_count == len(regs), "some rank registered twice in one lifetime"
    assert not any(r.thread_died for r in regs)
    assert all(r.running for r in regs)

    requests_total = len(server.records())
    for reg in regs:
        assert reg.stop(timeout=5)
    stopped_at, stopped_wall = len(server.records()), time.time()
    # stop() returned True: every registrar's thread has ended, so none can send again.
    assert not any(r.running for r in regs)
    # A request that stop() cut after it was sent is still read, answered and recorded by the
    # server, late on a loaded machine: at most one per registrar. Once the server serves no
    # connection and the count has settled, every request there was is in the records.
    assert wait_until(lambda: server.open_connections == 0, timeout=10.0)
    drained = settled(lambda: len(server.records()), quiet=0.5, timeout=10.0)
    late = [(r.method, f"{r.at - stopped_wall:+.2f} s") for r in server.records()[stopped_at:]]
    assert drained - stopped_at <= len(regs), f"more than was in flight at the stop: {late}"
    assert unhandled == []

    measured = [r for r in recoveries if not math.isnan(r)]
    worst = max([*measured, final])
    figures = (
        f"chaos soak: {len(regs)} registrars, {server.restarts} restarts survived in "
        f"{time.monotonic() - started:.1f} s; {len(measured)} recoveries completed before "
        f"the next restart, worst time to recover {worst:.2f} s; "
        f"{requests_total / len(regs):.1f} requests per registrar; "
        f"server count exact ({server.registered_count})"
    )
    record_property("figures", figures)  # printed in the run's summary (conftest.py)
