"""The smg protocol against the real gateway (`smg launch --pd-disaggregation`, from the `smg`
wheel in the environment scripts/smg-venv.sh builds) on 127.0.0.1, with stand-in workers that
answer what the gateway probes: a late gateway, restarts by SIGKILL with a fleet, an operator's
DELETE undone, readiness gating and withdrawal, the drain at stop, two gateways with one down,
and the control-plane key. A missing gateway fails these tests (tests/smg_support.py)."""

from __future__ import annotations

import collections
import logging
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from smg_support import Gateway, StandInWorker, gateway_binary, workers
from support import CLI_ENV, wait_until

from registrar import Registrar, State, smg_registrar
from registrar.core._backoff import Backoff
from registrar.protocols._smg.transport import SmgTransport

pytestmark = pytest.mark.timeout(240)

FAST = Backoff(initial=0.2, multiplier=2.0, maximum=1.0, jitter=0.25)


@pytest.fixture(scope="module", autouse=True)
def _binary() -> None:
    gateway_binary()  # builds the cached environment once, or fails every test here


@pytest.fixture
def gateways(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    made: list[Gateway] = []

    def make(**kw: Any) -> Gateway:
        gateway = Gateway(tmp_path / f"gw{len(made)}", **kw)
        made.append(gateway)
        return gateway

    yield make
    for gateway in made:
        gateway.kill()


@pytest.fixture
def fleet() -> Iterator[Callable[..., Registrar]]:
    """Registrars made here are stopped (drained) together at the end of the test."""
    made: list[Registrar] = []

    def make(gateway: str, worker: StandInWorker, **kw: Any) -> Registrar:
        kw.setdefault("backoff", FAST)
        kw.setdefault("max_attempts", None)
        kw.setdefault("drain_timeout", 10.0)
        reg = smg_registrar(
            gateway,
            worker.url,
            worker.worker_type,
            bootstrap_port=worker.bootstrap_port,
            **kw,
        )
        made.append(reg)
        return reg

    yield make
    stop_all(made)


def stop_all(made: list[Registrar], timeout: float = 30.0) -> None:
    for reg in made:
        reg.stop(timeout=0)
    deadline = time.monotonic() + timeout
    for reg in made:
        reg.stop(timeout=max(0.0, deadline - time.monotonic()))


def duplicates(gateway: Gateway) -> list[str]:
    counts = collections.Counter(w["url"] for w in gateway.workers())
    return [url for url, n in counts.items() if n > 1]


def all_listed(gateway: Gateway, expected: list[StandInWorker]) -> bool:
    ready = set(gateway.ready_urls())
    return all(w.url in ready for w in expected)


def test_a_late_gateway(gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]) -> None:
    gateway = gateways()
    with workers(1, "prefill") as (worker,):
        reg = fleet(gateway.url, worker).start()
        assert wait_until(lambda: reg.status().attempts_total >= 2, 10)
        assert reg.state is State.REGISTERING
        gateway.start()
        assert reg.wait_for(State.REGISTERED, 30)
        (listed,) = gateway.workers()
        assert listed["url"] == worker.url
        assert listed["worker_type"] == "prefill"
        assert listed["bootstrap_port"] == worker.bootstrap_port
        assert listed["status"] == "ready"
        transport = reg._transport
        assert isinstance(transport, SmgTransport)
        assert transport.worker_id == listed["id"]


def test_three_kills_of_the_gateway_with_twenty_workers(
    gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]
) -> None:
    gateway = gateways().start()
    with workers(20) as made:
        regs = [fleet(gateway.url, w).start() for w in made]
        assert wait_until(lambda: all_listed(gateway, made), 60)
        for restart in range(1, 4):
            gateway.kill()  # SIGKILL: no goodbye, every worker forgotten
            gateway.start()  # the same port
            assert wait_until(lambda: all_listed(gateway, made), 60), restart
            assert duplicates(gateway) == []
            assert len(gateway.workers()) == 20
            # Each registrar noticed this gateway's new process, and none is left registering.
            assert wait_until(lambda: all(r.state is State.REGISTERED for r in regs), 30)
        assert all(r.status().reregistrations >= 1 for r in regs)
        assert all(r.status().registrations >= 2 for r in regs)


def test_an_operator_delete_is_undone(
    gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]
) -> None:
    gateway = gateways().start()
    with workers(1) as (worker,):
        reg = fleet(gateway.url, worker, watch_interval=1.0).start()
        assert reg.wait_for(State.REGISTERED, 30)
        gateway.delete(worker.url)
        assert wait_until(lambda: reg.status().reregistrations == 1, 30)
        assert reg.wait_for(State.REGISTERED, 30)
        assert wait_until(lambda: gateway.ready_urls() == [worker.url], 30)
        assert duplicates(gateway) == []


def test_offered_only_while_ready(
    gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]
) -> None:
    gateway = gateways().start()
    with workers(1) as (worker,):
        worker.ready = False
        reg = fleet(
            gateway.url, worker, ready=f"{worker.url}/ready", grace=1.0, ready_interval=0.2
        ).start()
        assert wait_until(lambda: (reg.status().last_error or "").startswith("not offered"), 10)
        # Three more looks at /ready that found it not ready: each was a chance to offer it.
        looked = worker.requests.get("/ready", 0)
        assert wait_until(lambda: worker.requests.get("/ready", 0) >= looked + 3, 10)
        assert gateway.workers() == []  # nothing was offered
        assert reg.status().attempt == 0  # nor is an offer under way (set as one starts)
        assert reg.status().attempts_total == 0
        worker.ready = True
        assert reg.wait_for(State.REGISTERED, 30)
        assert gateway.ready_urls() == [worker.url]
        worker.ready = False  # lost for longer than the grace: withdrawn
        assert wait_until(lambda: reg.state is State.REGISTERING, 30)
        assert reg.status().reregistrations == 1
        assert wait_until(lambda: (reg.status().last_error or "").startswith("not offered"), 10)
        assert wait_until(lambda: gateway.ready_urls() == [], 10)
        worker.ready = True  # back: offered again
        assert wait_until(lambda: gateway.ready_urls() == [worker.url], 60)
        assert reg.wait_for(State.REGISTERED, 30)
        assert duplicates(gateway) == []


def test_stop_drains_the_worker(
    gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]
) -> None:
    gateway = gateways().start()
    with workers(1) as (worker,):
        reg = fleet(gateway.url, worker).start()
        assert reg.wait_for(State.REGISTERED, 30)
        # stop() says it ended within its timeout (a bound that only catches a hang).
        assert reg.stop(timeout=30)
        assert gateway.workers() == []  # gone before stop() returned


def test_two_gateways_one_down(
    gateways: Callable[..., Gateway], fleet: Callable[..., Registrar]
) -> None:
    up, down = gateways().start(), gateways()
    with workers(1) as (worker,):
        first = fleet(up.url, worker).start()
        second = fleet(down.url, worker).start()
        assert first.wait_for(State.REGISTERED, 30)
        assert wait_until(lambda: second.status().attempts_total >= 2, 10)
        assert second.state is State.REGISTERING
        assert second.status().server_reachable is False
        down.start()
        assert second.wait_for(State.REGISTERED, 30)
        assert up.ready_urls() == [worker.url]
        assert down.ready_urls() == [worker.url]


def test_the_control_plane_key(
    gateways: Callable[..., Gateway],
    fleet: Callable[..., Registrar],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = gateways(keys=("right-key-0123",)).start()
    key_file = tmp_path / "key"
    key_file.write_text("right-key-0123\n")
    with workers(2) as (good, bad):
        allowed = fleet(gateway.url, good, key_file=str(key_file)).start()
        refused = fleet(gateway.url, bad, key="wrong-key-4567", on_failure="stop").start()
        assert allowed.wait_for(State.REGISTERED, 30)
        assert refused.wait_for(State.FAILED, 30)
        error = refused.status().last_error or ""
        assert "401" in error
        assert "control-plane key" in error
        assert gateway.ready_urls() == [good.url]
        stop_all([allowed, refused])
    assert "right-key-0123" not in caplog.text
    assert "wrong-key-4567" not in caplog.text


def health_url(agent: subprocess.Popen[str]) -> str:
    """The health server's URL, from the agent's startup line (it bound port 0)."""
    assert agent.stderr is not None
    for _ in range(50):
        line = agent.stderr.readline()
        found = re.search(r"health on (http://[0-9.:]+)/readyz", line)
        if found:
            return found.group(1)
    raise AssertionError("the agent never said where its health server listens")


def test_the_command_with_two_gateways_one_down(
    gateways: Callable[..., Gateway], spawn: Callable[..., subprocess.Popen[str]]
) -> None:
    up, down = gateways().start(), gateways()
    with workers(1, "prefill") as (worker,):
        # --gateway repeated: one registration per gateway; variables fill the rest.
        agent = spawn(
            "register",
            "--gateway",
            up.url,
            "--gateway",
            down.url,
            "--worker-url",
            worker.url,
            "--worker-type",
            "prefill",
            "--bootstrap-port",
            str(worker.bootstrap_port),
            "--health-port",
            "0",
            env={"REGISTRAR_DRAIN_TIMEOUT": "10", "REGISTRAR_BACKOFF_MAX": "1"},
        )
        health = f"{health_url(agent)}/health"

        def document() -> dict[str, Any] | None:
            try:
                answer = requests.get(health, timeout=2)
            except requests.RequestException:
                return None
            return answer.json() if answer.status_code in (200, 503) else None

        assert wait_until(lambda: up.ready_urls() == [worker.url], 60)
        assert wait_until(lambda: (document() or {}).get("status") == "warn", 30)
        entries = (document() or {})["checks"]["registration:state"]
        assert {e["url"]: e["observedValue"] for e in entries} == {
            up.url: "registered",
            down.url: "registering",
        }
        status = subprocess.run(
            [sys.executable, "-m", "registrar", "status", "--health-url", health],
            capture_output=True,
            check=False,
            text=True,
            timeout=30,
            env=CLI_ENV,
        )
        assert status.returncode == 1  # not registered with every gateway
        assert status.stdout.count("registration:") == 2
        down.start()
        assert wait_until(lambda: down.ready_urls() == [worker.url], 60)
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=60)
        assert agent.returncode == 0, err
        assert up.workers() == []  # drained from both before the agent exited
        assert down.workers() == []
