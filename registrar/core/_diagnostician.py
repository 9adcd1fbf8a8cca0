"""When to diagnose: after `after` seconds of requests that reached no bootstrap server, probe
once (off the registrar's thread), state the diagnosis once at WARNING and publish it; clear it
as soon as the server answers. A listener like any other: the loop does not know it exists."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ._board import RequestEvent, StatusBoard
from ._clock import Clock
from ._diagnosis import Code, Diagnosis, Evidence, diagnose
from ._machine import State
from ._status import Changes, Status

logger = logging.getLogger("registrar")

_ANSWERED = frozenset({"accepted", "present", "missing", "conflict", "undetermined"})
"""Request results that mean a bootstrap server answered as one (a route check's findings)."""


class Diagnostician:
    """Watches one registrar's requests (on `board`); `gather` probes for evidence."""

    def __init__(
        self, board: StatusBoard, gather: Callable[[], Evidence], clock: Clock, after: float
    ) -> None:
        self._board = board
        self._gather = gather
        self._clock = clock
        self._after = after
        self._lock = threading.Lock()
        self._since: float | None = None  # when this run of unanswered requests began
        self._busy = False  # a probe is running, or this run was diagnosed already (once)
        self._run = 0  # counts runs: a probe's finding for a run that ended is dropped
        self._denied = False  # the last registration was refused for its credential (401/403)

    def on_request(self, event: RequestEvent) -> None:
        """After every request (on the registrar's thread): start, end, or probe a run."""
        now = self._clock.monotonic()
        if event.kind == "register":
            self._denied = event.status_code in (401, 403)
        if event.result in _ANSWERED:
            with self._lock:
                self._since, self._busy = None, False
                self._run += 1
            shown = self._board.status.diagnosis
            if shown is not None:
                self._board.apply(None, Changes(diagnosis=None))
                logger.info("diagnosis %s cleared: the bootstrap server answers", shown.code)
            return
        with self._lock:
            if self._since is None:
                self._since = now
            due = not self._busy and not self._denied and now - self._since >= self._after
            self._busy |= due
            run = self._run
        if due:
            # Off the registrar's thread: a probe may take a few connect timeouts, and the loop's
            # timing must not change because a diagnosis is being made.
            threading.Thread(
                target=self._diagnose, args=(run,), name="registrar-diagnosis", daemon=True
            ).start()

    def on_transition(self, old: State, new: State, status: Status) -> None:
        """Given up for good: no request will come to reach the threshold, so probe now, on
        this thread: with on_failure="exit" the process ends right after, and the diagnosis is
        what its last lines should say (the probe's steps are bounded)."""
        if new is not State.FAILED or (status.retrying and not self._denied):
            return
        with self._lock:
            if self._busy:
                return
            self._busy = True
            run = self._run
        if self._denied and status.last_error:
            # The server's own words name the credential (and where to set it); a probe sends
            # none, and a server whose GETs are open would look healthy to it.
            denied = Diagnosis(Code.DENIED, status.last_error)
            self._board.apply(None, Changes(diagnosis=denied))
            self._say(denied)
            return
        self._diagnose(run)

    def _diagnose(self, run: int) -> None:
        try:
            found = diagnose(self._gather())
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
            self._board.apply(None, Changes(diagnosis=found))
        self._say(found)

    def _say(self, found: Diagnosis) -> None:
        status = self._board.status
        logger.warning(
            "registration with %s: %s [diagnosis %s]%s",
            status.url,
            found.sentence,
            found.code,
            "; still trying" if status.retrying else "",
        )
