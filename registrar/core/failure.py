"""What happens when the startup budget is spent, or the server refuses the configuration: the
`on_failure` policy ("retry", "stop", "exit", or a callable answering one of them)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from .actions import Fail
from .board import StatusBoard
from .clock import Clock
from .machine import State, Trigger
from .status import Status

__all__ = [
    "EXIT_CODE",
    "POLICIES",
    "OnFailure",
    "OnFailureName",
    "Policy",
    "apply_policy",
    "default_exit",
]

logger = logging.getLogger("registrar")

OnFailureName = Literal["retry", "stop", "exit"]
OnFailure = OnFailureName | Callable[[Status], OnFailureName | None]
"""What to do when the startup budget is spent. A callable is given the FAILED status and
answers with one of the names (None means "stop")."""
POLICIES = ("retry", "stop", "exit")
EXIT_CODE = 3
"""Process exit status for on_failure="exit"."""


def default_exit(code: int) -> None:
    """End the process now: the registrar's thread cannot raise SystemExit into the main one."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _name(policy: OnFailure) -> str:
    return policy if isinstance(policy, str) else getattr(policy, "__name__", "callable")


def _log_failure(url: str, policy: OnFailure, action: Fail) -> None:
    if action.fatal:
        logger.error(
            "registration with %s refused: %s; retrying cannot help until the "
            "configuration is fixed; on_failure=%s",
            url,
            action.error,
            _name(policy),
        )
        return
    logger.error(
        "registration with %s failed after %d attempt%s, last: %s; on_failure=%s",
        url,
        action.attempts,
        "" if action.attempts == 1 else "s",
        action.error,
        _name(policy),
    )


def _ask(policy: Callable[[Status], Any], preview: Status) -> str:
    """The callable's answer, "stop" when it fails or answers something else."""
    try:
        decided = policy(preview)
    except Exception:
        logger.exception("on_failure callable failed; staying failed")
        return "stop"
    if decided is None:
        return "stop"
    if decided not in POLICIES:
        logger.error("on_failure callable answered %r; staying failed", decided)
        return "stop"
    return str(decided)


@dataclass(frozen=True)
class Policy:
    """What is done when the startup budget is spent, and how the process exits."""

    on_failure: OnFailure
    exit: Callable[[int], None]


def apply_policy(
    board: StatusBoard, clock: Clock, rule: Policy, action: Fail, stopping: Callable[[], bool]
) -> bool:
    """Go to FAILED and apply `rule.on_failure`. True when attempts go on."""
    policy = rule.on_failure
    _log_failure(board.status.url, policy, action)
    failed: dict[str, Any] = {"next_attempt_at": None, "retrying": False}
    if callable(policy):
        # The callable is given the FAILED snapshot before it is published, so that no
        # reader sees "failed, nothing scheduled" while it decides to retry.
        decided = _ask(policy, replace(board.status, state=State.FAILED, **failed))
    else:
        decided = policy
    go_on = decided == "retry" and not stopping()
    if go_on:
        failed.update(next_attempt_at=clock.time() + action.delay, retrying=True)
    if not board.transition(Trigger.GIVE_UP, **failed):
        board.update(**failed)
    if go_on:
        logger.warning("still trying in the background; next attempt in %.2f s", action.delay)
        return True
    if decided == "exit":
        logger.critical("ending the process with status %d (on_failure='exit')", EXIT_CODE)
        rule.exit(EXIT_CODE)
    return False
