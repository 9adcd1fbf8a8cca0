"""Where the loop stands between two decisions: a frozen value, `decide()` answers a new one.
What the published snapshot says (the machine's state, the route, the counters) is not kept
here: `decide()` reads it from the `Status` itself."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["LoopState"]


@dataclass(frozen=True)
class LoopState:
    """Everything the loop remembers between two decisions (nothing else is kept)."""

    fleet: int = 1
    """How many clients register with the same server (spreads probes and first contact)."""
    url: str = ""
    """The server's URL as shown, for the log lines."""
    ever_registered: bool = False
    # -- registering
    startup: bool = True
    """No registration was ever accepted when this run of attempts began: the budget counts."""
    started: float = 0.0
    """When this run of attempts began (monotonic seconds)."""
    streak: int = 0
    """Counted failed attempts in this run."""
    due: float | None = None
    """While refused: when the next counted attempt is due (probes before it are free)."""
    looked: bool = False
    """The server answered a look since this run began: no look before the next attempt."""
    refused: bool = False
    """The last attempt was refused: nothing listened, nothing to look at."""
    unanswered: int = 0
    """Looks still owed after an attempt that may have reached the server unanswered."""
    delay: float = 0.0
    """The wait chosen with a `Fail`, taken once the policy answers."""
    holding: bool = False
    """The last attempt was held by a `Gated` transport (said once per hold)."""
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
