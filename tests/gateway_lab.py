"""A real smg gateway process and stand-in workers it can add, for tests, benchmarks and demos
on 127.0.0.1 (never production).

`Gateway` runs `smg launch --pd-disaggregation` (the binary of the `smg` wheel; see
scripts/smg-venv.sh) and ends it by its PID (SIGKILL for a crash). smg cannot report the port it
bound, so a port is picked (by default by binding port 0, see `ephemeral_port`) and handed to it;
a first launch that loses that race is retried on a new port, a restart keeps its port.
`StandInWorker` answers what the gateway probes before it lists a worker (`/health`,
`/server_info`, `/model_info`, `/v1/models`, `/version`, `/loads`, `/metrics`) and SGLang's
`/ready`, and for a prefill listens on its bootstrap port.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import requests

__all__ = ["LOOPBACK", "Gateway", "StandInWorker", "ephemeral_port", "workers"]

LOOPBACK = "127.0.0.1"


def ephemeral_port() -> int:
    """A port nothing listens on right now (bind port 0, then close): another process may take
    it before smg binds it, which the retried first launch covers. A caller that can keep ports
    from others (a test suite under xdist) passes its own `ports`."""
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


class Gateway:
    """One smg gateway process on 127.0.0.1; `restart()` starts it again on the same port."""

    def __init__(
        self,
        binary: str,
        log_dir: Path,
        *,
        keys: tuple[str, ...] = (),
        port: int = 0,
        health_interval: int | None = 1,
        ports: Callable[[], int] = ephemeral_port,
    ) -> None:
        self.binary = binary
        self.ports = ports
        """Where the gateway's ports come from (the control plane's and Prometheus's)."""
        self.poll = 0.05
        """Seconds between looks while waiting for the control plane to answer."""
        self.health_interval = health_interval
        """Seconds between the gateway's health checks of each worker (None: its default)."""
        self.log_dir = log_dir
        self.keys = keys
        self.port = port or ports()
        self.proc: subprocess.Popen[bytes] | None = None
        self.launches = 0

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[0]}"} if self.keys else {}

    def start(self, timeout: float = 60.0) -> Gateway:
        """Launch and wait until the control plane answers. A first launch that loses its
        picked port to another process is tried again on a new one; a restart keeps its port
        (that is the point of it)."""
        first = self.proc is None and self.launches == 0
        for _ in range(5):
            self._launch()
            if self._wait_listening(timeout):
                return self
            self.kill()
            if first:
                self.port = self.ports()
        raise RuntimeError(f"smg did not start on {self.url}; see {self._log_path()}")

    def _log_path(self) -> Path:
        return self.log_dir / f"smg-{self.port}-{self.launches}.log"

    def _launch(self) -> None:
        self.launches += 1
        args = [
            self.binary,
            "launch",
            "--pd-disaggregation",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
            "--prometheus-host",
            LOOPBACK,
            "--prometheus-port",
            str(self.ports()),
            "--log-level",
            "warn",
        ]
        if self.health_interval is not None:
            # Probe a worker quickly, so a worker whose /health fails is found out in seconds.
            args += [
                "--health-check-interval-secs",
                str(self.health_interval),
                "--health-check-timeout-secs",
                "2",
            ]
        if self.keys:
            args += [
                "--control-plane-api-keys",
                *(f"k{i}:test:admin:{k}" for i, k in enumerate(self.keys)),
            ]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with self._log_path().open("wb") as log:
            self.proc = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def _wait_listening(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                answer = requests.get(f"{self.url}/workers", headers=self.headers(), timeout=2)
                if answer.status_code in (200, 401):
                    return True
            time.sleep(self.poll)
        return False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """End the gateway by its PID (SIGKILL: a crash) and reap it."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=15)

    def restart(self) -> None:
        self.kill()
        self.start()

    def workers(self) -> list[dict[str, Any]]:
        answer = requests.get(f"{self.url}/workers", headers=self.headers(), timeout=5)
        answer.raise_for_status()
        listed: list[dict[str, Any]] = answer.json()["workers"]
        return listed

    def ready_urls(self) -> list[str]:
        """URLs of listed workers that are ready (one per entry: duplicates show twice)."""
        return [
            w["url"]
            for w in self.workers()
            if w.get("status", "ready") == "ready" and w.get("is_healthy", True)
        ]

    def delete(self, url: str) -> None:
        """Remove the worker at `url` as an operator would (DELETE /workers/{id})."""
        for worker in self.workers():
            if worker["url"] == url:
                requests.delete(
                    f"{self.url}/workers/{worker['id']}", headers=self.headers(), timeout=5
                ).raise_for_status()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _WorkerHttp

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        worker = self.server.worker
        path = self.path.split("?", 1)[0]
        worker.count(path)
        if path in ("/health", "/health_generate"):
            self._answer(200 if worker.healthy else 503, {"status": "ok"})
        elif path == "/ready":
            self._answer(200 if worker.ready else 503, {"ready": worker.ready})
        elif path in ("/server_info", "/get_server_info"):
            self._answer(200, worker.server_info())
        elif path in ("/model_info", "/get_model_info"):
            self._answer(200, {"model_path": "stand-in", "is_generation": True})
        elif path == "/v1/models":
            self._answer(200, {"object": "list", "data": [{"id": "stand-in", "object": "model"}]})
        elif path == "/version":
            self._answer(200, {"version": "0.5.23"})
        elif path in ("/loads", "/get_load"):
            self._answer(200, {"loads": [], "num_reqs": 0})
        elif path == "/metrics":
            self._text(200, "# stand-in worker\n")
        else:
            self._answer(404, {"error": "not found"})

    def _answer(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, code: int, text: str) -> None:
        data = text.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _WorkerHttp(ThreadingHTTPServer):
    daemon_threads = True
    worker: StandInWorker


class StandInWorker:
    """A worker the gateway can add: `healthy` drives its /health (what the gateway probes),
    `ready` its /ready (what the registrar's readiness check reads)."""

    def __init__(self, worker_type: str = "decode") -> None:
        self.worker_type = worker_type
        self.healthy = True
        self.ready = True
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        self._http = _WorkerHttp((LOOPBACK, 0), _Handler)
        self._http.worker = self
        self.port: int = self._http.server_address[1]
        self._bootstrap: socket.socket | None = None
        self.bootstrap_port: int | None = None
        if worker_type == "prefill":
            self._bootstrap = socket.create_server((LOOPBACK, 0))
            self.bootstrap_port = self._bootstrap.getsockname()[1]
        self._threads: list[threading.Thread] = []

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def count(self, path: str) -> None:
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1

    def server_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_path": "stand-in",
            "served_model_name": "stand-in",
            "tokenizer_path": "stand-in",
            "dp_size": 1,
            "tp_size": 1,
            "version": "0.5.23",
            "disaggregation_mode": self.worker_type if self.worker_type != "regular" else "null",
        }
        if self.bootstrap_port is not None:
            info["disaggregation_bootstrap_port"] = self.bootstrap_port
        return info

    def start(self) -> StandInWorker:
        thread = threading.Thread(target=self._http.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        self._threads.append(thread)
        if self._bootstrap is not None:
            accept = threading.Thread(target=self._accept, daemon=True)
            accept.start()
            self._threads.append(accept)
        return self

    def _accept(self) -> None:
        sock = self._bootstrap
        while sock is not None:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.close()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        sock, self._bootstrap = self._bootstrap, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


@contextlib.contextmanager
def workers(count: int, worker_type: str = "decode") -> Iterator[list[StandInWorker]]:
    made = [StandInWorker(worker_type).start() for _ in range(count)]
    try:
        yield made
    finally:
        for worker in made:
            worker.close()
