"""The loop's vocabulary (values only): what just happened (`Observation`), what to do next
(`Action`), where the loop stands between decisions (`LoopState`), the `Decision` pairing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from ._board import Changes, Trigger
from ._settings import OnFailureName
from ._transport import RegisterOutcome, RouteCheck, Verdict


class WaitKind(StrEnum):
    """Which wait: what ends it early (a stop ends any) and what it publishes."""

    BACKOFF = "backoff"  # before an attempt: published as `next_attempt_at`
    PROBE = "probe"  # nothing listens (or the connection broke): look again soon, reports or not
    IDLE = "idle"  # between route checks (idle connection or clock); a report or a sign ends it
    CONTACT = "contact"  # after a sign, spreading the fleet's checks; a report ends it
    REPORT_SLOT = "report_slot"  # a report-driven check, held REPORT_CHECK_INTERVAL after the last
    READY = "ready"  # holding an attempt while a `Gated` transport has nothing to offer


@dataclass(frozen=True)
class Started:
    """The loop's thread began."""


@dataclass(frozen=True)
class Waited:
    kind: WaitKind
    sign: bool = False
    reports: int = 0  # route-missing reports pending when it ended


@dataclass(frozen=True)
class Looked:
    """The route found before an attempt (None: the protocol cannot check); `at`: wall clock."""

    check: RouteCheck | None
    at: float


@dataclass(frozen=True)
class Sent:
    """An attempt's (or a probe's) outcome, and when it ended (wall clock)."""

    outcome: RegisterOutcome
    scheduled: bool  # `Send.scheduled`
    at: float

    @property
    def free(self) -> bool:
        """A refused probe: neither counted against the budget nor reported as a request."""
        return not self.scheduled and self.outcome.refused and self.outcome.verdict is Verdict.RETRY


@dataclass(frozen=True)
class Checked:
    """A route check's result while registered, the reports it answers, and when it ended."""

    check: RouteCheck | None
    reported: int
    at: float


@dataclass(frozen=True)
class Held:
    """A `Gated` transport has nothing to offer yet (the served process is not ready)."""

    reason: str
    interval: float  # the transport's `ready_interval`


@dataclass(frozen=True)
class Answered:
    """The `on_failure` policy's answer ("retry" only if the registrar is not stopping)."""

    answer: OnFailureName


@dataclass(frozen=True)
class Stopping:
    """`stop()` was called."""


Observation = Started | Waited | Looked | Sent | Checked | Held | Answered | Stopping


@dataclass(frozen=True)
class Wait:
    delay: float | None  # None: until woken (a watch with no interval)
    kind: WaitKind


@dataclass(frozen=True)
class Look:
    """Check the route before an attempt (before the first, or after one whose answer was lost)."""


@dataclass(frozen=True)
class Send:
    """Send the registration; attempt `number` of this run counts against the budget, unless it
    is a probe outside the backoff schedule (not `scheduled`) while refused: then it is free."""

    number: int
    scheduled: bool = True


@dataclass(frozen=True)
class Check:
    """Check the route while registered (take the pending reports with it)."""


@dataclass(frozen=True)
class Fail:
    """Ask `on_failure` (the startup budget is spent, or the configuration refused); the runner
    answers with `Answered`, and the decision on it enters FAILED."""

    attempts: int
    fatal: bool  # retrying cannot help until the configuration is fixed


@dataclass(frozen=True)
class Stop:
    """The loop ends; with `exit_code`, the process too (on_failure="exit")."""

    exit_code: int | None = None


Action = Wait | Look | Send | Check | Fail | Stop


@dataclass(frozen=True)
class Note:
    """One log line, as `logger.log(level, message, *args)`."""

    level: int
    message: str
    args: tuple[object, ...] = ()


@dataclass(frozen=True)
class LoopState:
    """Everything the loop remembers between two decisions (nothing else is kept)."""

    fleet: int = 1  # clients registering with the same server (spreads probes, first contact)
    url: str = ""  # as shown, for the log lines
    ever_registered: bool = False
    # -- registering
    startup: bool = True  # no registration accepted when this run began: the budget counts
    started: float = 0.0  # when this run of attempts began (monotonic seconds)
    streak: int = 0  # counted failed attempts in this run
    due: float | None = None  # while refused: the next counted attempt (probes before it: free)
    looked: bool = False  # the server answered a look in this run: no look before an attempt
    refused: bool = False  # the last attempt was refused: nothing listened, nothing to look at
    unanswered: int = 0  # looks owed after an attempt that may have reached the server unanswered
    delay: float = 0.0  # the wait chosen with a `Fail`, taken should the policy answer "retry"
    holding: bool = False  # the last attempt was held by a `Gated` transport (said once)
    # -- watching
    just_put: bool = False  # the check in flight is the one right after a PUT (or an adoption)
    checks: int = 0
    probing: bool = False  # the last check was refused (server down): checks at probe cadence
    broken: int = 0  # checks in a row whose connection broke
    lost_after_put: int = 0  # times in a row the route was missing right after our own PUT
    last_check_started: float | None = None
    unheeded: int = 0  # reports the server contradicted, not yet logged
    unheeded_logged_at: float | None = None


@dataclass(frozen=True)
class Decision:
    state: LoopState
    action: Action
    trigger: Trigger | None = None  # fired with `changes`, in one snapshot, before the action
    # The status fields this decision sets (a BACKOFF wait also publishes when it ends).
    changes: Changes = field(default_factory=Changes)
    notes: tuple[Note, ...] = ()
