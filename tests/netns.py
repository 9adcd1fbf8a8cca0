"""Real hosts on one machine: two network namespaces joined by a veth pair.

The bootstrap server runs in a subprocess inside the server namespace (`ip netns exec`); the
registrars run in this process, in threads that entered the client namespace (a thread's
network namespace is its own on Linux, and threads it starts inherit it). Nothing touches the
host's interfaces or routes: both ends of the link and their addresses live inside namespaces
this module created, and `close()` deletes them (and the server process, by PID) whatever
happened.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

CLIENT_IP = "10.199.0.1"
SERVER_IP = "10.199.0.2"
SERVER_PORT = 8998
_CLONE_NEWNET = 0x40000000
_counter = itertools.count()
_libc = ctypes.CDLL(None, use_errno=True)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=10)


def unavailable() -> str | None:
    """Why namespaces cannot be made here, or None when they can."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (apt-get install iproute2)"
    if os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    name = f"rgprobe{os.getpid()}"
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", name, check=False)
    return None


def netem_unavailable() -> str | None:
    """Why `tc qdisc ... netem` cannot be used here, or None when it can."""
    if shutil.which("tc") is None:
        return "iproute2's `tc` is not installed"
    name = f"rgnetem{os.getpid()}"
    _ip("netns", "add", name)
    try:
        probe = subprocess.run(
            [
                "ip",
                "netns",
                "exec",
                name,
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "netem",
                "delay",
                "1ms",
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=10,
        )
    finally:
        _ip("netns", "del", name, check=False)
    if probe.returncode == 0:
        return None
    release = os.uname().release
    modules = f"/lib/modules/{release}"
    where = (
        f"and {modules} does not exist, so sch_netem cannot be loaded"
        if not os.path.isdir(modules)
        else "(load it with `modprobe sch_netem`)"
    )
    return (
        f"tc netem is unavailable: the kernel {release} has no sch_netem qdisc "
        f"(tc: {probe.stderr.strip()!r}) {where}"
    )


@contextlib.contextmanager
def entered(namespace: str) -> Iterator[None]:
    """Run the calling thread (and the threads it starts meanwhile) in `namespace`."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
        try:
            if _libc.setns(target, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns into {namespace} failed")
        finally:
            os.close(target)
        try:
            yield
        finally:
            if _libc.setns(home, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home failed")
    finally:
        os.close(home)


def run_in(namespace: str, fn: Callable[[], T]) -> T:
    """`fn()` in a short-lived thread inside `namespace`."""
    result: list[T] = []
    errors: list[BaseException] = []

    def body() -> None:
        try:
            with entered(namespace):
                result.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=body, name=f"in-{namespace}", daemon=True)
    thread.start()
    thread.join(30)
    if errors:
        raise errors[0]
    if not result:
        raise TimeoutError(f"call in {namespace} did not finish")
    return result[0]


_SERVER_SCRIPT = r"""
import json, sys
from bootstrap_lab import BootstrapLab
server = BootstrapLab(sys.argv[1], int(sys.argv[2])).start()
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "puts":
        answer = [r.rank_port for r in server.records() if r.method == "PUT"]
    elif command == "count":
        answer = server.registered_count
    elif command == "records":
        answer = [[r.method, r.path, r.status] for r in server.records()]
    elif command == "quit":
        break
    else:
        answer = f"unknown command {command!r}"
    print(json.dumps(answer), flush=True)
server.close()
"""


class PipedProcess:
    """A Python process inside a namespace, asked over a pipe: one command per line, one JSON
    answer per line, `{"ready": true}` first."""

    def __init__(self, namespace: str, argv: list[str], what: str, cwd: str | None = None) -> None:
        self.what = what
        self.process = subprocess.Popen(
            ["ip", "netns", "exec", namespace, sys.executable, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
        )
        self._lock = threading.Lock()
        first = self._readline()
        if json.loads(first) != {"ready": True}:
            self.kill()
            raise RuntimeError(f"{what} did not start: {first!r}")

    def _readline(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.what} process ended")
        return line

    def ask(self, command: str) -> Any:
        with self._lock:
            assert self.process.stdin is not None
            self.process.stdin.write(command + "\n")
            self.process.stdin.flush()
            return json.loads(self._readline())

    def kill(self) -> None:
        """End the process at once (SIGKILL): no goodbye on any connection."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class ServerProcess(PipedProcess):
    """The reference bootstrap server in a subprocess inside a namespace, asked over a pipe."""

    def __init__(self, namespace: str, host: str, port: int) -> None:
        # Started in tests/, so that the script imports the lab from there.
        tests = os.path.dirname(os.path.abspath(__file__))
        super().__init__(
            namespace, ["-c", _SERVER_SCRIPT, host, str(port)], "bootstrap server", tests
        )

    def puts(self) -> list[int]:
        """The rank_port of every PUT this process received, in order."""
        answer: list[int] = self.ask("puts")
        return answer


class Link:
    """A client namespace and a server namespace joined by one veth pair, with a static ARP
    entry on each side so a dead link is a silent black hole (no "host unreachable")."""

    def __init__(self, impaired: tuple[float, float] | None = None) -> None:
        """`impaired=(delay, loss)`: instead of a veth pair, a pair of tun devices joined by a
        user-space forwarder (tests/netns_impair.py) that delays every packet by `delay`
        seconds and drops each with probability `loss`, in both directions."""
        tag = f"{os.getpid() % 100000}x{next(_counter)}"
        self.client = f"rgc{tag}"
        self.server = f"rgs{tag}"
        self.client_dev = f"rgc{tag}"
        self.server_dev = f"rgs{tag}"
        self.servers: list[ServerProcess] = []
        self._made: list[str] = []
        self._forwarder: subprocess.Popen[str] | None = None
        try:
            if impaired is None:
                self._build()
            else:
                self._build_impaired(*impaired)
        except BaseException:
            self.close()
            raise

    def _build(self) -> None:
        for namespace in (self.client, self.server):
            _ip("netns", "add", namespace)
            self._made.append(namespace)
        # Made inside the client namespace, so the host's namespace never sees either end.
        _ip(
            "-n",
            self.client,
            "link",
            "add",
            self.client_dev,
            "type",
            "veth",
            "peer",
            "name",
            self.server_dev,
            "netns",
            self.server,
        )
        for namespace, dev, ip in (
            (self.client, self.client_dev, CLIENT_IP),
            (self.server, self.server_dev, SERVER_IP),
        ):
            _ip("-n", namespace, "addr", "add", f"{ip}/30", "dev", dev)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "link", "set", dev, "up")
        for namespace, dev, peer_ns, peer_dev, peer_ip in (
            (self.client, self.client_dev, self.server, self.server_dev, SERVER_IP),
            (self.server, self.server_dev, self.client, self.client_dev, CLIENT_IP),
        ):
            mac = json.loads(_ip("-j", "-n", peer_ns, "link", "show", peer_dev).stdout)[0]
            _ip(
                "-n",
                namespace,
                "neigh",
                "replace",
                peer_ip,
                "lladdr",
                mac["address"],
                "nud",
                "permanent",
                "dev",
                dev,
            )

    def _build_impaired(self, delay: float, loss: float) -> None:
        for namespace in (self.client, self.server):
            _ip("netns", "add", namespace)
            self._made.append(namespace)
        for namespace, dev, ip, peer in (
            (self.client, self.client_dev, CLIENT_IP, SERVER_IP),
            (self.server, self.server_dev, SERVER_IP, CLIENT_IP),
        ):
            _ip("-n", namespace, "tuntap", "add", "dev", dev, "mode", "tun")
            _ip("-n", namespace, "addr", "add", ip, "peer", peer, "dev", dev)
            _ip("-n", namespace, "link", "set", "lo", "up")
            _ip("-n", namespace, "link", "set", dev, "up")
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns_impair.py")
        self._forwarder = subprocess.Popen(
            [
                sys.executable,
                script,
                self.client,
                self.client_dev,
                self.server,
                self.server_dev,
                str(delay),
                str(loss),
                "7",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._forwarder.stdout is not None
        if self._forwarder.stdout.readline().strip() != "ready":
            raise RuntimeError("the impairing forwarder did not start")

    @property
    def url(self) -> str:
        return f"http://{SERVER_IP}:{SERVER_PORT}"

    def start_server(self) -> ServerProcess:
        server = ServerProcess(self.server, SERVER_IP, SERVER_PORT)
        self.servers.append(server)
        return server

    def down(self) -> None:
        """The server's host vanishes: its end of the link goes down, nothing is sent."""
        _ip("-n", self.server, "link", "set", self.server_dev, "down")

    def up(self) -> None:
        _ip("-n", self.server, "link", "set", self.server_dev, "up")

    def netem(self, *spec: str) -> None:
        """Impair both directions with `tc qdisc ... netem <spec>`."""
        for namespace, dev in ((self.client, self.client_dev), (self.server, self.server_dev)):
            subprocess.run(
                [
                    "ip",
                    "netns",
                    "exec",
                    namespace,
                    "tc",
                    "qdisc",
                    "replace",
                    "dev",
                    dev,
                    "root",
                    "netem",
                    *spec,
                ],
                check=True,
                capture_output=True,
                timeout=10,
            )

    def close(self) -> None:
        for server in self.servers:
            server.kill()
        if self._forwarder is not None:
            if self._forwarder.poll() is None:
                self._forwarder.kill()
            self._forwarder.wait(10)
            if self._forwarder.stdout is not None:
                self._forwarder.stdout.close()
            self._forwarder = None
        for namespace in reversed(self._made):
            _ip("netns", "del", namespace, check=False)  # takes the veth pair with it
        self._made.clear()
