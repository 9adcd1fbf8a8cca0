"""Scenario r1 (issue 36 scenario 6, docs/e2e.md "Rolling restart behind smg"): two TP 2
prefills and two decodes behind the smg router, each server restarted in turn as Kubernetes
rolls a deployment (SIGTERM to its main process, wait for it to exit, launch it again on the
same ports, wait until the router routes to it again, then the next) under a stream of
requests through the router.

With registrar the router starts empty: every server keeps itself listed through
`REGISTRAR_GATEWAY` and at SIGTERM drains from the router before SGLang stops serving. Stock
SGLang has no such registration: the router gets the four as static workers and learns of a
restart only from its own health checks.

The router's side (`drain`, `wait_listed`, ...) is scenario 6's: e2e_support/gateway.py.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from support import process_port

from .deploy import HOST, Deployment, Process, control, read_control, server_env, wait_http
from .gateway import DRAIN_TIMEOUT, checked, drain, listed, no_duplicates, wait_listed
from .lines import assert_plugin_lines
from .scenarios import _failures
from .stack import SERVE_TIMEOUT, Probe, Record

__all__ = ["DECODE_TP", "PREFILL_TP", "Rolling", "rolling_restart"]

PREFILL_TP = 2
DECODE_TP = 1
"""TP 1 decodes: the TP 2 decode is t2's subject, and on 2 shared cores every launch of a
TP 2 decode would add its second scheduler to a restart that is timed."""
SERVING_BOUND = 120.0
"""Within this the deployment must serve once every server is listed (2 loaded cores)."""
UNREADY_PATIENCE = 30.0
"""Stock: how long after the server's exit the static router is watched for marking it not
ready (its health checks every 2 s)."""
ROWS = {f"dp 0 cp 0 tp {tp} pp 0" for tp in range(PREFILL_TP)}
"""The bootstrap table's rows of a TP 2 prefill, as inside.py names them."""


@dataclass
class Server:
    """One of the four servers, launched again on the same ports after each SIGTERM."""

    name: str
    port: int
    bootstrap_port: int | None = None
    """A prefill's; None for a decode."""
    process: Process | None = None
    control_dir: Path | None = None
    puts: list[dict[str, int]] = field(default_factory=list)
    """A prefill's accepted PUTs per rank, one dict per lifetime (each launch)."""

    @property
    def role(self) -> str:
        return "decode" if self.bootstrap_port is None else "prefill"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def running(self) -> Process:
        assert self.process is not None
        return self.process


class Rolling:
    """The router and the four servers of r1, stock or with registrar."""

    def __init__(self, deploy: Deployment, registrar: bool) -> None:
        self.deploy = deploy
        self.registrar = registrar
        self.router_port = process_port()
        self.router: Process | None = None
        self.servers = [
            Server("prefill-1", process_port(), process_port()),
            Server("prefill-2", process_port(), process_port()),
            Server("decode-1", process_port()),
            Server("decode-2", process_port()),
        ]

    @property
    def router_url(self) -> str:
        return f"http://{HOST}:{self.router_port}"

    @property
    def urls(self) -> set[str]:
        return {s.url for s in self.servers}

    # ------------------------------------------------------------ starting

    def start(self) -> None:
        """With registrar: the router empty first, then the four, listed by their plugin.
        Stock: the four, then the router with them as static workers."""
        if self.registrar:
            self.router = self.deploy.router(self.router_port)
            wait_http(self.router, "/workers", 60)
        for server in self.servers:
            self.launch(server)
        for server in self.servers:
            self.wait_up(server)
        if not self.registrar:
            prefills = tuple((s.url, s.bootstrap_port) for s in self.servers if s.bootstrap_port)
            decodes = tuple(s.url for s in self.servers if s.bootstrap_port is None)
            self.router = self.deploy.router(self.router_port, prefills=prefills, decodes=decodes)
        wait_listed(self.router_url, self.urls, SERVE_TIMEOUT)
        assert sorted(no_duplicates(self.router_url)) == sorted(self.urls)

    def launch(self, server: Server) -> Process:
        """`launch_server` for `server` on its ports; a prefill with a control dir of its own per
        launch (its bootstrap server's accepted PUTs, e2e_support/inside.py)."""
        extra: dict[str, str] = {}
        if self.registrar:
            extra = {
                "REGISTRAR_GATEWAY": self.router_url,
                "REGISTRAR_DRAIN_TIMEOUT": str(DRAIN_TIMEOUT),
            }
        if server.bootstrap_port is None:
            env = server_env(plugin=self.registrar, **extra)
            process = self.deploy.decode(server.port, env, tp=DECODE_TP)
        else:
            server.control_dir = self.deploy.logs / f"control-{server.name}-{len(server.puts)}"
            server.control_dir.mkdir()
            env = server_env(plugin=self.registrar, control_dir=server.control_dir, **extra)
            process = self.deploy.prefill(server.port, server.bootstrap_port, env, tp=PREFILL_TP)
        process.name = server.name
        server.process = process
        return process

    def wait_up(self, server: Server) -> float:
        """Until the server's /health is 200; its plugin lines checked. The time it happened."""
        process = server.running
        up = process.started + wait_http(process, "/health", SERVE_TIMEOUT)
        rows = PREFILL_TP if server.bootstrap_port is not None else 0
        assert_plugin_lines(process, plugin=self.registrar, rows=rows)
        if self.registrar:  # one offer per launch (docs/sglang.md, "The smg gateway")
            offering = f"offering {server.url} ({server.role}) to the gateway "
            assert process.text().count(offering) == 1, process.tail()
        return up

    # ------------------------------------------------------------ looking

    def read_puts(self, server: Server) -> dict[str, int]:
        """The accepted PUTs per rank of the prefill's current bootstrap server (one per
        process: nothing here restarts it), appended to the server's lifetimes."""
        assert server.control_dir is not None
        url = read_control(server.running, server.control_dir, timeout=30)
        lifetimes = control(url)["lifetimes"]
        assert len(lifetimes) == 1, lifetimes
        puts: dict[str, int] = lifetimes[0]["puts"]
        server.puts.append(puts)
        return puts

    def ready(self, url: str) -> bool:
        return any(
            w["url"].rstrip("/") == url and w.get("status") == "ready"
            for w in listed(self.router_url)
        )

    # ------------------------------------------------------------ restarting

    def stop_stock(self, server: Server, record: Record) -> None:
        """SIGTERM to the server's main process, no plugin: when it exits, and when the static
        router stops listing it ready (its health checks), if within UNREADY_PATIENCE after."""
        process = server.running
        sent = time.monotonic()
        os.kill(process.proc.pid, signal.SIGTERM)
        unready = exited = None
        deadline = sent + 120
        while time.monotonic() < deadline:
            now = time.monotonic()
            if exited is None and not process.alive():
                exited, deadline = now, now + UNREADY_PATIENCE
            if unready is None and not self.ready(server.url):
                unready = now
            if unready is not None and exited is not None:
                break
            time.sleep(0.1)
        assert exited is not None, f"{server.name} still running 120 s after SIGTERM"
        record.figures[f"{server.name}: SIGTERM to not listed ready (s)"] = (
            "never" if unready is None else round(unready - sent, 2)
        )
        record.figures[f"{server.name}: SIGTERM to exit (s)"] = round(exited - sent, 2)

    def stop_drained(self, server: Server, record: Record) -> None:
        """SIGTERM to the server's main process with the plugin: scenario 6's drain (gone from
        the router's list while it still answers, its `drained from 1 gateway in` line)."""
        process = server.running
        sent = time.monotonic()
        drain(self.router_url, process, record)
        exited = time.monotonic()
        delisted = record.figures.pop(f"drain_{process.name}_s")
        record.figures[f"{server.name}: SIGTERM to not listed ready (s)"] = delisted
        record.figures[f"{server.name}: SIGTERM to exit (s)"] = round(exited - sent, 2)

    def restart(self, server: Server, record: Record, zero: float) -> None:
        """One step of the rolling restart: SIGTERM, exit, relaunch on the same ports, listed
        ready again (every other server still listed, none twice)."""
        if server.bootstrap_port is not None:
            self.read_puts(server)  # the lifetime that ends now
        record.events[f"{server.name} SIGTERM"] = round(time.monotonic() - zero, 2)
        if self.registrar:
            self.stop_drained(server, record)
        else:
            self.stop_stock(server, record)
        server.running.stop()  # anything of its process group left behind
        process = self.launch(server)
        up = self.wait_up(server)
        listed = wait_listed(self.router_url, {server.url}, SERVE_TIMEOUT)
        record.events[f"{server.name} listed"] = round(listed - zero, 2)
        figures = record.figures
        figures[f"{server.name}: relaunch to /health (s)"] = round(up - process.started, 2)
        figures[f"{server.name}: relaunch to listed ready (s)"] = round(listed - process.started, 2)
        wait_listed(self.router_url, self.urls, SERVE_TIMEOUT)
        assert sorted(no_duplicates(self.router_url)) == sorted(self.urls)


def rolling_restart(deploy: Deployment, registrar: bool, record: Record) -> None:
    """r1: the four started and serving, then each restarted in turn under the probe's
    requests (0.5 s apart). With registrar every request must be served."""
    rolling = Rolling(deploy, registrar)
    rolling.start()
    begun = time.monotonic()
    zero = begun
    with Probe(rolling.router_url, begun) as probe:
        try:
            first = probe.wait_ok(SERVING_BOUND)
            assert first is not None, f"not serving before the restarts: {probe.samples[-3:]}"
            zero = time.monotonic()
            for server in rolling.servers:
                rolling.restart(server, record, zero)
            if registrar:  # every registration checked the router again since: none added twice
                checked(tuple(s.running for s in rolling.servers), times=1)
            else:
                time.sleep(5)
            assert sorted(no_duplicates(rolling.router_url)) == sorted(rolling.urls)
        finally:  # a run stopped half-way (a bound, the module's timeout) keeps its requests
            _record(record, probe, zero - begun)
    for server in rolling.servers:
        if server.bootstrap_port is not None:
            rolling.read_puts(server)
    record.figures["accepted PUTs per rank per lifetime"] = "; ".join(
        f"{s.name} {[sorted(p.values()) for p in s.puts]}"
        for s in rolling.servers
        if s.bootstrap_port is not None
    )
    assert record.figures["requests sent during the restarts"] > 0
    if registrar:
        assert record.figures["requests failed"] == 0, record.figures["failures"]
        for server in rolling.servers:
            for puts in server.puts:  # one accepted PUT per rank per lifetime
                assert puts == dict.fromkeys(ROWS, 1), f"{server.name}: {server.puts}"


def _record(record: Record, probe: Probe, zero: float) -> None:
    """The requests (times from the first SIGTERM) and their count, failed or not."""
    samples = list(probe.samples)
    record.samples = [
        asdict(s) | {"t": round(s.t - zero, 2), "done": round(s.done - zero, 2)} for s in samples
    ]
    record.figures["requests sent"] = len(samples)
    record.figures["requests sent during the restarts"] = sum(s.t >= zero for s in samples)
    record.figures["requests failed"] = sum(not s.ok for s in samples)
    record.figures["failures"] = _failures(probe, float("-inf"))
