"""Fakes and helpers shared by the tests: a fake clock whose wait advances virtual time, a
scripted transport, SGLang payloads, and loopback ports no other test can take (`Ports`, see
docs/testing.md)."""

from __future__ import annotations

import fcntl
import os
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping
from typing import Any

from registrar import HttpSettings, RegisterOutcome, Route, RouteCheck, Verdict
from registrar.protocols._resolver import Resolver
from registrar.protocols._sglang import SGLangTransport, make_payload

LOOPBACK = "127.0.0.1"


class FakeClock:
    """Virtual time: `wait` returns at once and advances the clock by its timeout. A wait that
    would pass `horizon` parks in real time until the event is set (as a long real wait would),
    so a watching registrar does not spin forever."""

    def __init__(
        self, start: float = 1000.0, wall: float = 1_800_000_000.0, horizon: float = 100_000.0
    ) -> None:
        self.start = start
        self.now = start
        self.wall = wall
        self.horizon = start + horizon
        self.waits: list[float] = []
        self.lock = threading.Lock()
        self.parked = False
        """True once a wait went past the horizon: the loop has nothing left to do soon."""

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall + (self.now - self.start)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        if timeout is None or self.now + timeout > self.horizon:
            self.parked = True
            return event.wait(0.5)
        with self.lock:
            self.waits.append(timeout)
            self.now += timeout
        return event.is_set()


def accepted() -> RegisterOutcome:
    return RegisterOutcome(Verdict.ACCEPTED, status_code=200)


def retry(
    code: int | None = 503, error: str = "503 Service Unavailable", retry_after: float | None = None
) -> RegisterOutcome:
    return RegisterOutcome(Verdict.RETRY, status_code=code, error=error, retry_after=retry_after)


def fatal(
    code: int = 401, error: str = "401 Unauthorized: check the auth token"
) -> RegisterOutcome:
    return RegisterOutcome(Verdict.FATAL, status_code=code, error=error)


def route(kind: Route, evidence: str = "") -> RouteCheck:
    return RouteCheck(kind, 200 if kind is Route.PRESENT else 503, evidence)


class ScriptedTransport:
    """Answers registrations and checks from scripts; the last entry repeats. `checks=None`
    means the protocol cannot check."""

    display_url = "http://127.0.0.1:8998"

    def __init__(
        self,
        outcomes: list[RegisterOutcome],
        checks: list[RouteCheck] | None = None,
        before: RouteCheck | None = None,
    ) -> None:
        self.outcomes = list(outcomes)
        self.checks = None if checks is None else list(checks)
        self.before = before if before is not None else route(Route.MISSING, "never registered")
        """What a check finds before the first registration (as a server that never got our
        route would answer); the scripted checks start after it."""
        self.registered: list[dict[str, Any]] = []
        self.checked = 0
        self.looked = 0
        """Checks made before the first registration."""
        self.closed = False
        self.lock = threading.Lock()
        self.calls_after_close = 0

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        with self.lock:
            if self.closed:
                self.calls_after_close += 1
            self.registered.append(dict(payload))
            return self.outcomes.pop(0) if len(self.outcomes) > 1 else self.outcomes[0]

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        with self.lock:
            if self.checks is None:
                return None
            if not self.registered:
                self.looked += 1
                return self.before
            self.checked += 1
            if not self.checks:
                return route(Route.PRESENT)
            return self.checks.pop(0) if len(self.checks) > 1 else self.checks[0]

    def close(self) -> None:
        self.closed = True


class Watched(SGLangTransport):
    """SGLang's transport, seen from the test: `events` lists, in order, each registration
    ("PUT"), each route check ("GET") and each idle wait between checks ("idle" when it starts,
    "sign" or "woken" when it ends). `idle()` is true while the loop sits in an idle wait of at
    least `long` seconds that began after event `since`: it has nothing to do before then, so
    what happened until that moment is all there is. That is the point a test synchronises on
    to say "nothing more happened", instead of a sleep a slow machine can make too short."""

    def __init__(self, url: str, timeout: float = 5.0, *, long: float = 30.0) -> None:
        super().__init__(HttpSettings(url, timeout=timeout))
        self.long = long
        self.events: list[str] = []
        self._idle_at: int | None = None
        self._events_lock = threading.Lock()

    def _note(self, event: str) -> int:
        with self._events_lock:
            self.events.append(event)
            return len(self.events) - 1

    def mark(self) -> int:
        """The index the next event will have."""
        with self._events_lock:
            return len(self.events)

    def idle(self, since: int = 0) -> bool:
        with self._events_lock:
            at = self._idle_at
            return at is not None and at >= since and at == len(self.events) - 1

    def count(self, event: str, since: int = 0) -> int:
        with self._events_lock:
            return self.events[since:].count(event)

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        outcome = super().register(payload)
        self._note("PUT")
        return outcome

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        found = super().check(payload)
        self._note("GET")
        return found

    def wait_idle(self, timeout: float, waker: Any) -> bool:
        at = self._note("idle")
        if timeout >= self.long:
            with self._events_lock:
                self._idle_at = at
        changed = super().wait_idle(timeout, waker)
        with self._events_lock:
            self._idle_at = None
        self._note("sign" if changed else "woken")
        return changed


def sglang_payload(
    tp_rank: int = 0, tp_size: int = 1, port: int = 20000, ip: str = LOOPBACK, **extra: Any
) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "rank_ip": ip,
        "rank_port": port,
        "attn_tp_rank": tp_rank,
        "attn_tp_size": tp_size,
    }
    fields.update(extra)  # a test may override (or break) any field
    return make_payload(**fields)


def reserve_port(host: str = LOOPBACK, port: int = 0) -> socket.socket:
    """A bound, non-listening socket: its port is this test's until the socket is closed, and a
    connect to it is refused, as to a server that is not up yet. Hand it to
    `BootstrapServer(sock=...)` for a server that starts later on that port; close it when done
    (the `ports` fixture does). A `port` held by such a socket or by a `BootstrapServer` can be
    reserved again: the successor that holds it once they close."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # the server's successor socket
    sock.bind((host, port))
    return sock


PORT_BLOCK = 100
"""Ports per pytest worker in the block allocator below."""

_held: deque[Any] = deque()
_cursor: dict[str, int] = {}


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    digits = "".join(ch for ch in worker if ch.isdigit())
    return int(digits) if digits else 0


def port_block() -> range:
    """This pytest worker's ports for external processes: a block of `PORT_BLOCK` just below
    the kernel's ephemeral range, so the kernel never hands one of them to a port-0 bind, and
    one block per xdist worker, so two workers never pick the same one."""
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    top = low - _worker_index() * PORT_BLOCK
    if top - PORT_BLOCK < 1024:
        raise RuntimeError(f"no room below the ephemeral range ({low}) for this worker's ports")
    return range(top - PORT_BLOCK, top)


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def process_port(host: str = LOOPBACK) -> int:
    """A port number for a process that must be told one (etcd, the smg router, SGLang, a
    `registrar` subprocess's health port): the next one of this worker's block that nothing
    uses now. A lock file held for the rest of this process (up to half a block) keeps it from
    another pytest run on the machine (another checkout's suite) that uses the same block."""
    block = port_block()
    lock_dir = os.path.join(tempfile.gettempdir(), "registrar-test-ports")
    os.makedirs(lock_dir, exist_ok=True)
    for _ in range(len(block)):
        key = f"{host}:{block.start}"
        port = block[_cursor.get(key, 0) % len(block)]
        _cursor[key] = _cursor.get(key, 0) + 1
        lock = open(os.path.join(lock_dir, f"{port}.lock"), "w")  # noqa: SIM115 (held open)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            lock.close()
            continue
        if not _bindable(host, port):
            lock.close()
            continue
        _held.append(lock)
        while len(_held) > len(block) // 2:
            _held.popleft().close()
        return port
    raise RuntimeError(f"every port of {block} is in use")


class Ports:
    """The ports of one test (the `ports` fixture), released when it ends."""

    def __init__(self) -> None:
        self.sockets: list[socket.socket] = []

    def reserve(self, host: str = LOOPBACK, port: int = 0) -> socket.socket:
        """See `reserve_port`; closed at the end of the test (closing twice is harmless)."""
        sock = reserve_port(host, port)
        self.sockets.append(sock)
        return sock

    def refusing(self, host: str = LOOPBACK) -> int:
        """A port whose connects are refused for the whole test."""
        port: int = self.reserve(host).getsockname()[1]
        return port

    def refusing_url(self, host: str = LOOPBACK) -> str:
        return f"http://{host}:{self.refusing(host)}"

    def process(self, host: str = LOOPBACK) -> int:
        """See `process_port`."""
        return process_port(host)

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()


def lookups_in_flight(resolver: Resolver) -> int:
    """The resolver's lookups in flight (a thread each)."""
    with resolver._lock:
        return sum(1 for name in resolver._names.values() if name.pending is not None)


def wait_until(predicate: Any, timeout: float = 10.0, interval: float = 0.01) -> bool:
    """Poll `predicate` until true or `timeout` seconds pass; the final answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def settled(count: Any, quiet: float, timeout: float) -> int:
    """`count()` once it has not changed for `quiet` seconds; fails if it never settles (a
    loop of requests shows as a count that keeps growing)."""
    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.02)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet:
            return int(now)
    raise AssertionError(f"still growing after {timeout:g} s: {count()}")


SENTINEL = {
    "prefill_dp_rank": -1,
    "prefill_cp_rank": -1,
    "target_tp_rank": -1,
    "target_pp_rank": -1,
}


CLI_ENV = {
    key: value
    for key, value in os.environ.items()
    if not key.startswith("REGISTRAR_") and key != "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"
}
"""The environment `registrar` subprocesses run in: none of the variables it reads, unbuffered."""
CLI_ENV["PYTHONUNBUFFERED"] = "1"


def scripted_protocol(
    payload: Mapping[str, Any], options: Any
) -> tuple[ScriptedTransport, dict[str, Any]]:
    """A protocol factory for the registry's tests (found through an entry point)."""
    return ScriptedTransport([accepted()]), dict(payload)
