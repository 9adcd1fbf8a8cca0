"""The servers of a prefill/decode deployment, as a user launches them: SGLang's own
`launch_server` for the prefill, the decode and a single reference server, and the `smg` router
in front, all on 127.0.0.1 on ports from the test worker's own block (`support.process_port`).
Every process is started in a session of its own and stopped by its process group (SGLang's
children are in it).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from support import process_port

__all__ = [
    "CPU_FLAGS",
    "Deployment",
    "Node",
    "Process",
    "server_env",
]

HOST = "127.0.0.1"
E2E = Path(__file__).resolve().parent.parent
TESTS = E2E.parent
ROOT = TESTS.parent
BOOT = E2E / "e2e_support" / "boot"

CPU_FLAGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--max-total-tokens", "4096",
    "--skip-server-warmup",
    "--sleep-on-idle",
)  # fmt: skip
"""What SGLang 0.5.23 needs to serve on a CPU (see the issue on this suite and docs/e2e.md)."""

PD_FLAGS = ("--disaggregation-transfer-backend", "mooncake")

TIMEOUTS = {
    # A request whose handshake cannot happen fails in 20 s instead of SGLang's 300 s, so the
    # suite sees an answer; no recovery path depends on it. SGLANG_DISAGGREGATION_WAITING_TIMEOUT
    # keeps its 300 s: a request that times out waiting for its KV cache makes the decode forget
    # the prefill's cached addresses, stock SGLang's only way out of scenario 3.
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20",
}


def server_env(
    *, plugin: bool, control_dir: Path | None = None, host: str = HOST, **extra: str
) -> dict[str, str]:
    """The environment of an SGLang server: CPU engine, Mooncake over TCP, the test-only start-up
    module first on PYTHONPATH, registrar from this checkout, and registrar's plugin loaded or
    filtered out through SGLang's own `SGLANG_PLUGINS`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRAR_", "E2E_"))}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BOOT), str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.update(
        SGLANG_USE_CPU_ENGINE="1",
        # Every address SGLang and Mooncake publish (rank_ip, the engine's hostname) on the
        # host's own: loopback, or a node's address inside its namespace.
        SGLANG_HOST_IP=host,
        MC_FORCE_TCP="1",
        MOONCAKE_PROTOCOL="tcp",
        SGLANG_PLUGINS="registrar" if plugin else "none-registrar-filtered-out",
        **TIMEOUTS,
    )
    if control_dir is not None:
        env["E2E_CONTROL_DIR"] = str(control_dir)
    env.update(extra)
    return env


@dataclass(frozen=True)
class Node:
    """A prefill node other than the test's own host: its node rank, address and the command
    prefix that runs a process there."""

    rank: int
    host: str
    prefix: list[str]


@dataclass
class Process:
    """One launched server: its command, log and process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    url: str = ""
    started: float = field(default_factory=time.monotonic)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 6000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL to what is left after `grace` seconds."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # children left behind by the leader
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)

    def kill(self) -> None:
        """SIGKILL to the whole group at once: a crash, nothing cleans up."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)


class Deployment:
    """The processes of one test: launched, waited for, and all stopped at the end."""

    def __init__(self, model: Path, logs: Path, host: str = HOST) -> None:
        self.model = model
        self.logs = logs
        self.host = host
        self.processes: list[Process] = []

    def _launch(self, name: str, cmd: list[str], env: dict[str, str], url: str) -> Process:
        log = self.logs / f"{name}-{len(self.processes)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.logs,
                start_new_session=True,
            )
        process = Process(name, proc, log, url)
        self.processes.append(process)
        return process

    def sglang(
        self,
        name: str,
        port: int,
        flags: list[str],
        env: dict[str, str],
        tp: int = 1,
        node: Node | None = None,
    ) -> Process:
        """`launch_server` on `port`; with `tp` > 1 one scheduler process per rank, each rank's
        OpenMP threads bound to a core of its own (`SGLANG_CPU_OMP_THREADS_BIND`, 0|1 for 2,
        indexed by the global rank, so every node gets the whole list). On another `node`, its
        address and command prefix (`netns.Nodes`)."""
        host, prefix = (self.host, []) if node is None else (node.host, node.prefix)
        parallel: list[str] = []
        if tp > 1:
            parallel = ["--tp", str(tp)]
            env = {"SGLANG_CPU_OMP_THREADS_BIND": "|".join(map(str, range(tp))), **env}
        cmd = [
            *prefix, sys.executable, "-m", "sglang.launch_server",
            "--model-path", str(self.model),
            "--host", host, "--port", str(port),
            *CPU_FLAGS, *parallel, *flags,
        ]  # fmt: skip
        return self._launch(name, cmd, env, f"http://{host}:{port}")

    def prefill(
        self,
        port: int,
        bootstrap_port: int,
        env: dict[str, str],
        extra: tuple[str, ...] = (),
        tp: int = 1,
        node: Node | None = None,
    ) -> Process:
        flags = [
            *PD_FLAGS,
            "--disaggregation-mode", "prefill",
            "--disaggregation-bootstrap-port", str(bootstrap_port),
            # Overlap on makes a prefix-cache hit create a torch.cuda.Event.
            "--disable-overlap-schedule",
            *extra,
        ]  # fmt: skip
        name = "prefill" if node is None else f"prefill-node-{node.rank}"
        return self.sglang(name, port, flags, env, tp, node)

    def decode(
        self, port: int, env: dict[str, str], extra: tuple[str, ...] = (), tp: int = 1
    ) -> Process:
        flags = [
            *PD_FLAGS,
            "--disaggregation-mode", "decode",
            # The default backup pins host memory through CUDA.
            "--disaggregation-decode-retraction-backup", "cpu_tensor",
            *extra,
        ]  # fmt: skip
        return self.sglang("decode", port, flags, env, tp)

    def single(self, port: int, env: dict[str, str]) -> Process:
        return self.sglang("single", port, ["--disable-overlap-schedule"], env)

    def router(
        self,
        port: int,
        workers: tuple[str, int, str] | None = None,
        *,
        prefills: tuple[tuple[str, int], ...] = (),
        decodes: tuple[str, ...] = (),
    ) -> Process:
        """The smg router on `port`; `workers` = (prefill URL, its bootstrap port, decode URL)
        as static workers, or None for a router that starts empty (workers added through its
        control plane). More static workers: `prefills` ((URL, bootstrap port), ...) and
        `decodes` (URL, ...)."""
        smg = shutil.which("smg", path=str(Path(sys.executable).parent))
        if smg is None:
            raise AssertionError(f"no smg beside {sys.executable}: rebuild scripts/sglang-venv.sh")
        if workers is not None:
            prefill, bootstrap_port, decode = workers
            prefills, decodes = ((prefill, bootstrap_port), *prefills), (decode, *decodes)
        static = [a for url, b in prefills for a in ("--prefill", url, str(b))]
        static += [a for url in decodes for a in ("--decode", url)]
        cmd = [
            smg, "launch", "--pd-disaggregation", *static,
            "--host", self.host, "--port", str(port),
            # The timeline shows the servers, not the router's own retry and breaker policy, and
            # the router looks at its workers every 2 s instead of every 30 s / 60 s.
            "--disable-retries", "--disable-circuit-breaker",
            "--worker-startup-check-interval", "1", "--health-check-interval-secs", "2",
            "--prometheus-host", self.host, "--prometheus-port", str(process_port(self.host)),
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith(("REGISTRAR_", "E2E_"))}
        return self._launch("router", cmd, env, f"http://{self.host}:{port}")

    def stop_all(self) -> None:
        for process in reversed(self.processes):
            process.stop()


def wait_http(
    process: Process, path: str, timeout: float, ok: int = 200, every: float = 0.5
) -> float:
    """Wait until `GET path` answers `ok` (asked every `every` seconds); the seconds since the
    process was launched."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            code = process.proc.returncode
            raise AssertionError(f"{process.name} exited ({code}):\n{process.tail()}")
        with contextlib.suppress(requests.RequestException):
            if requests.get(process.url + path, timeout=5).status_code == ok:
                return time.monotonic() - process.started
        time.sleep(every)
    raise AssertionError(f"{process.name}: no {ok} on {path} in {timeout} s:\n{process.tail()}")


def read_control(
    process: Process, control_dir: Path, role: str = "bootstrap", timeout: float = 420.0
) -> str:
    """The URL of a test-only control server inside a launched server (e2e_support/inside.py):
    the bootstrap server's in the prefill's HTTP process, the decode's in its scheduler."""
    path = control_dir / f"{role}-control.json"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            code = process.proc.returncode
            raise AssertionError(f"{process.name} exited ({code}):\n{process.tail()}")
        if path.exists():
            return f"http://{HOST}:{json.loads(path.read_text())['port']}"
        time.sleep(0.2)
    raise AssertionError(f"no {role} control server in {timeout} s ({path})")


def control(url: str, action: str | None = None) -> dict[str, Any]:
    """GET a control server's state, or POST an action to it."""
    if action is None:
        answer = requests.get(url, timeout=30)
    else:
        answer = requests.post(f"{url}/{action}", timeout=60)
    answer.raise_for_status()
    result: dict[str, Any] = answer.json()
    return result
