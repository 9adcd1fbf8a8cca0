"""The loop's decisions: one pure function from where the loop stands and what just happened to
what it does next.

As in tenacity's `iter()`, deciding is kept apart from doing: `decide()` looks at an explicit
`LoopState` and the last `Observation` (an attempt's outcome, a route check, the end of a wait)
and answers a `Decision`: the next state, the one `Action` to perform (wait, probe, look, send,
check, fail, stop), the trigger to fire on the state machine, and the lines to log. It reads no
clock (the time is given), draws no random number of its own (`draw` is given), sends nothing
and sleeps nowhere; `registrar.core.runner` performs what it answers. A test can therefore drive
it through every state without threads, sockets or clocks (`tests/test_decide_explorer.py` explores
it against a model of SGLang's counting server).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from .actions import (
    Action,
    Answered,
    Check,
    Checked,
    Decision,
    Fail,
    Look,
    Looked,
    Note,
    Observation,
    Probe,
    Send,
    Sent,
    Started,
    Stop,
    Stopping,
    Wait,
    Waited,
    WaitKind,
)
from .backoff import (
    contact_delay,
    first_watch_delay,
    probe_delay,
    rejoin_delay,
    retry_delay,
    watch_delay,
)
from .loopstate import LoopConfig, LoopState, Phase
from .machine import State, Trigger
from .notes import REPORT_LOG_INTERVAL, failed_attempt, unheeded
from .outcome import RegisterOutcome, Route, RouteCheck, Verdict

__all__ = [
    "LOOKS_AFTER_UNANSWERED",
    "MAX_BROKEN_CHECKS",
    "REPORT_CHECK_INTERVAL",
    "REPORT_LOG_INTERVAL",
    "Draw",
    "decide",
]

Draw = Callable[[], float]
"""A random draw in [0, 1), asked only when a delay is chosen."""

MAX_BROKEN_CHECKS = 3
"""Route checks in a row whose connection broke that are retried at the probe cadence before
the loop falls back to the watch interval."""
LOOKS_AFTER_UNANSWERED = 3
"""Looks (route checks) made after an attempt that may have reached the server unanswered,
before it is sent again; each lost look waits the backoff."""
REPORT_CHECK_INTERVAL = 1.0
"""At most one route check per this many seconds is caused by `report_route_missing()`, however
often it is called (a decode failing every transfer calls it ~1000 times a second)."""


# ----------------------------------------------------------------- the function


def decide(
    config: LoopConfig, state: LoopState, seen: Observation, now: float, draw: Draw
) -> Decision:
    """What to do after `seen`, at monotonic time `now`; `draw` gives the random draws of the
    delays it chooses."""
    handler: Callable[..., Decision] = _HANDLERS[type(seen)]
    return handler(config, state, seen, now, draw)


def _stopping(
    config: LoopConfig, state: LoopState, seen: Stopping, now: float, draw: Draw
) -> Decision:
    return Decision(replace(state, phase=Phase.ENDED), Stop())


def _started(
    config: LoopConfig, state: LoopState, seen: Started, now: float, draw: Draw
) -> Decision:
    return _run_of_attempts(config, state, now, 0.0)


def _waited(config: LoopConfig, state: LoopState, seen: Waited, now: float, draw: Draw) -> Decision:
    if seen.kind is WaitKind.BACKOFF:
        return _look_or_send(state, now)
    if seen.kind is WaitKind.READY:
        # Waiting for the served process is not an attempt: the startup budget counts from
        # when there was something to offer.
        return _look_or_send(replace(state, started=now) if _budgeted(state) else state, now)
    if seen.kind is WaitKind.IDLE and seen.sign:
        spread = contact_delay(config.fleet, draw())
        note = Note(
            logging.INFO,
            "%s: a sign the route may be gone (connection closed or watch event); "
            "checking in %.3f s",
            (config.url, spread),
        )
        return Decision(state, Wait(spread, WaitKind.CONTACT), notes=(note,))
    if seen.kind is WaitKind.IDLE and seen.reports and state.last_check_started is not None:
        due = state.last_check_started + REPORT_CHECK_INTERVAL - now
        if due > 0:
            return Decision(state, Wait(due, WaitKind.REPORT_SLOT))
    return _check(state, now)


# ----------------------------------------------------------------- registering


def _run_of_attempts(
    config: LoopConfig, state: LoopState, now: float, delay: float, notes: tuple[Note, ...] = ()
) -> Decision:
    """Begin a run of attempts (at start, or after the route went missing)."""
    fresh = replace(
        state,
        phase=Phase.REGISTERING,
        startup=not state.ever_registered,
        started=now,
        streak=0,
        due=None,
        looked=False,
        refused=False,
        unanswered=0,
    )
    return _after(fresh, now, delay, notes)


def _after(state: LoopState, now: float, delay: float, notes: tuple[Note, ...] = ()) -> Decision:
    """Wait `delay` (if any), then look or send."""
    if delay > 0:
        return Decision(state, Wait(delay, WaitKind.BACKOFF), notes=notes)
    decision = _look_or_send(state, now)
    return replace(decision, notes=notes + decision.notes)


def _look_or_send(state: LoopState, now: float) -> Decision:
    # Look before the first registration until the server has answered a look once (not right
    # after a refusal: nothing listened), and after an attempt whose answer was lost.
    if (state.startup and not state.looked and not state.refused) or state.unanswered:
        return Decision(state, Look(ours=state.unanswered > 0))
    return _send(state, now)


def _send(state: LoopState, now: float) -> Decision:
    counted = state.due is None or now >= state.due
    number = state.streak + 1
    action: Action = Send(number) if counted else Probe(number)
    return Decision(replace(state, counted=counted), action)


def _looked(config: LoopConfig, state: LoopState, seen: Looked, now: float, draw: Draw) -> Decision:
    check = seen.check
    if check is not None:
        state = replace(state, reachable=check.reachable, route=check.route.value)
        if check.route is Route.PRESENT:
            return _adopted(config, state, check, now)
    notes: tuple[Note, ...] = ()
    if check is not None and check.route is Route.CONFLICT:
        notes = (
            Note(
                logging.WARNING,
                "%s already holds our rank at another address (%s); registering anyway: a "
                "server that counts every registration (as SGLang's does) will count this "
                "rank twice",
                (config.url, check.evidence),
            ),
        )
    reached = state.reachable is True
    state = replace(state, looked=state.looked or reached)
    if state.unanswered and check is not None and _may_hold_ours(check):
        held = _hold(config, state, check, now, draw)
        return replace(held, notes=(*notes, *held.notes))
    if state.unanswered and not reached:
        # The look was lost too: look again after the backoff (a few times) before sending
        # what the server may already hold.
        state = replace(state, unanswered=state.unanswered - 1)
        if state.unanswered:
            delay = retry_delay(
                config.backoff, max(state.streak, 1), draw(), None, config.max_retry_after
            )
            return _after(state, now, delay, notes)
    decision = _send(replace(state, unanswered=0), now)
    return replace(decision, notes=notes)


def _may_hold_ours(check: RouteCheck) -> bool:
    """Whether a look after our unanswered attempt cannot rule out that it arrived: a server
    that is not ready names no rank (SGLang's 503), and whatever else it counts, any count
    above 0 may be ours. Only a count of 0 (nothing registered, whatever the lifetime) or a
    404 from a ready server proves it absent; the evidence that a route was forgotten since
    an earlier registration (a refusal, a re-opened connection) says nothing about this one."""
    return check.status_code == 503 and (check.count is None or check.count > 0)


def _hold(
    config: LoopConfig, state: LoopState, check: RouteCheck, now: float, draw: Draw
) -> Decision:
    """Look again later instead of sending: a second arrival would be counted twice, and a
    topology that looks ready one rank early fails every request to the missing one. The
    wait ends when the server is ready (200: ours arrived; 404: send) or empty (0: send)."""
    delay = retry_delay(config.backoff, max(state.streak, 1), draw(), None, config.max_retry_after)
    note = Note(
        logging.WARNING,
        "our last attempt to %s went unanswered and the server now says %s; it names no rank "
        "before the topology is ready, so the attempt may have arrived: not sending it again, "
        "looking again in %.2f s",
        (config.url, check.evidence, delay),
    )
    held = replace(state, unanswered=LOOKS_AFTER_UNANSWERED)
    return _after(held, now, delay, (note,))


def _adopted(config: LoopConfig, state: LoopState, check: RouteCheck, now: float) -> Decision:
    ours = state.unanswered > 0
    note = Note(
        logging.INFO,
        "%s already holds our route (%s): %s",
        (
            config.url,
            check.evidence,
            "our last attempt arrived though its answer was lost; not sent again"
            if ours
            else "adopted without registering again",
        ),
    )
    state = replace(
        state,
        state=State.REGISTERED,
        ever_registered=True,
        registrations=state.registrations + (1 if ours else 0),
    )
    return replace(_watching(state, now), trigger=Trigger.SUCCEED, notes=(note,))


def _sent(config: LoopConfig, state: LoopState, seen: Sent, now: float, draw: Draw) -> Decision:
    outcome = seen.outcome
    state = replace(state, reachable=outcome.reachable)
    if outcome.verdict is Verdict.ACCEPTED:
        return _accepted(config, state, now)
    refused = outcome.refused and outcome.verdict is Verdict.RETRY
    lost = (
        outcome.verdict is Verdict.RETRY
        and not refused
        and not outcome.unsent
        and outcome.status_code is None
    )
    state = replace(
        state, refused=refused, unanswered=LOOKS_AFTER_UNANSWERED if lost else state.unanswered
    )
    probe_wait = probe_delay(config.fleet, draw()) if refused else 0.0
    if refused and not state.counted and not _last_probe(config, state, now, probe_wait):
        return _after(state, now, probe_wait)
    state = replace(state, streak=state.streak + 1)
    if outcome.verdict is Verdict.FATAL:
        return _fatal(config, state, outcome, draw(), now)
    delay = retry_delay(
        config.backoff, state.streak, draw(), outcome.retry_after, config.max_retry_after
    )
    due = None
    if refused:
        due, delay = now + delay, probe_wait
    state = replace(state, due=due)
    if _spent(config, state, now, delay):
        failing = Fail(state.streak, outcome.error, delay, fatal=False)
        return Decision(replace(state, delay=delay), failing)
    return _after(state, now, delay, (failed_attempt(config, state, outcome, delay, now),))


def _last_probe(config: LoopConfig, state: LoopState, now: float, delay: float) -> bool:
    """Whether the next probe would start past `max_elapsed`: this refusal is the last try."""
    return _budgeted(state) and _out_of_time(config, state, now, delay)


def _budgeted(state: LoopState) -> bool:
    """The startup budget applies: no registration yet, and it is not spent already."""
    return state.startup and state.state is State.REGISTERING


def _out_of_time(config: LoopConfig, state: LoopState, now: float, delay: float) -> bool:
    """Whether the next attempt would start past `max_elapsed`: the budget is spent now rather
    than after a wait that can only end over it."""
    if config.max_elapsed is None:
        return False
    return now - state.started + delay > config.max_elapsed


def _spent(config: LoopConfig, state: LoopState, now: float, delay: float) -> bool:
    if not _budgeted(state):
        return False
    if config.max_attempts is not None and state.streak == config.max_attempts:
        return True
    return _out_of_time(config, state, now, delay)


def _fatal(
    config: LoopConfig, state: LoopState, outcome: RegisterOutcome, u: float, now: float
) -> Decision:
    """Retrying cannot help until someone fixes the configuration (a token, a URL, a
    certificate), which may happen on the server's side: with "retry", try again slowly, at
    the backoff's cap."""
    delay = config.backoff.maximum * (1 - config.backoff.jitter * u)
    state = replace(state, due=None, delay=delay)
    if state.state is State.FAILED:
        note = Note(
            logging.WARNING,
            "registration with %s still refused: %s; next attempt in %.2f s",
            (config.url, outcome.error, delay),
        )
        return _after(state, now, delay, (note,))
    return Decision(state, Fail(state.streak, outcome.error, delay, fatal=True))


def _answered(
    config: LoopConfig, state: LoopState, seen: Answered, now: float, draw: Draw
) -> Decision:
    state = replace(state, state=State.FAILED)
    if not seen.go_on:
        return Decision(replace(state, phase=Phase.ENDED), Stop())
    return _after(state, now, state.delay)


def _accepted(config: LoopConfig, state: LoopState, now: float) -> Decision:
    number = state.streak + 1
    note = Note(
        logging.INFO,
        "%s with %s after %d attempt%s",
        (
            "registered again" if state.ever_registered else "registered",
            config.url,
            number,
            "" if number == 1 else "s",
        ),
    )
    state = replace(
        state,
        state=State.REGISTERED,
        ever_registered=True,
        registrations=state.registrations + 1,
        # What a look found before this PUT says nothing about the route now.
        route=None,
    )
    return replace(_watching(state, now), trigger=Trigger.SUCCEED, notes=(note,))


# ----------------------------------------------------------------- watching


def _watching(state: LoopState, now: float) -> Decision:
    """Registered: check at once (the check right after the PUT), then watch."""
    state = replace(state, phase=Phase.WATCHING, check_now=True, checks=0, probing=False, broken=0)
    return _check(state, now)


def _check(state: LoopState, now: float) -> Decision:
    state = replace(
        state,
        just_put=state.check_now,
        check_now=False,
        checks=state.checks + 1,
        last_check_started=now,
    )
    return Decision(state, Check())


def _watch_next(
    config: LoopConfig, state: LoopState, draw: Draw, notes: tuple[Note, ...] = ()
) -> Decision:
    if state.probing or state.broken:
        # Probing already: a report cannot make it sooner, and must not make it a loop
        # (reports may come a thousand times a second).
        return Decision(state, Wait(probe_delay(config.fleet, draw()), WaitKind.PROBE), notes=notes)
    delay = None
    if config.watch_interval is not None:
        spread = first_watch_delay if state.checks == 1 else watch_delay
        delay = spread(config.watch_interval, draw())
    return Decision(state, Wait(delay, WaitKind.IDLE), notes=notes)


def _checked(
    config: LoopConfig, state: LoopState, seen: Checked, now: float, draw: Draw
) -> Decision:
    check = seen.check
    if check is None:
        if seen.reported:
            reported = replace(state, lost_after_put=0)
            return _lose(config, reported, now, draw, "the runtime reported the route missing")
        return _watch_next(config, state, draw)
    state = replace(state, reachable=check.reachable, route=check.route.value)
    if check.route is Route.UNREACHABLE:
        return _unreachable(config, state, check, draw)
    state = replace(state, probing=False, broken=0)
    if check.route is Route.MISSING:
        # Lost again right after our own PUT: the streak survives re-registration, so the
        # window before the next PUT keeps growing instead of PUTting in a loop.
        lost = state.lost_after_put + 1 if state.just_put else 0
        return _lose(config, replace(state, lost_after_put=lost), now, draw, check.evidence)
    if check.route is Route.PRESENT:
        state = replace(state, lost_after_put=0)
    notes: tuple[Note, ...] = ()
    if check.route is Route.CONFLICT:
        notes = (Note(logging.WARNING, "route conflict at %s: %s", (config.url, check.evidence)),)
    elif seen.reported:
        state, notes = unheeded(config, state, check, seen.reported, now)
    return _watch_next(config, state, draw, notes)


def _unreachable(config: LoopConfig, state: LoopState, check: RouteCheck, draw: Draw) -> Decision:
    every = probe_delay(config.fleet, 0.5)
    if check.refused:
        notes: tuple[Note, ...] = ()
        if not state.probing:
            notes = (
                Note(
                    logging.WARNING,
                    "route check at %s failed: %s; probing every ~%.2f s until it listens again",
                    (config.url, check.evidence, every),
                ),
            )
        return _watch_next(config, replace(state, probing=True), draw, notes)
    state = replace(state, probing=False)
    if check.broken and state.broken < MAX_BROKEN_CHECKS:
        # A reset while a server goes away (a connection accepted by the dying process): look
        # again soon, as for a refusal, a few times at most.
        note = Note(
            logging.INFO,
            "route check at %s failed: %s; checking again in ~%.2f s",
            (config.url, check.evidence, every),
        )
        return _watch_next(config, replace(state, broken=state.broken + 1), draw, (note,))
    note = Note(
        logging.WARNING,
        "route check at %s failed: %s; checking again at the next interval",
        (config.url, check.evidence),
    )
    return _watch_next(config, replace(state, broken=0), draw, (note,))


def _lose(config: LoopConfig, state: LoopState, now: float, draw: Draw, evidence: str) -> Decision:
    """Back to registering; no wait before the first re-attempt the first time (the check that
    found the route missing was the fleet's spread first contact). `state.lost_after_put`
    counts the losses right after our own PUT."""
    delay = rejoin_delay(config.backoff, state.lost_after_put, draw())
    note = Note(
        logging.WARNING,
        "route at %s is missing (%s); registering again in %.2f s",
        (config.url, evidence, delay),
    )
    state = replace(state, state=State.REGISTERING)
    decision = _run_of_attempts(config, state, now, delay, (note,))
    return replace(decision, trigger=Trigger.LOSE)


_HANDLERS: dict[type, Callable[..., Decision]] = {
    Stopping: _stopping,
    Started: _started,
    Waited: _waited,
    Looked: _looked,
    Sent: _sent,
    Answered: _answered,
    Checked: _checked,
}
"""One handler per kind of observation."""
