"""Where the loop stands between two decisions (`LoopState`), and what its decisions depend on
for a registrar's whole life (`LoopConfig`). Frozen values: `decide()` answers a new state."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .backoff import Backoff
from .machine import State

__all__ = ["LoopConfig", "LoopState", "Phase"]


class Phase(StrEnum):
    """What the loop is doing: getting the route registered, watching it, or nothing more."""

    REGISTERING = "registering"
    WATCHING = "watching"
    ENDED = "ended"


@dataclass(frozen=True)
class LoopConfig:
    """What the loop's decisions depend on, fixed for a registrar's life."""

    backoff: Backoff
    max_attempts: int | None = 5
    max_elapsed: float | None = None
    watch_interval: float | None = 15.0
    max_retry_after: float = 60.0
    fleet: int = 1
    """How many clients register with the same server (spreads probes and first contact)."""
    url: str = ""
    """The server's URL as shown, for the log lines."""


@dataclass(frozen=True)
class LoopState:
    """Everything the loop remembers between two decisions (nothing else is kept)."""

    phase: Phase = Phase.REGISTERING
    state: State = State.REGISTERING
    """The machine state the published snapshot shows."""
    route: str | None = None
    """What the snapshot says the last route check found (None: not checked since the PUT)."""
    reachable: bool | None = None
    """Whether the server answered the last request (None before any)."""
    ever_registered: bool = False
    registrations: int = 0
    # -- registering
    startup: bool = True
    """No registration was ever accepted when this run of attempts began: the budget counts."""
    started: float = 0.0
    """When this run of attempts began (monotonic seconds)."""
    streak: int = 0
    """Counted failed attempts in this run."""
    due: float | None = None
    """While refused: when the next counted attempt is due (probes before it are free)."""
    counted: bool = True
    """The attempt in flight counts against the budget (a probe does not)."""
    looked: bool = False
    """The server answered a look since this run began: no look before the next attempt."""
    refused: bool = False
    """The last attempt was refused: nothing listened, nothing to look at."""
    unanswered: int = 0
    """Looks still owed after an attempt that may have reached the server unanswered."""
    delay: float = 0.0
    """The wait chosen with a `Fail`, taken once the policy answers."""
    # -- watching
    check_now: bool = False
    """Check at once (right after a PUT or an adoption), without waiting."""
    just_put: bool = False
    """The check in flight is the one right after a PUT."""
    checks: int = 0
    probing: bool = False
    """The last check was refused: the server is down; checks come at the probe cadence."""
    broken: int = 0
    """Checks in a row whose connection broke."""
    lost_after_put: int = 0
    """Times in a row the route was found missing right after our own PUT."""
    last_check_started: float | None = None
    unheeded: int = 0
    """Reports the server contradicted, not yet logged."""
    unheeded_logged_at: float | None = None
