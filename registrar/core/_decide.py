"""The loop's decisions: one pure function from where the loop stands and what just happened to
what it does next, and the only place that decides a status change (docs/architecture.md, "One
registration, step by step")."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from logging import CRITICAL, ERROR, INFO, WARNING
from typing import assert_never

from . import _actions as act
from . import _backoff as delays
from ._actions import Decision, LoopState, Note
from ._board import Changes, State, Status, Trigger
from ._redact import clean
from ._settings import EXIT_CODE, LoopSettings
from ._transport import Route, RouteCheck, Verdict

Draw = Callable[[], float]  # a random draw in [0, 1), asked only when a delay is chosen

MAX_BROKEN_CHECKS = 3
"""Checks in a row whose connection broke retried at the probe cadence, then the watch interval."""
LOOKS_AFTER_UNANSWERED = 3
"""Looks (route checks) made after an attempt that may have reached the server unanswered,
before it is sent again; each lost look waits the backoff."""
REPORT_CHECK_INTERVAL = 1.0
"""At most one route check per this many seconds is caused by `report_route_missing()`, however
often it is called (a decode failing every transfer calls it ~1000 times a second)."""
REPORT_LOG_INTERVAL = 60.0
"""At most one warning per this many seconds says that reports were contradicted by the server."""
MAX_ERROR_TEXT = 1000
"""An error or evidence text is cut here, whatever transport made it (see core.redact.clean)."""


def decide(  # noqa: PLR0913 - a pure function's inputs, each named
    settings: LoopSettings,
    status: Status,
    state: LoopState,
    seen: act.Observation,
    now: float,
    draw: Draw,
) -> Decision:
    """What to do after `seen`, at monotonic time `now`, the published snapshot being `status`."""
    given = _Given(settings, status, now, draw)
    match seen:
        case act.Stopping():
            decision = Decision(state, act.Stop())
        case act.Started():
            decision = _look_or_send(_new_run(state, now), now)
        case act.Waited():
            decision = _waited(given, state, seen)
        case act.Held():
            decision = _held(state, seen)
        case act.Looked():  # a look or an attempt ends a hold
            decision = _looked(given, replace(state, holding=False), seen)
        case act.Sent():
            decision = _sent(given, replace(state, holding=False), seen)
        case act.Answered():
            decision = _answered(state, seen, now)
        case act.Checked():
            decision = _checked(given, state, seen)
        case _:
            assert_never(seen)
    if isinstance(seen, act.Looked | act.Checked) and seen.check is not None:
        # What a check found is published whatever is decided on it.
        found = Changes(route=seen.check.route.value, server_reachable=seen.check.reachable)
        return _with(decision, found | {"last_check_at": seen.at, "last_request_at": seen.at})
    return decision


@dataclass(frozen=True)
class _Given:
    """What a decision is made from besides the loop's own state and what it just saw."""

    settings: LoopSettings
    status: Status
    now: float
    draw: Draw

    def retry_delay(self, streak: int, retry_after: float | None = None) -> float:
        return delays.retry_delay(
            self.settings.backoff, streak, self.draw(), retry_after, self.settings.max_retry_after
        )


def _waited(given: _Given, state: LoopState, seen: act.Waited) -> Decision:
    now = given.now
    if seen.kind is act.WaitKind.BACKOFF:
        return _look_or_send(state, now)
    if seen.kind is act.WaitKind.READY:
        # The startup budget counts from when there was something to offer, not from this wait.
        return _look_or_send(replace(state, started=now) if _budgeted(given, state) else state, now)
    if seen.kind is act.WaitKind.IDLE and seen.sign:
        spread = delays.contact_delay(state.fleet, given.draw())
        note = say("sign", state.url, spread)
        return Decision(state, act.Wait(spread, act.WaitKind.CONTACT), notes=(note,))
    if seen.kind is act.WaitKind.IDLE and seen.reports and state.last_check_started is not None:
        due = state.last_check_started + REPORT_CHECK_INTERVAL - now
        if due > 0:
            return Decision(state, act.Wait(due, act.WaitKind.REPORT_SLOT))
    return _check(state, now)


def _held(state: LoopState, seen: act.Held) -> Decision:
    notes = () if state.holding else (say("held", state.url, clean(seen.reason, 200)),)
    changes = Changes(last_error=f"not offered yet: {clean(seen.reason, MAX_ERROR_TEXT)}")
    wait = act.Wait(seen.interval, act.WaitKind.READY)
    return Decision(replace(state, holding=True), wait, changes=changes, notes=notes)


def _new_run(state: LoopState, now: float) -> LoopState:
    """A run of attempts begins (at start, or after the route went missing)."""
    return replace(
        state,
        startup=not state.ever_registered,
        started=now,
        streak=0,
        due=None,
        looked=False,
        refused=False,
        unanswered=0,
    )


def _after(state: LoopState, now: float, delay: float, notes: tuple[Note, ...] = ()) -> Decision:
    """Wait `delay` (if any), then look or send."""
    if delay > 0:
        return Decision(state, act.Wait(delay, act.WaitKind.BACKOFF), notes=notes)
    return replace(_look_or_send(state, now), notes=notes)


def _look_or_send(state: LoopState, now: float) -> Decision:
    # Look before the first registration until the server has answered a look once (not right
    # after a refusal: nothing listened), and after an attempt whose answer was lost.
    if (state.startup and not state.looked and not state.refused) or state.unanswered:
        return Decision(state, act.Look())
    return _send(state, now)


def _send(state: LoopState, now: float) -> Decision:
    return Decision(state, act.Send(state.streak + 1, state.due is None or now >= state.due))


def _with(decision: Decision, changes: Changes) -> Decision:
    return replace(decision, changes=changes | decision.changes)


def _looked(given: _Given, state: LoopState, seen: act.Looked) -> Decision:
    check = seen.check
    if check is not None and check.route is Route.PRESENT:
        ours = state.unanswered > 0
        note = say("ours arrived" if ours else "adopted", state.url, check.evidence)
        return _registered(given, state, seen.at, int(ours), note)
    reached = check.reachable if check is not None else given.status.server_reachable is True
    notes: tuple[Note, ...] = ()
    if check is not None and check.route is Route.CONFLICT:
        notes = (say("conflict", state.url, check.evidence),)
    state = replace(state, looked=state.looked or reached)
    if state.unanswered and check is not None and check.status_code == 503 and check.count != 0:
        # Our unanswered attempt may have arrived: a server not ready names no rank (SGLang's
        # 503) and any count above 0 may be ours; evidence that a route was forgotten since an
        # earlier registration (a refusal, a re-opened connection) says nothing of this one.
        # Look again later instead of sending: a second arrival would be counted twice, and a
        # topology that looks ready one rank early fails every request to the missing one. The
        # wait ends when the server is ready (200: ours arrived; 404: send) or empty (0: send).
        delay = given.retry_delay(max(state.streak, 1))
        hold = say("hold", state.url, check.evidence, delay)
        held = replace(state, unanswered=LOOKS_AFTER_UNANSWERED)
        return _after(held, given.now, delay, (*notes, hold))
    if state.unanswered and not reached:
        # The look was lost too: look again after the backoff while looks are owed.
        state = replace(state, unanswered=state.unanswered - 1)
        if state.unanswered:
            return _after(state, given.now, given.retry_delay(max(state.streak, 1)), notes)
    return replace(_send(replace(state, unanswered=0), given.now), notes=notes)


def _sent(given: _Given, state: LoopState, seen: act.Sent) -> Decision:
    outcome, now, status = seen.outcome, given.now, given.status
    changes = Changes(server_reachable=outcome.reachable, last_request_at=seen.at)
    if not seen.free:
        changes["attempts_total"] = status.attempts_total + 1
    if outcome.verdict is Verdict.ACCEPTED:
        number = state.streak + 1
        again = "registered again" if state.ever_registered else "registered"
        note = say("accepted", again, state.url, number, "" if number == 1 else "s")
        # What a look found before this PUT says nothing about the route now.
        return _with(_registered(given, state, seen.at, 1, note), changes | {"route": None})
    changes["last_error"] = outcome.error
    retry = outcome.verdict is Verdict.RETRY
    refused = outcome.refused and retry
    lost = retry and not (refused or outcome.unsent or outcome.reachable)
    unanswered = LOOKS_AFTER_UNANSWERED if lost else state.unanswered
    state = replace(state, refused=refused, unanswered=unanswered)
    probe_wait = delays.probe_delay(state.fleet, given.draw()) if refused else 0.0
    # A free probe, unless the next would start past `max_elapsed`: then this was the last try.
    if seen.free and not (_budgeted(given, state) and _out_of_time(given, state, probe_wait)):
        return _with(_after(state, now, probe_wait), changes)
    state = replace(state, streak=state.streak + 1)
    if outcome.verdict is Verdict.FATAL:
        return _with(_fatal(given, state, outcome.error), changes)
    backoff = given.retry_delay(state.streak, outcome.retry_after)
    due, delay = (now + backoff, probe_wait) if refused else (None, backoff)
    state = replace(state, due=due)
    limit, number = given.settings.max_attempts, state.streak
    if _budgeted(given, state) and (number == limit or _out_of_time(given, state, delay)):
        return _with(_fail(given, replace(state, delay=delay), outcome.error, False), changes)
    label = str(number)
    if limit is not None:
        background = number > limit or status.state is State.FAILED
        label = f"{number} (background)" if background else f"{number}/{limit}"
    if due is None:
        note = say("failed", label, state.url, outcome.error, delay)
    else:
        every = delays.probe_delay(state.fleet, 0.5)
        note = say("failed, probing", label, state.url, outcome.error, delay, every, due - now)
    return _with(_after(state, now, delay, (note,)), changes)


def _budgeted(given: _Given, state: LoopState) -> bool:
    """The startup budget applies: no registration yet, and it is not spent already."""
    return state.startup and given.status.state is State.REGISTERING


def _out_of_time(given: _Given, state: LoopState, delay: float) -> bool:
    """Whether the next attempt would start past `max_elapsed`: the budget is spent now rather
    than after a wait that can only end over it."""
    limit = given.settings.max_elapsed
    return limit is not None and given.now - state.started + delay > limit


def _fail(given: _Given, state: LoopState, error: str | None, fatal: bool) -> Decision:
    policy = given.settings.on_failure
    name = policy if isinstance(policy, str) else getattr(policy, "__name__", "callable")
    if fatal:
        note = say("refused for good", state.url, error, name)
    else:
        plural = "" if state.streak == 1 else "s"
        note = say("given up", state.url, state.streak, plural, error, name)
    return Decision(state, act.Fail(state.streak, fatal), notes=(note,))


def _fatal(given: _Given, state: LoopState, error: str | None) -> Decision:
    """A refused configuration (a token, a URL, a certificate) may be fixed on the server's side:
    with "retry", try again slowly, at the backoff's cap."""
    backoff = given.settings.backoff
    delay = backoff.maximum * (1 - backoff.jitter * given.draw())
    state = replace(state, due=None, delay=delay)
    if given.status.state is State.FAILED:
        return _after(state, given.now, delay, (say("still refused", state.url, error, delay),))
    return _fail(given, state, error, True)


def _answered(state: LoopState, seen: act.Answered, now: float) -> Decision:
    """FAILED, and what the policy answered: attempts go on in the background, or the loop ends."""
    if seen.answer == "retry":
        retry = (say("retry", state.delay),)
        return replace(_after(state, now, state.delay, retry), trigger=Trigger.GIVE_UP)
    code = EXIT_CODE if seen.answer == "exit" else None
    notes = () if code is None else (say("exit", code),)
    changes = Changes(next_attempt_at=None, retrying=False)
    return Decision(state, act.Stop(code), Trigger.GIVE_UP, changes, notes)


def _registered(given: _Given, state: LoopState, at: float, added: int, note: Note) -> Decision:
    """Accepted, or found present: `added` registrations more (0 for an adoption)."""
    changes = Changes(attempt=0, last_error=None, next_attempt_at=None, retrying=False)
    changes |= {"registrations": given.status.registrations + added, "last_success_at": at}
    # Check at once (the check right after the PUT or the adoption), then watch.
    watching = replace(state, ever_registered=True, checks=0, probing=False, broken=0)
    decision = _check(watching, given.now, just_put=True)
    return replace(decision, trigger=Trigger.SUCCEED, changes=changes, notes=(note,))


def _check(state: LoopState, now: float, just_put: bool = False) -> Decision:
    state = replace(state, just_put=just_put, checks=state.checks + 1, last_check_started=now)
    return Decision(state, act.Check())


def _watch_next(given: _Given, state: LoopState, notes: tuple[Note, ...] = ()) -> Decision:
    if state.probing or state.broken:
        # Probing already: a report cannot make it sooner, and must not loop (reports come ~1000/s).
        wait = act.Wait(delays.probe_delay(state.fleet, given.draw()), act.WaitKind.PROBE)
        return Decision(state, wait, notes=notes)
    interval = given.settings.watch_interval
    spread = delays.first_watch_delay if state.checks == 1 else delays.watch_delay
    delay = None if interval is None else spread(interval, given.draw())
    return Decision(state, act.Wait(delay, act.WaitKind.IDLE), notes=notes)


def _checked(given: _Given, state: LoopState, seen: act.Checked) -> Decision:
    check = seen.check
    if check is None:
        if seen.reported:
            reported = replace(state, lost_after_put=0)
            return _lose(given, reported, "the runtime reported the route missing")
        return _watch_next(given, state)
    if check.route is Route.UNREACHABLE:
        return _unreachable(given, state, check)
    state = replace(state, probing=False, broken=0)
    if check.route is Route.MISSING:
        # Lost again right after our own PUT: the streak survives re-registration, so the
        # window before the next PUT keeps growing instead of PUTting in a loop.
        lost = state.lost_after_put + 1 if state.just_put else 0
        return _lose(given, replace(state, lost_after_put=lost), check.evidence)
    if check.route is Route.PRESENT:
        state = replace(state, lost_after_put=0)
    notes: tuple[Note, ...] = ()
    if check.route is Route.CONFLICT:
        notes = (say("route conflict", state.url, check.evidence),)
    elif seen.reported:
        # Said at most once per REPORT_LOG_INTERVAL, for every report contradicted since.
        unheeded = state.unheeded + seen.reported
        last = state.unheeded_logged_at
        if last is not None and given.now - last < REPORT_LOG_INTERVAL:
            state = replace(state, unheeded=unheeded)
        else:
            plural = "" if unheeded == 1 else "s"
            notes = (say("unheeded", unheeded, plural, check.route.value, check.evidence),)
            state = replace(state, unheeded=0, unheeded_logged_at=given.now)
    return _watch_next(given, state, notes)


def _unreachable(given: _Given, state: LoopState, check: RouteCheck) -> Decision:
    every = delays.probe_delay(state.fleet, 0.5)
    if check.refused:
        notes = () if state.probing else (say("refused", state.url, check.evidence, every),)
        return _watch_next(given, replace(state, probing=True), notes)
    state = replace(state, probing=False)
    if check.broken and state.broken < MAX_BROKEN_CHECKS:
        # A reset while a server goes away (a connection accepted by the dying process): look
        # again soon, as for a refusal, a few times at most.
        note = say("broken", state.url, check.evidence, every)
        return _watch_next(given, replace(state, broken=state.broken + 1), (note,))
    note = say("check failed", state.url, check.evidence)
    return _watch_next(given, replace(state, broken=0), (note,))


def _lose(given: _Given, state: LoopState, evidence: str) -> Decision:
    """Back to registering; no wait before the first re-attempt the first time (the check that
    found the route missing was the fleet's spread first contact)."""
    delay = delays.rejoin_delay(given.settings.backoff, state.lost_after_put, given.draw())
    note = say("lost", state.url, evidence, delay)
    decision = _after(_new_run(state, given.now), given.now, delay, (note,))
    lost = Changes(reregistrations=given.status.reregistrations + 1, retrying=True)
    return replace(_with(decision, lost), trigger=Trigger.LOSE)


# The loop's log lines by name, made into `Note`s: `decide` returns them, the runner logs them.
_LINES: dict[str, tuple[int, str]] = {
    "accepted": (INFO, "%s with %s after %d attempt%s"),
    "adopted": (INFO, "%s already holds our route (%s): adopted without registering again"),
    "ours arrived": (
        INFO,
        "%s already holds our route (%s): our last attempt arrived though its answer was lost; "
        "not sent again",
    ),
    "sign": (
        INFO,
        "%s: a sign the route may be gone (connection closed or watch event); checking in %.3f s",
    ),
    "held": (INFO, "%s: not offered yet: %s"),
    "conflict": (
        WARNING,
        "%s already holds our rank at another address (%s); registering anyway: a server that "
        "counts every registration (as SGLang's does) will count this rank twice",
    ),
    "hold": (
        WARNING,
        "our last attempt to %s went unanswered and the server now says %s; it names no rank "
        "before the topology is ready, so the attempt may have arrived: not sending it again, "
        "looking again in %.2f s",
    ),
    "still refused": (WARNING, "registration with %s still refused: %s; next attempt in %.2f s"),
    "route conflict": (WARNING, "route conflict at %s: %s"),
    "refused": (
        WARNING,
        "route check at %s failed: %s; probing every ~%.2f s until it listens again",
    ),
    "broken": (INFO, "route check at %s failed: %s; checking again in ~%.2f s"),
    "check failed": (WARNING, "route check at %s failed: %s; checking again at the next interval"),
    "lost": (WARNING, "route at %s is missing (%s); registering again in %.2f s"),
    "failed": (WARNING, "registration attempt %s to %s failed: %s; next attempt in %.2f s"),
    "failed, probing": (
        WARNING,
        "registration attempt %s to %s failed: %s; next attempt in %.2f s "
        "(nothing listens: probing every ~%.2f s, the next counted attempt in %.2f s)",
    ),
    "refused for good": (
        ERROR,
        "registration with %s refused: %s; retrying cannot help until the configuration is "
        "fixed; on_failure=%s",
    ),
    "given up": (ERROR, "registration with %s failed after %d attempt%s, last: %s; on_failure=%s"),
    "retry": (WARNING, "still trying in the background; next attempt in %.2f s"),
    "exit": (CRITICAL, "ending the process with status %d (on_failure='exit')"),
    "unheeded": (
        WARNING,
        "route reported missing %d time%s, but the server says %s (%s); not registering again",
    ),
}


def say(line: str, *args: object) -> Note:
    level, message = _LINES[line]
    return Note(level, message, args)
