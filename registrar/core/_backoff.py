"""Backoff policies: pure functions of the attempt number and one random draw (no clock, no
sleeping), so the maths is tested exactly and a 30-second schedule runs in microseconds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from . import _rules as rules
from ._errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with proportional jitter: `delay(attempt, u) = min(initial *
    multiplier**attempt, maximum) * (1 - jitter + jitter * u)`. The defaults are the upstream
    SGLang schedule capped at 5 s (docs/benchmarks.md): a client retrying while the server is
    down registers within 5 s of it coming up, and sends fewer than one request every 2 s."""

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
        growth = math.log(self.multiplier)  # 0 for a multiplier of 1: a power that cannot grow
        # Compare exponents instead of computing a power that would overflow.
        if growth and attempt >= math.log(self.maximum / self.initial) / growth:
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

WATCH_JITTER = 0.2  # watch intervals are spread by ±20 % so a fleet's checks do not line up


def retry_delay(
    backoff: Backoff,
    failures: int,
    u: float,
    retry_after: float | None,
    max_retry_after: float = DEFAULT_MAX_RETRY_AFTER,
) -> float:
    """The wait after `failures` failed attempts in a row (from 1). `Retry-After` is honoured up
    to `max_retry_after` (0 ignores it), not the backoff's maximum: a 429 asking for 30 s is not
    retried after 5 s, one asking for a year waits the cap."""
    delay = backoff.delay(failures - 1, u)
    if retry_after is not None and math.isfinite(retry_after) and retry_after > 0:
        delay = max(delay, min(retry_after, max_retry_after))
    return delay


def watch_delay(interval: float, u: float) -> float:
    """The wait before the next route check, the same after a failed one: looking again sooner
    made a fleet whose checks failed in an outage look again together when the server came back,
    and doubled the re-registration herd (docs/benchmarks.md)."""
    return interval * (1 - WATCH_JITTER + 2 * WATCH_JITTER * u)


def first_watch_delay(interval: float, u: float) -> float:
    """The wait before the first regular check after a registration, uniform over [0.5, 1.5)
    intervals: a fleet that registered together spreads its checks at once instead of
    stampeding the server together after its next restart (docs/benchmarks.md)."""
    return interval * (0.5 + u)


def rejoin_delay(backoff: Backoff, lost_after_put: int, u: float) -> float:
    """The wait before registering again once the route is found missing: none the first time
    (docs/sglang.md); when lost right after our own PUT repeatedly, uniform over [0, `base`)."""
    return backoff.base(lost_after_put) * u if lost_after_put else 0.0


PROBE_PERIOD = 0.15
"""The mean time between probes while connections are refused, for a lone client (seconds)."""

ACCEPT_RATE = 1000.0
"""New connections per second a fleet may open towards one server at once (what SGLang's server
took without a listen-queue overflow: docs/benchmarks.md, "What the figures chose")."""


def probe_period(herd: int) -> float:
    """The mean time between refused probes for one of `herd` clients of one server: longer than
    PROBE_PERIOD when the fleet's probes, arriving together when it comes up, exceed ACCEPT_RATE."""
    return max(PROBE_PERIOD, max(1, herd) / ACCEPT_RATE)


def probe_delay(herd: int, u: float) -> float:
    """The wait before probing again while refused (a probe costs the server a kernel reset),
    uniform over [0.5, 1.5) periods: random phases keep the arrivals within ACCEPT_RATE."""
    return probe_period(herd) * (0.5 + u)


def contact_delay(herd: int, u: float) -> float:
    """The wait before checking once a sign says the route may be gone, uniform over
    [0, herd / ACCEPT_RATE): a fleet that saw the same restart does not connect all at once."""
    return max(1, herd) / ACCEPT_RATE * u
