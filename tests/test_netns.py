"""Real network faults between real hosts: the reference bootstrap server in one network
namespace (a subprocess, `ip netns exec`), the registrar's thread in another, joined by a veth
pair (tests/netns.py). Not a closed port: the server's host vanishes without a reset (link
down: connects and reads time out, the kept-alive connection is half-open), a partition heals
after 10 s, the host comes back with a new process, and 30 % loss with 200 ms delay.

Each case asserts that the registration survives, that no request outlives its deadline, that
the watch notices within its interval, and that nothing is PUT twice in one server lifetime.
Skipped only where namespaces cannot be made (not root, no iproute2), with the reason."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import netns
import pytest
from support import sglang_payload, wait_until

from registrar import Backoff, Registrar, State
from registrar.core._board import RequestEvent

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

DEADLINE = 1.0
"""The request deadline (the whole request: connect, send, answer)."""
INTERVAL = 1.0
"""The watch interval (spread by ±20 %)."""
HANG = 30.0
"""Only catches a hang, never a speed target: how long things took is recorded as figures;
what is asserted is what happened (who noticed, how many tries, what was sent). A request that
its deadline did not end waits on the kernel instead (a connect gives up after about two
minutes, a read on a half-open connection never does)."""
PORT = 20000

_why_not = netns.unavailable()


@pytest.fixture
def link() -> Iterator[netns.Link]:
    if _why_not is not None:
        pytest.skip(f"network namespaces unavailable: {_why_not}")
    made = netns.Link()
    try:
        yield made
    finally:
        made.close()


class Watched:
    """A registrar whose thread lives in the client namespace, with every request timed."""

    def __init__(self, link: netns.Link, deadline: float = DEADLINE) -> None:
        self.events: list[RequestEvent] = []
        self.lock = threading.Lock()
        self.deadline = deadline
        self.reg = Registrar(
            link.url,
            sglang_payload(ip=netns.CLIENT_IP, port=PORT),
            timeout=deadline,
            watch_interval=INTERVAL,
            backoff=Backoff(initial=0.2, maximum=1.0),
            max_attempts=None,
        )
        self.reg.add_request_listener(self._record)
        with netns.entered(link.client):
            self.reg.start()  # the thread, and any it starts, stay in the client namespace

    def _record(self, event: RequestEvent) -> None:
        with self.lock:
            self.events.append(event)

    def count(self, kind: str) -> int:
        with self.lock:
            return sum(1 for e in self.events if e.kind == kind)

    def longest(self) -> float:
        with self.lock:
            return max((e.duration for e in self.events), default=0.0)

    def reachable(self, value: bool) -> bool:
        return self.reg.status().server_reachable is value

    def stop(self) -> None:
        assert self.reg.stop(timeout=5)


@pytest.fixture
def watched(link: netns.Link) -> Iterator[list[Watched]]:
    made: list[Watched] = []
    yield made
    for one in made:
        one.reg.stop(timeout=5)


def register(link: netns.Link, watched: list[Watched], deadline: float = DEADLINE) -> Watched:
    one = Watched(link, deadline)
    watched.append(one)
    assert one.reg.wait_for(State.REGISTERED, timeout=30)
    assert wait_until(lambda: one.reg.status().route == "present", timeout=10)
    return one


def outage(
    link: netns.Link, one: Watched, seconds: float, record: pytest.RecordProperty, name: str
) -> float:
    """Take the server's host off the link for `seconds`; the time the watch took to notice."""
    checks = one.count("check")
    link.down()
    went = time.monotonic()
    # A half-open kept-alive connection (the idle wait sees nothing, no FIN or RST comes):
    # noticed by the first check the link's loss ends, counted, not timed. At most two checks
    # ended meanwhile: one in flight at the cut, and the one that noticed.
    assert wait_until(lambda: one.reachable(False), timeout=HANG)
    noticed = time.monotonic() - went
    assert one.count("check") - checks <= 2, one.events[-4:]
    rest = seconds - (time.monotonic() - went)
    if rest > 0:
        time.sleep(rest)
    assert one.reg.state is State.REGISTERED  # nothing says the route is gone: no re-PUT
    record("figures", f"netns {name}: link down noticed after {noticed:.2f} s")
    return noticed


def test_host_vanishes_without_a_reset_and_comes_back(
    link: netns.Link, watched: list[Watched], record_property: pytest.RecordProperty
) -> None:
    server = link.start_server()
    one = register(link, watched)
    outage(link, one, 4.0, record_property, "host vanished 4 s")
    link.up()
    back = time.monotonic()
    assert wait_until(
        lambda: one.reachable(True) and one.reg.status().route == "present",
        timeout=HANG,
    )
    record_property(
        "figures", f"netns host back: reachable again after {time.monotonic() - back:.2f} s"
    )
    assert one.reg.state is State.REGISTERED
    assert one.reg.status().registrations == 1
    assert server.puts() == [PORT]  # the server never forgot: never PUT again
    assert one.longest() < HANG  # every request ended by its deadline, not by the kernel


def test_partition_healed_after_ten_seconds(
    link: netns.Link, watched: list[Watched], record_property: pytest.RecordProperty
) -> None:
    server = link.start_server()
    one = register(link, watched)
    checks_before = len(one.events)
    outage(link, one, 10.0, record_property, "partition 10 s")
    # The watch kept trying through the partition (more than the one try that noticed), and
    # no faster than its interval allows: a loaded machine only makes fewer tries.
    tried = len(one.events) - checks_before
    assert 2 <= tried <= 10.0 / (INTERVAL * 0.8) + 2
    link.up()
    healed = time.monotonic()
    assert wait_until(
        lambda: one.reachable(True) and one.reg.status().route == "present",
        timeout=HANG,
    )
    record_property(
        "figures",
        f"netns partition healed: route seen again after {time.monotonic() - healed:.2f} s",
    )
    assert one.reg.status().registrations == 1
    assert server.puts() == [PORT]
    assert one.longest() < HANG  # every request ended by its deadline, not by the kernel


def test_host_comes_back_with_a_new_process(
    link: netns.Link, watched: list[Watched], record_property: pytest.RecordProperty
) -> None:
    first = link.start_server()
    one = register(link, watched)
    link.down()
    first.kill()  # dies while unreachable: no FIN, no RST ever reaches the registrar
    assert wait_until(lambda: one.reachable(False), timeout=HANG)
    second = link.start_server()  # same address, empty memory
    time.sleep(1.0)
    link.up()
    back = time.monotonic()
    # The half-open connection is refused by the new process's kernel (a reset), the check
    # then reads "0 workers registered": missing, registered again, once.
    assert wait_until(
        lambda: one.reg.status().registrations == 2,
        timeout=HANG,
    )
    took = time.monotonic() - back
    record_property("figures", f"netns new process: registered again {took:.2f} s after link up")
    assert wait_until(lambda: one.reg.status().route == "present", timeout=10)
    assert second.puts() == [PORT]
    assert second.ask("count") == 1
    assert one.reg.state is State.REGISTERED
    assert one.longest() < HANG  # every request ended by its deadline, not by the kernel


@pytest.fixture
def lossy() -> Iterator[tuple[netns.Link, str]]:
    """A link with 200 ms delay and 30 % loss each way: `tc netem` where the kernel has it,
    else the user-space forwarder (the kernel's TCP sees the same loss and delay either way)."""
    if _why_not is not None:
        pytest.skip(f"network namespaces unavailable: {_why_not}")
    no_netem = netns.netem_unavailable()
    made = netns.Link(impaired=None if no_netem is None else (0.2, 0.3))
    try:
        if no_netem is None:
            made.netem("delay", "200ms", "loss", "30%")
        yield made, "tc netem" if no_netem is None else "a user-space tun forwarder (no netem)"
    finally:
        made.close()


def test_loss_and_delay(
    lossy: tuple[netns.Link, str], record_property: pytest.RecordProperty
) -> None:
    link, how = lossy
    deadline = 4.0  # 400 ms round trips and retransmitted SYNs (1 s, then 3 s) need room
    server = link.start_server()
    one = Watched(link, deadline)
    try:
        started = time.monotonic()
        assert one.reg.wait_for(State.REGISTERED, timeout=60)
        took = time.monotonic() - started
        # Six route checks through the loss (some fail): each was a chance to re-register.
        done = one.count("check")
        assert wait_until(lambda: one.count("check") >= done + 6, timeout=60)
        assert one.reg.state is State.REGISTERED
        assert one.reg.status().registrations == 1
        # A PUT whose answer was lost is retried; the server must still count us once.
        assert server.ask("count") == 1, server.puts()
        assert one.longest() < HANG  # every request ended by its deadline, not by the kernel
        kinds = [e.result for e in one.events]
        record_property(
            "figures",
            f"netns 30 % loss, 200 ms delay ({how}): registered after {took:.1f} s; "
            f"{len(kinds)} requests, {kinds.count('unreachable')} checks lost, "
            f"{len(server.puts())} PUT(s) received",
        )
    finally:
        one.reg.stop(timeout=5)
