"""Real startup races and restarts: every server and every fleet in a process of its own.

Each scenario runs one contender at a time (this registrar, the release measured beside it,
the upstream SGLang loop) against one server (SGLang's real bootstrap server, or the
reference server), so the listen-queue overflow counter and the CPU belong to that pair alone.
Where root can make one, every run happens inside a network namespace of its own
(`ip netns add`, loopback only), so the overflow counter (`TcpExtListenOverflows`) counts this
run's server and nothing else on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FLEET = Path(__file__).with_name("fleet.py")
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Contender:
    """Who is measured: `who` is "registrar" or "upstream"; `python` the interpreter whose
    `registrar` (for "registrar") is the code under test."""

    name: str
    who: str
    python: str


class Net:
    """Where processes run: a fresh network namespace (loopback only) when one can be made,
    else this one (then the overflow counter is shared with the rest of the machine)."""

    def __init__(self, isolate: bool = True) -> None:
        self.name: str | None = None
        if isolate and shutil.which("ip") and os.geteuid() == 0:
            name = f"perf-bench-{os.getpid()}"
            made = subprocess.run(["ip", "netns", "add", name], capture_output=True, check=False)
            if made.returncode == 0:
                subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
                self.name = name

    @property
    def isolated(self) -> bool:
        return self.name is not None

    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name] if self.name else []

    def overflows(self) -> int:
        text = subprocess.run(
            [*self.prefix(), "cat", "/proc/net/netstat"], capture_output=True, text=True, check=True
        ).stdout
        lines = text.splitlines()
        for head, values in zip(lines[::2], lines[1::2], strict=False):
            if head.startswith("TcpExt:"):
                keys, nums = head.split()[1:], values.split()[1:]
                return int(nums[keys.index("ListenOverflows")])
        return 0

    def close(self) -> None:
        if self.name:
            subprocess.run(["ip", "netns", "del", self.name], check=False)
            self.name = None


SERVER_PYTHON: dict[str, str] = {"sglang": sys.executable, "reference": sys.executable}
"""The interpreter each kind of server runs in (SGLang's: one where sglang and aiohttp are
installed, e.g. the environment scripts/sglang-venv.sh builds)."""

_next_port = [20000 + os.getpid() % 10000]


def _port() -> int:
    """A port for the next server: in a fresh namespace every port is free; outside one,
    successive ports from a per-process base keep runs from colliding. The base stays below
    the tests' port blocks and the kernel's ephemeral range (32768 up): a port there could be
    any process's outgoing connection, and SGLang's server could not bind it."""
    _next_port[0] += 1
    return _next_port[0]


class ServerProc:
    """A bootstrap server in its own process (`benchmarks.server`)."""

    def __init__(self, kind: str, port: int, net: Net, host: str = "127.0.0.1") -> None:
        python = SERVER_PYTHON[kind]
        self.records_path = Path(tempfile.mkstemp(prefix="perf-records-", suffix=".json")[1])
        self.proc = subprocess.Popen(
            [
                *net.prefix(),
                python,
                "-m",
                "benchmarks.server",
                kind,
                host,
                str(port),
                str(self.records_path),
            ],
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the {kind} server did not start")
        self.up: float = json.loads(line)["up"]

    def stop(self) -> list[list[Any]]:
        """SIGTERM: the process writes its records and exits (closing every connection)."""
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(30)
        try:
            records: list[list[Any]] = json.loads(self.records_path.read_text() or "[]")
        finally:
            self.records_path.unlink(missing_ok=True)
        return records


class Pair:
    """Two network namespaces joined by a veth pair: the server's (10.231.k.1) and the
    fleet's (10.231.k.2). Taking the server's end down is a partition: the fleet's packets are
    dropped silently, and a server that dies meanwhile cannot tell it (no EOF, no reset)."""

    def __init__(self) -> None:
        k = os.getpid() % 250 + 1
        self.server, self.fleet = Net(isolate=False), Net(isolate=False)
        self.server.name, self.fleet.name = f"perf-srv-{os.getpid()}", f"perf-cli-{os.getpid()}"
        self.host = f"10.231.{k}.1"
        self.link = self.link_name()
        srv, cli = f"{self.link}a", f"{self.link}b"
        steps = [
            ["ip", "netns", "add", self.server.name],
            ["ip", "netns", "add", self.fleet.name],
            ["ip", "link", "add", f"{self.link}a", "type", "veth", "peer", "name", f"{self.link}b"],
            ["ip", "link", "set", f"{self.link}a", "netns", self.server.name],
            ["ip", "link", "set", f"{self.link}b", "netns", self.fleet.name],
            ["ip", "-n", self.server.name, "addr", "add", f"{self.host}/24", "dev", srv],
            ["ip", "-n", self.fleet.name, "addr", "add", f"10.231.{k}.2/24", "dev", cli],
            ["ip", "-n", self.server.name, "link", "set", f"{self.link}a", "up"],
            ["ip", "-n", self.fleet.name, "link", "set", f"{self.link}b", "up"],
            ["ip", "-n", self.server.name, "link", "set", "lo", "up"],
            ["ip", "-n", self.fleet.name, "link", "set", "lo", "up"],
        ]
        try:
            for step in steps:
                subprocess.run(step, check=True, capture_output=True)
        except (subprocess.CalledProcessError, FileNotFoundError):
            self.close()
            raise

    @staticmethod
    def link_name() -> str:
        return f"pv{os.getpid() % 100000}"

    def cut(self, down: bool) -> None:
        state = "down" if down else "up"
        assert self.server.name is not None
        subprocess.run(
            ["ip", "-n", self.server.name, "link", "set", f"{self.link}a", state], check=True
        )

    def close(self) -> None:
        self.server.close()
        self.fleet.close()


class FleetProc:
    """A fleet of clients in its own process (`benchmarks/fleet.py`), driven over a pipe."""

    def __init__(
        self, contender: Contender, url: str, n: int, net: Net, watch: float | None = None
    ) -> None:
        args = [contender.who, url, str(n), "default" if watch is None else str(watch)]
        self.proc = subprocess.Popen(
            [*net.prefix(), contender.python, str(FLEET), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tempfile.gettempdir(),  # import registrar from the interpreter, not this tree
        )

    def ask(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def wait_count(self, key: str, n: int, patience: float) -> bool:
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline:
            if self.ask("count")[key] >= n:
                return True
            time.sleep(0.05)
        return bool(self.ask("count")[key] >= n)

    def stop(self) -> dict[str, Any]:
        answer = self.ask("stop")
        self.proc.wait(60)
        return answer


def quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _per_rank(records: list[list[Any]]) -> dict[int, list[list[Any]]]:
    ranks: dict[int, list[list[Any]]] = {}
    for record in records:
        if record[2] is not None:
            ranks.setdefault(int(record[2]), []).append(record)
    return ranks


def startup_race(
    kind: str, contender: Contender, n: int, up_after: float, net: Net, patience: float = 40.0
) -> dict[str, Any]:
    """The fleet starts; the server comes up `up_after` seconds later (when it listens)."""
    port = _port()
    fleet = FleetProc(contender, f"http://127.0.0.1:{port}", n, net)
    started = fleet.ask("start")["t"]
    before = net.overflows()
    time.sleep(max(0.0, started + up_after - time.monotonic()))
    server = ServerProc(kind, port, net)
    fleet.wait_count("once", n, patience)
    time.sleep(0.5)  # let the checks after the PUTs reach the server
    result = fleet.stop()
    records = server.stop()
    overflows = net.overflows() - before
    first: dict[int, float] = {}
    for rank, at in result["events"]:
        first.setdefault(rank, at)
    after = [at - server.up for at in first.values()]
    puts = [r for r in records if r[1] == "PUT" and r[3] == 200]
    return {
        "registered_fraction": len(first) / n,
        "p50": quantile(after, 0.5),
        "p99": quantile(after, 0.99),
        "max": max(after) if len(first) == n else None,
        "overflows": overflows,
        "requests_per_client": len(records) / n,
        "puts_per_rank_max": max((len(v) for v in _per_rank(puts).values()), default=0),
        "up_after": server.up - started,
        # Each registered client's seconds from the server up to its first registration: the
        # report draws the timeline and the distribution from these.
        "after": _rounded(after),
    }


def restart(
    kind: str,
    contender: Contender,
    n: int,
    down_for: float,
    net: Net,
    watch: float | None = None,
    patience: float = 20.0,
) -> dict[str, Any]:
    """A registered fleet; the server process is killed, and a new one (empty memory) is
    started `down_for` seconds later. Time to back: from the new server listening to the last
    rank's PUT accepted by it."""
    port = _port()
    server = ServerProc(kind, port, net)
    fleet = FleetProc(contender, f"http://127.0.0.1:{port}", n, net, watch)
    fleet.ask("start")
    registered = fleet.wait_count("once", n, 30.0)
    time.sleep(3.0)  # past the check after each PUT: the fleet is idle, watching
    before = net.overflows()
    server.stop()
    killed = time.monotonic()
    time.sleep(max(0.0, killed + down_for - time.monotonic()))
    server = ServerProc(kind, port, net)
    fleet.wait_count("twice", n, patience if contender.who != "upstream" else 3.0)
    time.sleep(0.5)
    result = fleet.stop()
    records = server.stop()
    overflows = net.overflows() - before
    puts = [r for r in records if r[1] == "PUT" and r[3] == 200]
    per_rank = _per_rank(puts)
    back_at = [min(r[0] for r in rows) - server.up for rows in per_rank.values()]
    return {
        "registered_before": registered,
        "recovered_fraction": len(per_rank) / n,
        "time_to_all_back": max(back_at) if len(per_rank) == n else None,
        "p50_back": quantile(back_at, 0.5),
        "puts_per_rank": sorted({len(v) for v in per_rank.values()}),
        "requests_per_client": len(records) / n,
        "overflows": overflows,
        "down_measured": server.up - killed,
        "stop_p50_ms": 1000 * statistics.median(result["stops"]),
        "stop_max_ms": 1000 * max(result["stops"]),
        "back": _rounded(back_at),  # each rank's seconds from the new server up to its PUT
    }


def _rounded(values: list[float]) -> list[float]:
    return sorted(round(v, 4) for v in values)


def idle(
    kind: str, contender: Contender, n: int, seconds: float, net: Net, watch: float | None = None
) -> dict[str, Any]:
    """A registered fleet left alone: its CPU per registrar, and how long each stop() took."""
    port = _port()
    server = ServerProc(kind, port, net)
    fleet = FleetProc(contender, f"http://127.0.0.1:{port}", n, net, watch)
    fleet.ask("start")
    fleet.wait_count("once", n, 30.0)
    time.sleep(2.0)
    first = fleet.ask("cpu")
    time.sleep(seconds)
    last = fleet.ask("cpu")
    result = fleet.stop()
    records = server.stop()
    cpu, wall = last["cpu"] - first["cpu"], last["t"] - first["t"]
    return {
        "seconds": wall,
        "core_percent_per_registrar": 100 * cpu / wall / n,
        "server_requests_per_client_per_minute": sum(
            1 for r in records if first["t"] <= r[0] < last["t"]
        )
        / n
        / wall
        * 60,
        "stop_p50_ms": 1000 * statistics.median(result["stops"]),
        "stop_max_ms": 1000 * max(result["stops"]),
    }


@contextlib.contextmanager
def network(isolate: bool = True) -> Iterator[Net]:
    net = Net(isolate)
    try:
        yield net
    finally:
        net.close()


def partition(
    kind: str,
    contender: Contender,
    n: int,
    down_for: float,
    watch: float | None = None,
    patience: float = 60.0,
) -> dict[str, Any]:
    """A registered fleet in its own namespace loses the server's (a partition, no EOF);
    meanwhile the server process is killed and a new one (empty memory) starts; `down_for`
    seconds after the cut the partition heals. Time to back: from the heal to the last rank's
    PUT accepted by the new server."""
    pair = Pair()
    try:
        port = _port()
        server = ServerProc(kind, port, pair.server, host=pair.host)
        fleet = FleetProc(contender, f"http://{pair.host}:{port}", n, pair.fleet, watch)
        fleet.ask("start")
        registered = fleet.wait_count("once", n, 30.0)
        time.sleep(3.0)
        cut = time.monotonic()
        pair.cut(True)
        server.stop()
        server = ServerProc(kind, port, pair.server, host=pair.host)
        time.sleep(max(0.0, cut + down_for - time.monotonic()))
        pair.cut(False)
        healed = time.monotonic()
        fleet.wait_count("twice", n, patience if contender.who != "upstream" else 3.0)
        time.sleep(0.5)
        fleet.stop()
        records = server.stop()
    finally:
        pair.close()
    puts = [r for r in records if r[1] == "PUT" and r[3] == 200]
    per_rank = _per_rank(puts)
    back_at = [min(r[0] for r in rows) - healed for rows in per_rank.values()]
    return {
        "registered_before": registered,
        "recovered_fraction": len(per_rank) / n,
        "time_to_all_back": max(back_at) if len(per_rank) == n else None,
        "p50_back": quantile(back_at, 0.5),
        "puts_per_rank": sorted({len(v) for v in per_rank.values()}),
    }


def cost(kind: str, contender: Contender, n: int, net: Net, settle: float = 1.0) -> dict[str, Any]:
    """CPU the fleet's process spends registering `n` clients with a server already up: from
    before the start until every client is registered and `settle` seconds more (the check
    after each PUT), per client, with the requests the server saw meanwhile. The clients'
    threads start inside the window; constructing them does not count."""
    port = _port()
    server = ServerProc(kind, port, net)
    fleet = FleetProc(contender, f"http://127.0.0.1:{port}", n, net)
    before = fleet.ask("cpu")
    fleet.ask("start")
    registered = fleet.wait_count("once", n, 30.0)
    time.sleep(settle)
    after = fleet.ask("cpu")
    fleet.stop()
    records = server.stop()
    return {
        "registered": registered,
        "cpu_ms_per_client": 1000 * (after["cpu"] - before["cpu"]) / n,
        "requests_per_client": sum(1 for r in records if r[0] <= after["t"]) / n,
    }


def limit(kind: str, contender: Contender, n: int, net: Net) -> dict[str, Any]:
    """The physical limit of this machine: the server already up, the fleet's clients each
    send their PUT and its check at once (`who="limit"` in fleet.py). Time from the start to
    the last client done; no client can do better."""
    port = _port()
    server = ServerProc(kind, port, net)
    before = net.overflows()
    fleet = FleetProc(contender, f"http://127.0.0.1:{port}", n, net)
    started = fleet.ask("start")["t"]
    fleet.wait_count("once", n, 30.0)
    result = fleet.stop()
    server.stop()
    first: dict[int, float] = {}
    for rank, at in result["events"]:
        first.setdefault(rank, at)
    after = [at - started for at in first.values()]
    return {
        "p50": quantile(after, 0.5),
        "p99": quantile(after, 0.99),
        "max": max(after) if len(first) == n else None,
        "overflows": net.overflows() - before,
        "after": _rounded(after),
    }
