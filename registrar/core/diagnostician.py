"""When to diagnose: after `after` seconds of requests that reached no bootstrap server, probe
once (off the registrar's thread), state the diagnosis once at WARNING and publish it; clear it
as soon as the server answers. A diagnosis changes words, never what the loop does.

It listens to the registrar like any listener (each request, each transition), so the loop does
not know it exists.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from .board import RequestEvent
from .clock import Clock
from .diagnosis import Diagnosis, Evidence, diagnose
from .machine import State
from .status import Status

__all__ = ["Diagnostician", "Hooks", "answered"]

logger = logging.getLogger("registrar")

_ANSWERED = frozenset({"accepted", "present", "missing", "conflict", "undetermined"})
"""Request results that mean a bootstrap server answered as one (a route check's findings)."""


def answered(event: RequestEvent) -> bool:
    """Whether the request reached a bootstrap server that answered as one."""
    return event.result in _ANSWERED


@dataclass(frozen=True)
class Hooks:
    """What the diagnostician reads and writes: the registrar's status and its diagnosis field,
    and how it gathers evidence (a probe over the network)."""

    status: Callable[[], Status]
    publish: Callable[[Diagnosis | None], None]
    gather: Callable[[], Evidence]


class Diagnostician:
    """Watches one registrar's requests; see the module docstring."""

    def __init__(self, hooks: Hooks, clock: Clock, after: float) -> None:
        self._hooks = hooks
        self._clock = clock
        self._after = after
        self._lock = threading.Lock()
        self._since: float | None = None
        """When the current run of unanswered requests began (None: the server answers)."""
        self._busy = False
        """A probe is running, or this run was diagnosed already (stated once)."""
        self._run = 0
        """Counts runs: a probe's finding for a run that ended is dropped."""

    def on_request(self, event: RequestEvent) -> None:
        """After every request (on the registrar's thread): start, end, or probe a run."""
        now = self._clock.monotonic()
        if answered(event):
            self._clear()
            return
        with self._lock:
            if self._since is None:
                self._since = now
            due = not self._busy and now - self._since >= self._after
            if due:
                self._busy = True
            run = self._run
        if due:
            self._probe(run)

    def on_transition(self, old: State, new: State, status: Status) -> None:
        """Given up for good: no request will come to reach the threshold, so probe now, on
        this thread: with on_failure="exit" the process ends right after, and the diagnosis is
        what its last lines should say (the probe's steps are bounded)."""
        if new is not State.FAILED or status.retrying:
            return
        with self._lock:
            if self._busy:
                return
            self._busy = True
            run = self._run
        self._diagnose(run)

    def _clear(self) -> None:
        with self._lock:
            self._since = None
            self._busy = False
            self._run += 1
        shown = self._hooks.status().diagnosis
        if shown is not None:
            self._hooks.publish(None)
            logger.info("diagnosis %s cleared: the bootstrap server answers", shown.code)

    def _probe(self, run: int) -> None:
        # Off the registrar's thread: a probe may take a few connect timeouts, and the loop's
        # timing must not change because a diagnosis is being made.
        worker = threading.Thread(
            target=self._diagnose, args=(run,), name="registrar-diagnosis", daemon=True
        )
        worker.start()

    def _diagnose(self, run: int) -> None:
        try:
            found = diagnose(self._hooks.gather())
        except Exception:
            logger.exception("the diagnosis probe failed; no diagnosis")
            found = None
        with self._lock:
            if run != self._run:
                return  # the server answered meanwhile: what the probe saw is old
            if found is None:
                # A bootstrap server answers the probe: nothing to say yet; look again later.
                self._since, self._busy = self._clock.monotonic(), False
                return
            self._hooks.publish(found)
        status = self._hooks.status()
        logger.warning(
            "registration with %s: %s [diagnosis %s]%s",
            status.url,
            found.sentence,
            found.code,
            "; still trying" if status.retrying else "",
        )
