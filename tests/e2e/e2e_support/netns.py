"""Two hosts on one machine for the two-node scenarios (issue 36): two network namespaces made
for the test and removed after it, joined by a veth pair, each with its own loopback. Every
address is inside them (10.231.77.1 on node 0, .2 on node 1).

The test process itself moves into node 0's namespace while the deployment runs (`enter`): the
threads it starts from then on (the probe, the watch) and the processes it launches (node 0's
prefill, the decode, the router) are in it too, so the test talks to node 0 as a local host. A
namespace is a property of a thread in Linux, so the rest of pytest (its other threads) never
moves. Node 1's processes go through `ip netns exec` with a tmpfs of their own on `/dev/shm`:
with the machine's, SGLang takes both nodes for one (docs/e2e.md "Topologies").
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from dataclasses import dataclass, field

__all__ = ["Nodes"]

SUBNET = "10.231.77"
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), "setns into a network namespace")


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {done.stderr.strip()}")


@dataclass
class Nodes:
    """Two namespaces named after this process (two test runs on one machine never meet)."""

    names: tuple[str, str] = field(
        default_factory=lambda: (f"reg{os.getpid()}n0", f"reg{os.getpid()}n1")
    )
    links: tuple[str, str] = ("veth-n0", "veth-n1")
    addresses: tuple[str, str] = (f"{SUBNET}.1", f"{SUBNET}.2")
    _home: int = -1

    def create(self) -> None:
        self.remove()
        for name in self.names:
            _ip("netns", "add", name)
            _ip("-n", name, "link", "set", "lo", "up")
        (ns0, ns1), (link0, link1) = self.names, self.links
        _ip("link", "add", link0, "netns", ns0, "type", "veth", "peer", "name", link1, "netns", ns1)
        for name, link, address in zip(self.names, self.links, self.addresses, strict=True):
            _ip("-n", name, "addr", "add", f"{address}/24", "dev", link)
            _ip("-n", name, "link", "set", link, "up")

    def enter(self) -> None:
        """This thread (and what it starts from now on) into node 0's namespace."""
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        target = os.open(f"/run/netns/{self.names[0]}", os.O_RDONLY)
        try:
            _setns(target)
        finally:
            os.close(target)

    def leave(self) -> None:
        if self._home >= 0:
            _setns(self._home)
            os.close(self._home)
            self._home = -1

    def remove(self) -> None:
        """Both namespaces gone (their veth ends with them); quiet when there are none."""
        for name in self.names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)

    def on_node_1(self, argv: list[str], shm_size: str = "2g") -> list[str]:
        """`argv` run in node 1's namespace with a `/dev/shm` of its own (`ip netns exec` gives
        the command a mount namespace of its own, so the tmpfs is seen by it alone)."""
        mount = f'mount -t tmpfs -o size={shm_size} registrar-e2e-shm /dev/shm && exec "$@"'
        return ["ip", "netns", "exec", self.names[1], "sh", "-c", mount, "sh", *argv]

    def alias(self, node: int, address: str) -> None:
        """A second address on `node`'s end of the link (another name for the same host)."""
        _ip("-n", self.names[node], "addr", "add", f"{address}/24", "dev", self.links[node])

    def drop(self, node: int, on: bool = True) -> None:
        """Every packet leaving `node` on the link dropped (a queue of length 0: the kernel
        here has no netem), or let through again."""
        tc = ["ip", "netns", "exec", self.names[node], "tc", "qdisc"]
        rule = ["replace", "dev", self.links[node], "root", "pfifo", "limit", "0"]
        cmd = [*tc, *(rule if on else ["del", "dev", self.links[node], "root"])]
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)}: {done.stderr.strip()}")
