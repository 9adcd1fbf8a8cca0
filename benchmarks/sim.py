"""A discrete-event simulation of a fleet on a virtual clock, driven by registrar's own timing
functions (`registrar.core._backoff`), for fleets too large to run for real (N = 1000).

Requests take no time. The server's listen queue is modelled: every new connection joins a
queue of `BACKLOG` (128, aiohttp's) served at `accept_rate` connections per second; a
connection that finds the queue full is an overflow and tries again after the kernel's SYN
retransmission (1 s, then 2 s, ...). Requests on a kept-alive connection make no new
connection. Each client is otherwise independent, so timelines are computed per client and the
server's queue is replayed over the merged arrivals.
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from registrar.core._backoff import (
    Backoff,
    contact_delay,
    first_watch_delay,
    probe_delay,
    rejoin_delay,
    retry_delay,
    watch_delay,
)

BACKLOG = 128
SYN_RETRIES = (1.0, 2.0, 4.0, 8.0)
ACCEPT_RATE_MEASURED = 1400.0
"""New connections per second SGLang's server accepted on the benchmark machine with the
clients on the same two cores: 1000 connections within 0.5 s overflowed its queue 152 times
(1000 - 0.5 * rate = 128 + 152), within 1 s not at all (docs/benchmarks.md)."""

Delay = Callable[[int, float, float], float]
"""(failures so far, previous delay, draw) -> next delay: a retry strategy under test."""


def registrar_strategy(backoff: Backoff) -> Delay:
    return lambda failures, previous, u: retry_delay(backoff, failures, u, None)


def full_jitter(backoff: Backoff) -> Delay:
    """Uniform over [0, base]: the spread of "full jitter"."""
    return lambda failures, previous, u: backoff.base(failures - 1) * u


def decorrelated_jitter(backoff: Backoff) -> Delay:
    """min(maximum, uniform(initial, 3 * previous)): "decorrelated jitter"."""

    def delay(failures: int, previous: float, u: float) -> float:
        low = backoff.initial
        high = max(low, 3 * (previous or low))
        return min(backoff.maximum, low + (high - low) * u)

    return delay


@dataclass
class Fleet:
    """What a simulated fleet did."""

    registered: list[float | None] = field(default_factory=list)
    """Per client: when it was (again) registered, or None."""
    requests: list[float] = field(default_factory=list)
    """Every request's time (refused probes excluded: they reach no server)."""
    puts: list[float] = field(default_factory=list)
    connects: list[float] = field(default_factory=list)
    """Per client: when it opened its first connection to the live server."""
    overflows: int = 0
    recovery_requests: int = 0
    """Requests the live server saw from the restart until each client was back."""


def accept(arrivals: list[float], rate: float) -> tuple[list[float], int]:
    """Replay connection attempts through a listen queue of BACKLOG served at `rate` per
    second: when each attempt (in the given order) was accepted, and how many overflowed."""
    done = [0.0] * len(arrivals)
    pending = [(at, i, 0) for i, at in enumerate(arrivals)]
    heapq.heapify(pending)
    queue: deque[float] = deque()  # service end times of the connections in the queue
    free = 0.0
    overflows = 0
    while pending:
        at, i, tries = heapq.heappop(pending)
        while queue and queue[0] <= at:
            queue.popleft()
        if len(queue) >= BACKLOG:
            overflows += 1
            wait = SYN_RETRIES[min(tries, len(SYN_RETRIES) - 1)]
            heapq.heappush(pending, (at + wait, i, tries + 1))
            continue
        free = max(free, at) + 1.0 / rate
        queue.append(free)
        done[i] = free
    return done, overflows


def startup_registrar(
    n: int,
    up_at: float,
    backoff: Backoff,
    seed: int,
    rate: float = ACCEPT_RATE_MEASURED,
    probing: bool = True,
    horizon: float = 3600.0,
    fleet_hint: int | None = None,
) -> Fleet:
    """n clients start at 0 and try until the server, up at `up_at`, accepts them. With
    `probing` (this release) a refused attempt is probed again after `probe_delay`; without it
    (the release before) every failure waits the backoff. `fleet_hint` is the fleet size the
    clients assume (default: the true n)."""
    rng = random.Random(seed)
    hint = n if fleet_hint is None else fleet_hint
    fleet = Fleet()
    first: list[float] = []
    for _ in range(n):
        t, failures = 0.0, 0
        while t < up_at and t < horizon:
            failures += 1
            t += (
                probe_delay(hint, rng.random())
                if probing
                else retry_delay(backoff, failures, rng.random(), None)
            )
        first.append(t)
    accepted, fleet.overflows = accept(first, rate)
    fleet.connects = first
    for at in accepted:
        fleet.registered.append(at)
        fleet.requests.extend((at, at))  # the PUT and its check, on the same connection
        fleet.puts.append(at)
    return fleet


def startup_upstream(n: int, up_at: float, seed: int, rate: float = ACCEPT_RATE_MEASURED) -> Fleet:
    """The upstream loop: 5 PUTs, min(2^a, 30) * (0.75 + 0.25 u) apart, then it gives up."""
    rng = random.Random(seed)
    fleet = Fleet()
    first: list[float] = []
    index: list[int] = []
    for client in range(n):
        t = 0.0
        for attempt in range(5):
            if t >= up_at:
                first.append(t)
                index.append(client)
                break
            if attempt < 4:
                t += min(1.0 * 2**attempt, 30.0) * (0.75 + 0.25 * rng.random())
    accepted, fleet.overflows = accept(first, rate)
    fleet.registered = [None] * n
    for client, at in zip(index, accepted, strict=True):
        fleet.registered[client] = at
        fleet.requests.append(at)
        fleet.puts.append(at)
    return fleet


def restart_registrar(
    n: int,
    down_at: float,
    down_for: float,
    backoff: Backoff,
    interval: float,
    seed: int,
    rate: float = ACCEPT_RATE_MEASURED,
    eof: bool = True,
) -> Fleet:
    """n registered clients; the server process dies at `down_at` and a new one, with empty
    memory, listens `down_for` later. With `eof` (this release) each client sees its idle
    connection close at once, waits `contact_delay`, and checks, probing while refused; the
    check that reaches the new server finds the route missing and the PUT follows at once on
    the same connection. Without it (the release before) the next watch check finds it, and
    the PUT follows after `rejoin_delay`-like spread of [0, backoff.initial)."""
    rng = random.Random(seed)
    back_at = down_at + down_for
    fleet = Fleet()
    first: list[float] = []
    for _ in range(n):
        if eof:
            t = down_at + contact_delay(n, rng.random())
            while t < back_at:
                t += probe_delay(n, rng.random())
        else:
            t = down_at - rng.random() * interval  # the last check before the restart
            while t < back_at:
                t += watch_delay(interval, rng.random())
        first.append(t)
    accepted, fleet.overflows = accept(first, rate)
    fleet.connects = first
    for at in accepted:
        put = at + (
            rejoin_delay(backoff, 0, rng.random()) if eof else backoff.initial * rng.random()
        )
        fleet.requests.extend((at, put, put))  # the check, the PUT, the check after it
        fleet.puts.append(put)
        fleet.registered.append(put)
        fleet.recovery_requests += 3
        t = put + first_watch_delay(interval, rng.random())
        while t < back_at + 3 * interval:
            fleet.requests.append(t)
            t += watch_delay(interval, rng.random())
    return fleet


def peak_rate(times: list[float], start: float, end: float, width: float = 1.0) -> float:
    """The highest number of requests in any `width`-second bin between start and end, per
    second."""
    bins: dict[int, int] = {}
    for t in times:
        if start <= t < end:
            key = int((t - start) // width)
            bins[key] = bins.get(key, 0) + 1
    return max(bins.values(), default=0) / width
