"""The loop's longer log lines, made from its state (values only: `decide` returns them as
`Note`s and the runner logs them)."""

from __future__ import annotations

import logging
from dataclasses import replace

from .actions import Note
from .backoff import probe_delay
from .loopstate import LoopConfig, LoopState
from .machine import State
from .outcome import RegisterOutcome, RouteCheck

REPORT_LOG_INTERVAL = 60.0
"""At most one warning per this many seconds says that reports were contradicted by the server."""

__all__ = ["REPORT_LOG_INTERVAL", "attempt_label", "failed_attempt", "unheeded"]


def failed_attempt(
    config: LoopConfig, state: LoopState, outcome: RegisterOutcome, delay: float, now: float
) -> Note:
    label = attempt_label(config, state)
    if state.due is None:
        return Note(
            logging.WARNING,
            "registration attempt %s to %s failed: %s; next attempt in %.2f s",
            (label, config.url, outcome.error, delay),
        )
    return Note(
        logging.WARNING,
        "registration attempt %s to %s failed: %s; next attempt in %.2f s "
        "(nothing listens: probing every ~%.2f s, the next counted attempt in %.2f s)",
        (
            label,
            config.url,
            outcome.error,
            delay,
            probe_delay(config.fleet, 0.5),
            state.due - now,
        ),
    )


def attempt_label(config: LoopConfig, state: LoopState) -> str:
    number = state.streak
    if config.max_attempts is None:
        return str(number)
    if number <= config.max_attempts and state.state is not State.FAILED:
        return f"{number}/{config.max_attempts}"
    return f"{number} (background)"


def unheeded(
    config: LoopConfig, state: LoopState, check: RouteCheck, reported: int, now: float
) -> tuple[LoopState, tuple[Note, ...]]:
    """Say (at most once per REPORT_LOG_INTERVAL) that reports were contradicted."""
    unheeded = state.unheeded + reported
    last = state.unheeded_logged_at
    if last is not None and now - last < REPORT_LOG_INTERVAL:
        return replace(state, unheeded=unheeded), ()
    note = Note(
        logging.WARNING,
        "route reported missing %d time%s, but the server says %s (%s); not registering again",
        (unheeded, "" if unheeded == 1 else "s", check.route.value, check.evidence),
    )
    return replace(state, unheeded=0, unheeded_logged_at=now), (note,)
