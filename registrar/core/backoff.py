"""Backoff policies: pure functions of the attempt number and one random draw (no clock, no
sleeping), so the maths is tested exactly and a 30-second schedule runs in microseconds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from . import rules
from .errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with proportional jitter.

    `delay(attempt, u) = min(initial * multiplier**attempt, maximum) * (1 - jitter + jitter * u)`.
    `Backoff(initial=1.0, multiplier=2.0, maximum=30.0, jitter=0.25)` is the upstream SGLang
    schedule (0.75, 1.5, 3, 6, 12, 22.5, ... s for `u = 0`). The defaults keep it but cap it at
    5 s, chosen from the benchmarks (docs/benchmarks.md): a client retrying while the server is
    down registers within 5 s of the server coming up, however late, and still sends fewer
    than one request every 2 s.
    """

    initial: float = 1.0
    multiplier: float = 2.0
    maximum: float = 5.0
    jitter: float = 0.25

    RULES: ClassVar[Mapping[str, rules.Rule]] = {
        "initial": rules.seconds,
        "multiplier": rules.at_least_one,
        "maximum": rules.seconds,
        "jitter": rules.fraction,
    }

    def __post_init__(self) -> None:
        rules.check_fields(self, self.RULES, prefix="backoff ")

    def base(self, attempt: int) -> float:
        """The un-jittered delay after failed attempt `attempt` (from 0), capped at `maximum`."""
        if attempt < 0:
            raise ConfigError(f"attempt must be >= 0, got {attempt!r}")
        if self.multiplier == 1:
            return min(self.initial, self.maximum)
        # Compare exponents instead of computing a power that would overflow.
        limit = math.log(self.maximum / self.initial) / math.log(self.multiplier)
        if attempt >= limit:
            return self.maximum
        return min(self.initial * self.multiplier**attempt, self.maximum)

    def delay(self, attempt: int, u: float) -> float:
        """The delay in seconds after failed attempt `attempt`, for a random draw `u` in [0, 1)."""
        if not 0 <= u < 1:
            raise ConfigError(f"random draw u must be within [0, 1), got {u!r}")
        return self.base(attempt) * (1 - self.jitter + self.jitter * u)


DEFAULT_MAX_RETRY_AFTER = 60.0
"""The longest wait a server's `Retry-After` can impose: rate limits ask for seconds to a minute,
and a rank waiting longer is a rank not serving; a hostile or mistaken header costs a minute."""

WATCH_JITTER = 0.2
"""Watch intervals are spread by ±20 % so a fleet's checks do not line up."""


def retry_delay(
    backoff: Backoff,
    failures: int,
    u: float,
    retry_after: float | None,
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
) -> float:
    """The wait after `failures` failed attempts in a row (from 1). A server's `Retry-After` is
    honoured up to its own cap, `max_retry_after` (0 ignores it), not the backoff's maximum: a
    429 asking for 30 s is not retried after 5 s, and one asking for a year waits the cap."""
    delay = backoff.delay(failures - 1, u)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
        delay = max(delay, min(retry_after, max_retry_after))
    return delay


def watch_delay(interval: float, u: float) -> float:
    """The wait before the next route check: the interval spread by ±20 %.

    The same after a failed check: looking again sooner (on the backoff) made a fleet whose
    checks failed during an outage look again all together when the server came back, and
    doubled the re-registration herd (docs/benchmarks.md)."""
    return interval * (1 - WATCH_JITTER + 2 * WATCH_JITTER * u)


def first_watch_delay(interval: float, u: float) -> float:
    """The wait before the first regular check after a registration: uniform over
    [0.5, 1.5) intervals, so a fleet that registered together (the server came up, or came
    back) spreads its checks over a whole interval at once instead of checking in step and
    stampeding the server together after its next restart (docs/benchmarks.md)."""
    return interval * (0.5 + u)


def rejoin_delay(backoff: Backoff, lost_after_put: int, u: float) -> float:
    """The wait before registering again once the route is found missing: none the first
    time, because the check that found it was already the fleet's spread first contact (after
    a restart: `contact_delay`, then probes at `probe_delay`) and the PUT reuses that check's
    kept-alive connection, so it adds no new connection to the server's listen queue. When the
    route is found missing right after our own PUT again and again, the window grows as the
    backoff: uniform over [0, base)."""
    if not lost_after_put:
        return 0.0
    return backoff.base(lost_after_put) * u


PROBE_PERIOD = 0.15
"""The mean time between probes while connections are refused, for a lone client (seconds)."""

ACCEPT_RATE = 1000.0
"""New connections per second that a fleet may open towards one server at once. SGLang's
bootstrap server (one aiohttp thread, listen backlog 128) took 1000 new connections spread over
1 s with no listen-queue overflow on a 2-core machine shared with the clients, and overflowed
when they came within 0.5 s (docs/benchmarks.md). A fleet that spreads its first contact over
herd / ACCEPT_RATE seconds stays under it."""


def probe_period(herd: int) -> float:
    """The mean time between refused probes for one of `herd` clients expected to register
    with the same server: PROBE_PERIOD, or longer when the fleet is large enough that its
    probes, arriving together when the server comes up, would exceed ACCEPT_RATE."""
    return max(PROBE_PERIOD, max(1, herd) / ACCEPT_RATE)


def probe_delay(herd: int, u: float) -> float:
    """The wait before probing again while connections are refused: nothing listens, so a
    probe costs the server only a kernel reset, and the next one comes soon. Uniform over
    [0.5, 1.5) periods: the fleet's probes have random phases, so the clients that find the
    server up arrive at most `herd / probe_period(herd)` per second."""
    return probe_period(herd) * (0.5 + u)


def contact_delay(herd: int, u: float) -> float:
    """The wait before checking, once a sign says the route may be gone (the server closed
    the idle connection): uniform over [0, herd / ACCEPT_RATE), so a fleet that saw the same
    restart at the same moment does not open all its connections at once."""
    return max(1, herd) / ACCEPT_RATE * u
