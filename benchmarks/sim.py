"""A discrete-event simulation of a fleet on a virtual clock, driven by registrar's own timing
functions (`registrar.core.backoff`), for fleets and waits too large to run for real.

Requests take no time and the server answers at once; each client is independent (the server's
answers depend only on whether it is up and whether it has forgotten the client), so each
client's timeline is computed on its own and the fleet's request times are merged.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from registrar.core.backoff import (
    Backoff,
    first_watch_delay,
    rejoin_delay,
    retry_delay,
    watch_delay,
)

from .baseline import MAX_RETRIES, upstream_delay

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
    """Every request's time."""
    puts: list[float] = field(default_factory=list)
    recovery_requests: int = 0
    """Requests from the restart until each client was registered again (its check included)."""


def startup_registrar(
    n: int, up_at: float, strategy: Delay, seed: int, horizon: float = 3600.0
) -> Fleet:
    """n clients start at 0 and retry until the server, up at `up_at`, accepts them."""
    rng = random.Random(seed)
    fleet = Fleet()
    for _ in range(n):
        t, failures, previous = 0.0, 0, 0.0
        while t < horizon:
            fleet.requests.append(t)
            fleet.puts.append(t)
            if t >= up_at:
                fleet.registered.append(t)
                break
            failures += 1
            previous = strategy(failures, previous, rng.random())
            t += previous
        else:
            fleet.registered.append(None)
    return fleet


def startup_baseline(n: int, up_at: float, seed: int) -> Fleet:
    rng = random.Random(seed)
    fleet = Fleet()
    for _ in range(n):
        t = 0.0
        registered = None
        for attempt in range(MAX_RETRIES):
            fleet.requests.append(t)
            fleet.puts.append(t)
            if t >= up_at:
                registered = t
                break
            if attempt < MAX_RETRIES - 1:
                t += upstream_delay(attempt, rng.random())
        fleet.registered.append(registered)
    return fleet


def restart_registrar(
    n: int,
    down_at: float,
    down_for: float,
    backoff: Backoff,
    interval: float,
    seed: int,
    until: float | None = None,
) -> Fleet:
    """n registered clients watching every `interval`; the server restarts at `down_at` and
    comes back empty after `down_for`. Every check after the restart finds the route missing
    (the evidence the transport keeps always shows a restart: a dropped connection). Clients
    keep watching after they are back, up to `until`, so the request rate is complete."""
    rng = random.Random(seed)
    back_at = down_at + down_for
    until = back_at + 3 * interval if until is None else until
    fleet = Fleet()
    for _ in range(n):
        t = rng.random() * interval  # steady state: checks at random phases
        registered = None
        while registered is None:
            fleet.requests.append(t)
            if t >= down_at:
                fleet.recovery_requests += 1
            if t < back_at:  # present before the restart; unreachable while it is down
                t += watch_delay(interval, rng.random())
                continue
            # Found missing: the jittered first re-attempt, then the PUT and its check.
            t += rejoin_delay(backoff, 0, rng.random())
            fleet.requests.extend((t, t))
            fleet.recovery_requests += 2
            fleet.puts.append(t)
            registered = t
        fleet.registered.append(registered)
        t += first_watch_delay(interval, rng.random())
        while t < until:
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
