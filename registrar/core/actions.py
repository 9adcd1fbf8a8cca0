"""The loop's vocabulary: what just happened (an `Observation`) and what to do next (an
`Action`), with the `Decision` that pairs the next action with the loop's next state.

`registrar.core.decide` answers one from the other; `registrar.core.runner` performs actions
and reports observations. Values only: nothing here does anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .loopstate import LoopState
from .machine import Trigger
from .outcome import RegisterOutcome, RouteCheck

__all__ = [
    "Action",
    "Answered",
    "Check",
    "Checked",
    "Decision",
    "Fail",
    "Look",
    "Looked",
    "Note",
    "Observation",
    "Probe",
    "Send",
    "Sent",
    "Started",
    "Stop",
    "Stopping",
    "Wait",
    "WaitKind",
    "Waited",
]


class WaitKind(StrEnum):
    """Which wait, for the runner: what ends it early and what it publishes."""

    BACKOFF = "backoff"
    """Before an attempt: published as `next_attempt_at`; only a stop ends it early."""
    PROBE = "probe"
    """Nothing listens (or the connection broke): look again soon, whatever is reported."""
    IDLE = "idle"
    """Between route checks, on the transport's idle connection or the clock; a report or a
    sign the route may be gone (`Waited.sign`) ends it."""
    CONTACT = "contact"
    """After a sign, spreading the fleet's checks; a report ends it."""
    REPORT_SLOT = "report_slot"
    """Holding a report-driven check until REPORT_CHECK_INTERVAL since the last check."""
    READY = "ready"
    """Holding an attempt while a `Gated` transport has nothing to offer (the served process
    is not ready); performed by the runner in place of the attempt; only a stop ends it."""


# ----------------------------------------------------------------- what happened


@dataclass(frozen=True)
class Started:
    """The loop's thread began."""


@dataclass(frozen=True)
class Waited:
    """A wait ended: on time, by a report, or (idle only) on a sign the route may be gone."""

    kind: WaitKind
    sign: bool = False
    reports: int = 0
    """Route-missing reports pending when it ended."""


@dataclass(frozen=True)
class Looked:
    """The route as found before an attempt (None: the protocol cannot check)."""

    check: RouteCheck | None


@dataclass(frozen=True)
class Sent:
    """An attempt's (or a probe's) outcome."""

    outcome: RegisterOutcome


@dataclass(frozen=True)
class Checked:
    """A route check's result while registered, and the reports it answers."""

    check: RouteCheck | None
    reported: int = 0


@dataclass(frozen=True)
class Answered:
    """The `on_failure` policy's answer: attempts go on (True) or the loop ends."""

    go_on: bool


@dataclass(frozen=True)
class Stopping:
    """`stop()` was called."""


Observation = Started | Waited | Looked | Sent | Checked | Answered | Stopping

# ----------------------------------------------------------------- what to do


@dataclass(frozen=True)
class Wait:
    delay: float | None
    """Seconds; None: until woken (a watch with no interval)."""
    kind: WaitKind


@dataclass(frozen=True)
class Look:
    """Check the route before an attempt. `ours`: after our own attempt whose answer was lost."""

    ours: bool = False


@dataclass(frozen=True)
class Send:
    """Send the registration; attempt `number` of this run counts against the budget."""

    number: int


@dataclass(frozen=True)
class Probe:
    """Send the registration outside the backoff schedule while refused: free, not counted."""

    number: int


@dataclass(frozen=True)
class Check:
    """Check the route while registered (take the pending reports with it)."""


@dataclass(frozen=True)
class Fail:
    """Enter FAILED and ask `on_failure`; the runner answers with `Answered`."""

    attempts: int
    error: str | None
    delay: float
    """The wait before the next attempt, should they go on."""
    fatal: bool
    """Retrying cannot help until the configuration is fixed."""


@dataclass(frozen=True)
class Stop:
    """The loop ends."""


Action = Wait | Look | Send | Probe | Check | Fail | Stop


@dataclass(frozen=True)
class Note:
    """One log line, as `logger.log(level, message, *args)`."""

    level: int
    message: str
    args: tuple[object, ...] = ()


@dataclass(frozen=True)
class Decision:
    state: LoopState
    action: Action
    trigger: Trigger | None = None
    """Fired (with the snapshot's changes) before the action is performed."""
    notes: tuple[Note, ...] = ()
