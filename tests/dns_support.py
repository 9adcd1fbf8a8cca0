"""A resolver of the test's own, and a network namespace that uses it.

`DnsServer` answers A queries over UDP from a table, and can be told to never answer, to
answer SERVFAIL, or to answer late: a real resolver fault, met by glibc's own stub resolver
(`getaddrinfo`), not a patched function. `Resolving` is a network namespace whose
`/etc/netns/NAME/resolv.conf` (bind-mounted over `/etc/resolv.conf` by `ip netns exec`) points
at that server on the namespace's loopback; the test's servers listen on other loopback
addresses of the same namespace (127.0.0.2, 127.0.0.3: two "hosts"), and the registrar runs
in a subprocess started with `ip netns exec`, ended by PID. `close()` removes all of it.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import netns

DNS_IP = "127.0.0.1"
HOST_A = "127.0.0.2"
HOST_B = "127.0.0.3"
_A, _IN = 1, 1
_SERVFAIL, _NXDOMAIN = 2, 3
_counter = itertools.count()
DRIVER = Path(__file__).with_name("dns_driver.py")


def _question(query: bytes) -> tuple[str, int, int]:
    """The queried name, its type and where the question ends."""
    labels, at = [], 12
    while query[at]:
        size = query[at]
        labels.append(query[at + 1 : at + 1 + size].decode("ascii", "replace"))
        at += 1 + size
    kind = struct.unpack("!H", query[at + 1 : at + 3])[0]
    return ".".join(labels).lower(), kind, at + 5


def reply(query: bytes, answers: dict[str, str], rcode: int | None = None) -> bytes:
    """The answer to `query`: A records from `answers`, NODATA for another type of a known
    name, NXDOMAIN for an unknown one, or `rcode` (SERVFAIL) whatever was asked."""
    name, kind, end = _question(query)
    ip = answers.get(name)
    records = b""
    if rcode is None:
        rcode = 0 if ip is not None else _NXDOMAIN
        if ip is not None and kind == _A:
            address = socket.inet_aton(ip)
            records = struct.pack("!HHHIH", 0xC00C, _A, _IN, 0, 4) + address
    ident = struct.unpack("!H", query[:2])[0]
    head = struct.pack("!HHHHHH", ident, 0x8180 | rcode, 1, 1 if records else 0, 0, 0)
    return head + query[12:end] + records


class DnsServer:
    """Answers on a UDP socket bound inside a namespace: `mode` is "answer", "never",
    "servfail" or "slow" (answers after `delay` seconds); `answers` maps names to addresses."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.answers: dict[str, str] = {}
        self.mode = "answer"
        self.delay = 0.0
        self.queries = 0
        self._late: list[tuple[float, int, bytes, Any]] = []
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="test-dns", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        order = itertools.count()
        while not self._closed:
            wait = max(0.0, self._late[0][0] - time.monotonic()) if self._late else None
            readable, _, _ = select.select([self.sock, self._wake_r], [], [], wait)
            if self.sock in readable:
                query, peer = self.sock.recvfrom(4096)
                self.queries += 1
                answer = self._answer(query)
                if answer is not None and self.mode == "slow":
                    due = time.monotonic() + self.delay
                    heapq.heappush(self._late, (due, next(order), answer, peer))
                elif answer is not None:
                    self.sock.sendto(answer, peer)
            while self._late and self._late[0][0] <= time.monotonic():
                _, _, answer, peer = heapq.heappop(self._late)
                with contextlib.suppress(OSError):
                    self.sock.sendto(answer, peer)

    def _answer(self, query: bytes) -> bytes | None:
        if self.mode == "never" or len(query) < 17:
            return None
        try:
            return reply(query, dict(self.answers), _SERVFAIL if self.mode == "servfail" else None)
        except (IndexError, struct.error):
            return None

    def close(self) -> None:
        self._closed = True
        self._wake_w.send(b"x")
        self._thread.join(5)
        for sock in (self.sock, self._wake_r, self._wake_w):
            sock.close()


class Resolving:
    """A namespace whose resolver is a `DnsServer` of the test's own on its loopback."""

    def __init__(self) -> None:
        self.name = f"rgd{os.getpid() % 100000}x{next(_counter)}"
        self._etc = Path("/etc/netns") / self.name
        self._made = False
        self.drivers: list[Driver] = []
        self.dns: DnsServer | None = None
        try:
            netns._ip("netns", "add", self.name)
            self._made = True
            netns._ip("-n", self.name, "link", "set", "lo", "up")
            self._etc.mkdir(parents=True)
            # glibc's own defaults (5 s a query, twice): a lookup of a server that never
            # answers takes ten seconds, ten times the deadlines under test.
            (self._etc / "resolv.conf").write_text(f"nameserver {DNS_IP}\n")
            with netns.entered(self.name):
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.bind((DNS_IP, 53))
            self.dns = DnsServer(sock)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def inside(self) -> Iterator[None]:
        """Run the calling thread in the namespace (a server started here listens there)."""
        with netns.entered(self.name):
            yield

    def driver(self, spec: dict[str, Any]) -> Driver:
        made = Driver(self.name, spec)
        self.drivers.append(made)
        return made

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A command inside the namespace, with its resolver."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def close(self) -> None:
        for driver in self.drivers:
            driver.kill()
        if self.dns is not None:
            self.dns.close()
        shutil.rmtree(self._etc, ignore_errors=True)
        if self._made:
            netns._ip("netns", "del", self.name, check=False)


class Driver(netns.PipedProcess):
    """Registrars in a subprocess inside the namespace (tests/dns_driver.py), asked over a
    pipe: `ask("status")` and so on."""

    def __init__(self, namespace: str, spec: dict[str, Any]) -> None:
        repo = str(Path(__file__).parent.parent)
        super().__init__(namespace, [str(DRIVER), json.dumps(spec)], "driver", cwd=repo)
