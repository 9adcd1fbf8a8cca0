"""One deployment under test: a prefill and a decode `launch_server`, the `smg` router in front,
requests sent through the router all along, and what every health endpoint says at each step.

`Stack(registrar=True)` loads registrar's plugin in every SGLang process; `registrar=False`
filters it out through `SGLANG_PLUGINS`: stock SGLang 0.5.23.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from support import process_port

from .deploy import (
    HOST,
    Deployment,
    Node,
    Process,
    control,
    read_control,
    server_env,
    wait_http,
)
from .lines import assert_plugin_lines
from .netns import Nodes

__all__ = ["PROMPTS", "Probe", "Sample", "Stack", "generate"]

PROMPTS = ("w1 w2 w3 w4", "w10 w20 w30 w40 w50 w60", "w7 w7 w7", "w123 w456 w789 w5 w6 w8 w9")
SERVE_TIMEOUT = 420.0
"""How long a server may take to start here (2 shared cores: 40-90 s is usual)."""


def generate(url: str, text: str = PROMPTS[0], timeout: float = 30.0) -> tuple[int | None, str]:
    """One greedy /generate; the status (None for no answer) and the text or error."""
    body = {"text": text, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}
    try:
        answer = requests.post(f"{url}/generate", json=body, timeout=timeout)
    except requests.RequestException as exc:
        return None, type(exc).__name__
    if answer.status_code == 200:
        with contextlib.suppress(ValueError):
            return 200, str(answer.json()["text"])
    return answer.status_code, answer.text[:300]


@dataclass(frozen=True)
class Sample:
    """One request through the router: when it was sent (seconds from the probe's zero), its
    status and whether it was served."""

    t: float
    done: float
    status: int | None
    ok: bool
    detail: str


class Probe:
    """Requests through the router one after another until stopped (timeline of a scenario)."""

    def __init__(self, url: str, zero: float, gap: float = 0.5) -> None:
        self.url = url
        self.zero = zero
        self.gap = gap
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        while not self._stop.is_set():
            sent = time.monotonic()
            status, detail = generate(self.url, timeout=25.0)
            ok = status == 200 and bool(detail.strip())
            sent_at, done_at = round(sent - self.zero, 2), round(time.monotonic() - self.zero, 2)
            self.samples.append(Sample(sent_at, done_at, status, ok, detail[:160]))
            self._stop.wait(self.gap)

    def first_ok(self, after: float = float("-inf")) -> Sample | None:
        """The first request served that was answered after `after`."""
        return next((s for s in list(self.samples) if s.ok and s.done >= after), None)

    def wait_ok(self, timeout: float, after: float = float("-inf")) -> Sample | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = self.first_ok(after)
            if found is not None:
                return found
            time.sleep(0.2)
        return self.first_ok(after)

    def since(self, t: float) -> list[Sample]:
        """The requests answered after `t`."""
        return [s for s in list(self.samples) if s.done >= t]


@dataclass
class Record:
    """What one scenario measured, for the report (docs/e2e.md and its picture)."""

    scenario: str
    registrar: bool
    events: dict[str, float] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    health: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Stack:
    """A prefill/decode deployment with the router in front, all started on free ports; the
    prefill on `tp` ranks, on one node or, given `nodes` (the test already inside node 0's
    namespace), half of them on each of two; the decode on `decode_tp`, on node 0."""

    def __init__(
        self,
        registrar: bool,
        model: Path,
        logs: Path,
        tp: int = 1,
        decode_tp: int = 1,
        nodes: Nodes | None = None,
        bind: str | None = None,
        node_1_dist_host: str | None = None,
        node_1_rank_ip: str | None = None,
    ) -> None:
        """Scenario 5's mistakes: `bind`, node 0's `--host` when not its address;
        `node_1_dist_host`, the `--dist-init-addr` host node 1 is given when not node 0's;
        `node_1_rank_ip`, node 1's `SGLANG_HOST_IP` (the address its rank publishes) when not
        its own."""
        self.registrar = registrar
        self.tp = tp
        self.decode_tp = decode_tp
        self.logs = logs
        self.nodes = nodes
        self.host = HOST if nodes is None else nodes.addresses[0]
        self.deploy = Deployment(model, logs, bind or self.host)
        self.dist_hosts = (self.host, node_1_dist_host or self.host)
        self.node_1_rank_ip = node_1_rank_ip
        self.prefill_port = process_port(self.host)
        self.bootstrap_port = process_port(self.host)
        self.decode_port = process_port(self.host)
        self.router_port = process_port(self.host)
        self.dist_port = process_port(self.host)
        self.prefill: Process | None = None
        """The prefill's node 0 (its HTTP server and bootstrap server)."""
        self.prefill_nodes: list[Process] = []
        """Every prefill node, node 0 first."""
        self.decode: Process | None = None
        self.router: Process | None = None
        self.single: Process | None = None
        """A reference server without disaggregation, when `start(single=True)`."""
        self.control_url = ""
        self.decode_control_urls: list[str] = []
        """One control server per decode rank (its scheduler process), rank 0 first."""
        self.launches = 0

    # ------------------------------------------------------------ starting and stopping

    def start(self, *, hold: bool, single: bool = False, refuse_tp: int | None = None) -> None:
        """Decode and prefill (its bootstrap server held if `hold`, refusing the PUTs of TP rank
        `refuse_tp` until admitted) at once, and a single reference server beside them if asked;
        then the router once they answer."""
        if single:
            self.single = self.deploy.single(process_port(), server_env(plugin=False))
        decode_dir = self.logs / "control-decode"
        decode_dir.mkdir()
        env = server_env(plugin=self.registrar, control_dir=decode_dir, host=self.host)
        self.decode = self.deploy.decode(self.decode_port, env, tp=self.decode_tp)
        self.launch_prefill(hold=hold, refuse_tp=refuse_tp)
        with ThreadPoolExecutor(3) as pool:
            waits = [
                pool.submit(wait_http, p, "/health", SERVE_TIMEOUT)
                for p in (self.prefill, self.decode, self.single)
                if p is not None
            ]
            for wait in waits:
                wait.result()
        assert self.prefill is not None
        assert self.decode is not None
        self.assert_prefill_lines()
        assert_plugin_lines(self.decode, plugin=self.registrar)
        self.decode_control_urls = [
            read_control(self.decode, decode_dir, f"decode-{rank}" if rank else "decode")
            for rank in range(self.decode_tp)
        ]
        self.router = self.deploy.router(
            self.router_port, (self.prefill.url, self.bootstrap_port, self.decode.url)
        )
        self.wait_router_ready()

    def launch_prefill(self, *, hold: bool, refuse_tp: int | None = None) -> Process:
        control_dir = self.logs / f"control-{self.launches}"
        control_dir.mkdir()
        self.launches += 1
        env = server_env(plugin=self.registrar, control_dir=control_dir, host=self.host)
        if hold:
            env["E2E_BOOTSTRAP_HOLD"] = "1"
        if refuse_tp is not None:
            env["E2E_BOOTSTRAP_REFUSE_TP"] = str(refuse_tp)
        if self.nodes is None:
            self.prefill = self.deploy.prefill(
                self.prefill_port, self.bootstrap_port, env, tp=self.tp
            )
            self.prefill_nodes = [self.prefill]
        else:
            self.prefill_nodes = [self._launch_node(rank, env) for rank in (0, 1)]
            self.prefill = self.prefill_nodes[0]
        self.control_url = read_control(self.prefill, control_dir)
        return self.prefill

    def _launch_node(self, rank: int, env: dict[str, str]) -> Process:
        """Prefill node `rank` of two (`--nnodes 2`, gloo on the node's veth: without
        `GLOO_SOCKET_IFNAME` it dials the address the host name resolves to, 127.0.0.1)."""
        assert self.nodes is not None
        group = (
            "--nnodes", "2", "--node-rank", str(rank),
            "--dist-init-addr", f"{self.dist_hosts[rank]}:{self.dist_port}",
        )  # fmt: skip
        link = {"GLOO_SOCKET_IFNAME": self.nodes.links[rank]}
        if rank == 0:
            env = {**env, **link}
            return self.deploy.prefill(
                self.prefill_port, self.bootstrap_port, env, group, tp=self.tp
            )
        host = self.nodes.addresses[rank]
        node_env = server_env(plugin=self.registrar, host=self.node_1_rank_ip or host, **link)
        node = Node(rank, host, self.nodes.on_node_1([]))
        return self.deploy.prefill(
            self.prefill_port, self.bootstrap_port, node_env, group, tp=self.tp, node=node
        )

    def relaunch_prefill(self, *, kill: bool) -> Process:
        """End the prefill, every node of it as a group controller would (SIGKILL to each
        process group for a crash, else SIGTERM), and launch it again on the same ports, its
        bootstrap server not held."""
        for node in self.prefill_nodes:
            if kill:
                node.kill()
            else:
                node.stop()
        return self.launch_prefill(hold=False)

    def wait_prefill_up(self, every: float = 0.5) -> None:
        assert self.prefill is not None
        wait_http(self.prefill, "/health", SERVE_TIMEOUT, every=every)
        self.assert_prefill_lines()

    def assert_prefill_lines(self) -> None:
        """The plugin's lines in every prefill node's log: its rows' share on each."""
        for node in self.prefill_nodes:
            rows = self.tp // len(self.prefill_nodes)
            assert_plugin_lines(node, plugin=self.registrar, rows=rows)

    def prefill_text(self) -> str:
        """The logs of every prefill node, node 0 first."""
        return "".join(node.text() for node in self.prefill_nodes)

    def wait_router_ready(self, timeout: float = 120.0) -> None:
        assert self.router is not None
        wait_http(self.router, "/readiness", timeout)

    def stop(self) -> None:
        self.deploy.stop_all()

    # ------------------------------------------------------------ looking

    @property
    def router_url(self) -> str:
        assert self.router is not None
        return self.router.url

    def bootstrap(self, action: str | None = None) -> dict[str, Any]:
        return control(self.control_url, action)

    def decode_heartbeat(self, action: str | None = None) -> dict[str, Any]:
        """The action on every decode rank's heartbeat; decode rank 0's state."""
        states = [control(url, action) for url in self.decode_control_urls]
        return states[0]

    def decode_states(self) -> list[dict[str, Any]]:
        """Each decode rank's cached prefill rows and heartbeat setting."""
        return [control(url) for url in self.decode_control_urls]

    def health(self, step: str) -> dict[str, Any]:
        """What each health endpoint says now."""
        assert self.prefill is not None
        assert self.decode is not None
        assert self.router is not None
        row: dict[str, Any] = {"step": step}
        for name, url, path in (
            ("prefill /health", self.prefill.url, "/health"),
            ("prefill /ready", self.prefill.url, "/ready"),
            ("decode /health", self.decode.url, "/health"),
            ("router /readiness", self.router.url, "/readiness"),
        ):
            row[name] = _status(url + path)
        row["registrar in /server_info"] = self._registrar_status()
        return row

    def _registrar_status(self) -> str:
        assert self.prefill is not None
        try:
            info = requests.get(self.prefill.url + "/server_info", timeout=10).json()
        except (requests.RequestException, ValueError):
            return "no answer"
        states = [
            row.get("state")
            for internal in info.get("internal_states") or []
            for row in (internal.get("registrar") or {}).get("rows", [])
        ]
        boot = info.get("registrar_bootstrap")
        if not states and boot is None:
            return "absent"
        parts = [f"rank {', '.join(str(s) for s in states)}"] if states else []
        if boot is not None and boot.get("missing_count") is None:
            parts.append("bootstrap server: no row yet")
        elif boot is not None:
            missing, expected = boot["missing_count"], boot["expected_rows"]
            parts.append(f"bootstrap server: {missing} of {expected} rows missing")
        return "; ".join(parts)

    def log_since(self, process: Process, pattern: str, start: int = 0) -> list[str]:
        return [m for m in re.findall(pattern, process.text()[start:])]


def _status(url: str) -> str:
    try:
        return str(requests.get(url, timeout=10).status_code)
    except requests.RequestException as exc:
        return type(exc).__name__
