"""The loop's decision function explored exhaustively against a model of SGLang's bootstrap
server as it really counts (docs/sglang.md, DESIGN.md "Facts about the real SGLang bootstrap
server"):

- every accepted PUT adds one to the count, even for a rank already present; the topology is
  ready once the count reaches its size; a route query answers 503 "(N workers registered)"
  before that, 404 for a rank not in the table once ready, 200 for one that is;
- a restart forgets everything (count 0, empty table) and drops every open connection;
- faults: a connection refused (the server is down), reset, an answer lost after the server
  acted (a PUT counted, its answer past the deadline), an answer lost before it acted, a second
  rank's PUTs (a second registrar of the same topology, driven by the same function), and the
  server restarting between any two steps.

The REAL `registrar.core._decide.decide` is driven through every interleaving of those steps up
to a bound (breadth first), with the SGLang transport's evidence of a forgotten route
(`registrar.protocols._sglang._Evidence`, the transport's own class) deciding what a 503 means.
Checked in every state reached:

1. never a PUT while our row is in the server's table (the count would be wrong for ever);
2. a decision never leaves the snapshot saying `registered` with the route `missing` (its
   trigger and its changes are published together);
3. once the server stays up, every rank is registered (its row in the table, the count exact)
   within a bound of fault-free steps;
4. the startup budget counts as documented: `max_attempts` counted attempts, probes free.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import pytest

from registrar.core._actions import (
    Action,
    Answered,
    Check,
    Checked,
    Fail,
    Look,
    Looked,
    LoopState,
    Observation,
    Send,
    Sent,
    Started,
    Stop,
    Wait,
    Waited,
    WaitKind,
)
from registrar.core._backoff import Backoff
from registrar.core._board import TRANSITIONS, State, Status
from registrar.core._decide import Decision, decide
from registrar.core._settings import LoopSettings
from registrar.core._transport import RegisterOutcome, Route, RouteCheck, Verdict
from registrar.protocols._sglang import _Evidence

TOPOLOGY = 2
"""Ranks in the topology: the server is ready once it counted this many PUTs."""
CONFIG = LoopSettings(
    backoff=Backoff(initial=1.0, multiplier=2.0, maximum=5.0, jitter=0.25),
    max_attempts=3,
    watch_interval=15.0,
)
URL = "http://127.0.0.1:8998"
NEXT = {(source, trigger): dest for source, trigger, dest in TRANSITIONS}


def draw() -> float:
    return 0.5


# ----------------------------------------------------------------- the model


@dataclass(frozen=True)
class Server:
    up: bool
    lifetime: int
    """Incremented at each restart; a connection opened in an earlier lifetime is dead."""
    count: int = 0
    table: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Rank:
    loop: LoopState
    status: Status
    """What its snapshot says (the fields decisions read; timestamps left out)."""
    action: Action
    """What the decision function asked for and the model has not performed yet."""
    clock: float = 0.0
    evidence: tuple[bool, int, bool, bool] = (False, 0, False, False)
    """The transport's `_Evidence`: seen ready, highest count, refused, reconnected."""
    conn: int | None = None
    """The lifetime of the kept-alive connection it holds (None: none it would miss)."""
    counted: int = 0
    """Counted attempts sent in this run of attempts (the budget's unit)."""
    blind: bool = False
    """An answer was lost since its last accepted PUT: what happened meanwhile is unknown."""


@dataclass(frozen=True)
class World:
    server: Server
    ranks: tuple[Rank, ...]
    faults: int
    """Faults (a reset, a lost answer) still allowed."""
    restarts: int
    """Server restarts still allowed."""


class Violation(AssertionError):
    pass


def _evidence(rank: Rank) -> _Evidence:
    found = _Evidence()
    found.seen_ready, found.highest_count, found.refused, found.reconnected = rank.evidence
    return found


def _kept(found: _Evidence) -> tuple[bool, int, bool, bool]:
    return (found.seen_ready, found.highest_count, found.refused, found.reconnected)


def _route_answer(server: Server, me: int, found: _Evidence) -> RouteCheck:
    """The server's answer to our rank query, classified as SGLangTransport does."""
    if server.count >= TOPOLOGY:
        if me in server.table:
            found.seen_ready = True
            return RouteCheck(Route.PRESENT, 200, "registered")
        return RouteCheck(Route.MISSING, 404, "404 for our rank from a ready server")
    reasons = found.reasons_forgotten(server.count)
    found.highest_count = max(found.highest_count, server.count)
    if reasons:
        return RouteCheck(Route.MISSING, 503, "; ".join(reasons), count=server.count)
    text = f"503 with {server.count} workers registered"
    return RouteCheck(Route.UNDETERMINED, 503, text, count=server.count)


def _put(server: Server, me: int, where: str) -> Server:
    if me in server.table:
        raise Violation(f"rank {me} PUT while its row is in the table ({where})")
    return replace(server, count=server.count + 1, table=server.table | {me})


Step = tuple[str, World]


def _applied(status: Status, decision: Decision) -> Status:
    """The snapshot after `decision`, as the runner publishes it (the trigger through the
    table), keeping only what decisions read: the state, the route, the counters."""
    state = status.state
    if decision.trigger is not None:
        state = NEXT[(state, decision.trigger)]  # a refused trigger would raise here
    after = replace(status, state=state, **decision.changes)
    return Status(
        state=after.state,
        since=0.0,
        url=URL,
        route=after.route,
        server_reachable=after.server_reachable,
        registrations=after.registrations,
    )


def _settle(world: World, me: int, rank: Rank, seen: Observation) -> World:
    """Feed `seen` to the decision function and keep what it answers, checking it."""
    before = rank.loop
    decision = decide(CONFIG_IN_USE.config, rank.status, before, seen, rank.clock, draw)
    after, status = decision.state, _applied(rank.status, decision)
    if status.state is State.REGISTERED and status.route == Route.MISSING.value:
        raise Violation(f"rank {me}: registered with the route missing after {seen}")
    counted = rank.counted
    if decision.trigger is not None and status.state is State.REGISTERING:
        counted = 0  # a new run of attempts after the route was lost
    action = decision.action
    if isinstance(action, Fail) and not action.fatal and before.startup:
        limit = CONFIG_IN_USE.config.max_attempts
        if action.attempts != limit or counted != limit:
            raise Violation(
                f"rank {me}: the startup budget spent after {counted} counted attempts "
                f"({action.attempts} reported), max_attempts={limit}"
            )
    ranks = list(world.ranks)
    ranks[me] = replace(rank, loop=after, status=status, action=action, counted=counted)
    return replace(world, ranks=tuple(ranks))


def _with_rank(world: World, me: int, rank: Rank, server: Server | None = None) -> World:
    ranks = list(world.ranks)
    ranks[me] = rank
    return replace(world, ranks=tuple(ranks), server=server or world.server)


def _request(world: World, me: int, rank: Rank, faults: bool) -> Iterator[Step]:
    """Every way the request `rank.action` can end."""
    server = world.server
    action = rank.action
    put = isinstance(action, Send)
    if isinstance(action, Send):
        # The budget counts every attempt that reached the server, and a refused one only when
        # the schedule made it: the probes in between are free (docs/state-machine.md).
        counts = action.scheduled or server.up
        rank = replace(rank, counted=rank.counted + counts)
    if not server.up:
        found = _evidence(rank)
        found.refused = True
        down = replace(rank, evidence=_kept(found), conn=None, clock=rank.clock + 0.001)
        refused: Observation = (
            _sent(action, RegisterOutcome(Verdict.RETRY, error="refused", refused=True))
            if put
            else _check_seen(action, RouteCheck(Route.UNREACHABLE, None, "refused", refused=True))
        )
        yield "refused", _settle(_with_rank(world, me, down), me, down, refused)
        return
    found = _evidence(rank)
    if rank.conn is not None and rank.conn != server.lifetime:
        found.reconnected = True  # the kept-alive connection had to be opened again
    live = replace(rank, conn=server.lifetime, clock=rank.clock + 0.001)
    if put:
        yield from _put_endings(world, me, live, found, faults)
    else:
        yield from _check_endings(world, me, live, found, faults)
    if faults:
        yield from _resets(world, me, replace(rank, clock=rank.clock + 0.001), rank)


def _check_seen(action: Action, check: RouteCheck) -> Observation:
    return Looked(check, 0.0) if isinstance(action, Look) else Checked(check, 0, 0.0)


def _sent(action: Action, outcome: RegisterOutcome) -> Sent:
    return Sent(outcome, scheduled=isinstance(action, Send) and action.scheduled, at=0.0)


def _put_endings(
    world: World, me: int, rank: Rank, found: _Evidence, faults: bool
) -> Iterator[Step]:
    server = world.server
    accepted = _put(server, me, "answered")
    fresh = replace(rank, evidence=_kept(_Evidence()), blind=False)
    seen = _sent(rank.action, RegisterOutcome(Verdict.ACCEPTED, 200))
    yield "put", _settle(_with_rank(world, me, fresh, accepted), me, fresh, seen)
    if not faults:
        return
    spent = replace(world, faults=world.faults - 1)
    closed = replace(rank, evidence=_kept(found), conn=None, blind=True)
    lost = _sent(rank.action, RegisterOutcome(Verdict.RETRY, error="deadline"))
    yield "put lost before", _settle(_with_rank(spent, me, closed), me, closed, lost)
    after = _put(server, me, "its answer lost")
    yield "put lost after", _settle(_with_rank(spent, me, closed, after), me, closed, lost)


def _resets(world: World, me: int, rank: Rank, before: Rank) -> Iterator[Step]:
    """The server process goes away under the request (a restart): the connection it accepted
    is reset. On loopback that is what a reset is: a live server does not reset a kept-alive
    connection (its idle closes are told apart by the transport, `settle_idle_signal`)."""
    if not world.restarts or not world.server.up:
        return
    gone = Server(up=False, lifetime=world.server.lifetime + 1)
    spent = replace(world, server=gone, restarts=world.restarts - 1)
    found = _evidence(rank)
    if before.conn is not None:
        found.reconnected = True  # a kept-alive connection broke under the request
    broken = replace(rank, evidence=_kept(found), conn=None)
    if isinstance(rank.action, Send):
        # Unanswered, as a lost answer is: the outcome cannot say whether it arrived.
        broken = replace(broken, blind=True)
        seen: Observation = _sent(rank.action, RegisterOutcome(Verdict.RETRY, error="reset"))
    else:
        check = RouteCheck(Route.UNREACHABLE, evidence="reset", broken=before.conn is not None)
        seen = _check_seen(rank.action, check)
    yield "reset (the server went away)", _settle(_with_rank(spent, me, broken), me, broken, seen)


def _check_endings(
    world: World, me: int, rank: Rank, found: _Evidence, faults: bool
) -> Iterator[Step]:
    answered = _route_answer(world.server, me, found)
    done = replace(rank, evidence=_kept(found))
    seen = _check_seen(rank.action, answered)
    yield "check", _settle(_with_rank(world, me, done), me, done, seen)
    if not faults:
        return
    spent = replace(world, faults=world.faults - 1)
    closed = replace(rank, conn=None, blind=True)
    lost = _check_seen(rank.action, RouteCheck(Route.UNREACHABLE, evidence="deadline"))
    yield "check lost", _settle(_with_rank(spent, me, closed), me, closed, lost)


def _wait_endings(world: World, me: int, rank: Rank, quiet: bool) -> Iterator[Step]:
    action = rank.action
    assert isinstance(action, Wait)
    server = world.server
    dropped = rank.conn is not None and (not server.up or rank.conn != server.lifetime)
    if action.kind is WaitKind.IDLE and dropped:
        # The idle kept-alive connection closed under it: a sign the route may be gone.
        woken = replace(rank, clock=rank.clock + 0.001)
        yield "sign", _settle(_with_rank(world, me, woken), me, woken, Waited(action.kind, True))
        if quiet:
            return
    assert action.delay is not None
    waited = replace(rank, clock=rank.clock + action.delay)
    yield "waited", _settle(_with_rank(world, me, waited), me, waited, Waited(action.kind))


def rank_steps(world: World, me: int, quiet: bool = False) -> Iterator[Step]:
    """What rank `me` can do next (`quiet`: the server answers every request)."""
    rank = world.ranks[me]
    action = rank.action
    if isinstance(action, Stop):
        return
    if isinstance(action, Wait):
        yield from _wait_endings(world, me, rank, quiet)
    elif isinstance(action, Fail):
        seen = Answered("retry" if CONFIG_IN_USE.go_on else "stop")
        yield "policy", _settle(world, me, rank, seen)
    else:
        yield from _request(world, me, rank, faults=not quiet and world.faults > 0)


def server_steps(world: World) -> Iterator[Step]:
    server = world.server
    if server.up and world.restarts:
        gone = Server(up=False, lifetime=server.lifetime + 1)
        yield "server stops", replace(world, server=gone, restarts=world.restarts - 1)
    if not server.up:
        yield "server starts", replace(world, server=replace(server, up=True))


def steps(world: World) -> Iterator[Step]:
    for me in range(len(world.ranks)):
        for label, after in rank_steps(world, me):
            yield f"rank {me}: {label} -> {after.ranks[me].action}", after
    yield from server_steps(world)


# ----------------------------------------------------------------- liveness


def settled(world: World) -> bool:
    """Every rank registered, its row in the table, the count exact, nothing left to do but
    watch."""
    server = world.server
    if not server.up or server.count != len(world.ranks):
        return False
    return all(
        rank.status.state is State.REGISTERED
        and me in server.table
        and isinstance(rank.action, Wait | Check)
        for me, rank in enumerate(world.ranks)
    )


LIVENESS_BOUND = 30
"""Fault-free steps within which every rank must be registered once the server stays up."""
HELD = "held"
STUCK = "stuck"


class Liveness:
    """Whether a world settles once the server stays up and nothing fails any more: each rank
    in turn performs its next step the fault-free way. Memoised: the continuations of the
    explored worlds share their tails."""

    def __init__(self) -> None:
        self.known: dict[World, int | str] = {}
        """Steps to settle, or HELD / STUCK when it does not within the bound."""
        self.path: list[str] = []
        """The steps of the last continuation followed."""

    def outcome(self, world: World) -> int | str:
        """Steps to settle once the server stays up; HELD when it ends holding on an
        undecidable answer instead, STUCK when it ends any other way unsettled."""
        world = replace(world, faults=0, restarts=0)
        if not world.server.up:
            world = replace(world, server=replace(world.server, up=True))
        # From now on, one time for all: each rank's clock at the latest one (a rank may have
        # been slow; its decisions only compare times of its own).
        latest = max(rank.clock for rank in world.ranks)
        world = replace(world, ranks=tuple(replace(r, clock=latest) for r in world.ranks))
        chain: list[World] = []
        self.path = []
        while world not in self.known:
            if settled(world):
                self.known[world] = 0
                break
            if len(chain) >= LIVENESS_BOUND:
                self.known[world] = HELD if holding_on_an_undecidable_answer(world) else STUCK
                break
            chain.append(world)
            world = self._next(world)
        found = self.known[world]
        for back, seen in enumerate(reversed(chain), start=1):
            if isinstance(found, int):
                self.known[seen] = found + back if found + back <= LIVENESS_BOUND else STUCK
            else:
                self.known[seen] = found
        return self.known[chain[0]] if chain else found

    def _next(self, world: World) -> World:
        """The next fault-free step, in time order: the rank whose request or wait ends first
        (an idle wait whose connection closed ends at once)."""
        order = sorted(range(len(world.ranks)), key=lambda i: (_soonest(world, i), i))
        for me in order:
            for label, after in rank_steps(world, me, quiet=True):
                self.path.append(f"rank {me}: {label} -> {after.ranks[me].action}")
                return after
        return world


def _soonest(world: World, me: int) -> float:
    """When rank `me`'s pending step ends, on its clock."""
    rank = world.ranks[me]
    action = rank.action
    if isinstance(action, Stop):
        return float("inf")
    if not isinstance(action, Wait):
        return rank.clock
    server = world.server
    if action.kind is WaitKind.IDLE and rank.conn is not None and rank.conn != server.lifetime:
        return rank.clock + 0.001
    return rank.clock + (action.delay if action.delay is not None else float("inf"))


# ----------------------------------------------------------------- the explorer


@dataclass(frozen=True)
class Scenario:
    config: LoopSettings
    fleet: int
    go_on: bool
    """The on_failure policy's answer ("retry": True, "stop": False)."""


CONFIG_IN_USE = Scenario(CONFIG, TOPOLOGY, go_on=True)


def initial(ranks: int, up: bool, faults: int, restarts: int) -> World:
    world = World(Server(up=up, lifetime=0), (), faults, restarts)
    for me in range(ranks):
        loop = LoopState(fleet=CONFIG_IN_USE.fleet, url=URL)
        rank = Rank(loop, Status(State.REGISTERING, 0.0, URL), Stop())
        world = replace(world, ranks=(*world.ranks, rank))
        world = _settle(world, me, rank, Started())
    return world


@dataclass
class Explored:
    states: int
    depth: int
    seconds: float
    unsettled: list[tuple[str, list[str]]]
    """HELD or STUCK, and the steps that led there."""


def explore(start: list[World], depth: int, check_liveness: bool) -> Explored:
    began = time.monotonic()
    parent: dict[World, tuple[World | None, str]] = {world: (None, "start") for world in start}
    frontier: deque[tuple[World, int]] = deque((world, 0) for world in start)
    liveness = Liveness()
    unsettled: list[tuple[str, list[str]]] = []
    reached = 0
    while frontier:
        world, level = frontier.popleft()
        reached = max(reached, level)
        if check_liveness:
            try:
                found = liveness.outcome(world)
                if not isinstance(found, int):
                    unsettled.append((found, trace(parent, world) + liveness.path))
            except Violation as exc:
                steps_taken = [*trace(parent, world), "-- server up, no faults:", *liveness.path]
                path = "\n  ".join(steps_taken)
                raise Violation(f"{exc}\nafter:\n  {path}") from None
        if level == depth:
            continue
        for label, after in _steps_or_violation(world, parent):
            if after not in parent:
                parent[after] = (world, label)
                frontier.append((after, level + 1))
    return Explored(len(parent), reached, time.monotonic() - began, unsettled)


def _steps_or_violation(
    world: World, parent: dict[World, tuple[World | None, str]]
) -> Iterator[Step]:
    try:
        yield from list(steps(world))
    except Violation as exc:
        path = "\n  ".join(trace(parent, world))
        raise Violation(f"{exc}\nafter:\n  {path}") from None


def trace(parent: dict[World, tuple[World | None, str]], world: World) -> list[str]:
    labels: list[str] = []
    at: World | None = world
    while at is not None:
        at, label = parent[at]
        labels.append(label)
    return list(reversed(labels))


def _report(record: Callable[[str, object], None], name: str, result: Explored) -> None:
    record(
        "figures",
        f"decide explorer, {name}: {result.states} distinct states to depth {result.depth} "
        f"in {result.seconds:.1f} s",
    )


# ----------------------------------------------------------------- the tests


def holding_on_an_undecidable_answer(world: World) -> bool:
    """A rank lost an answer since its last accepted PUT (its own attempt's, or a check's),
    its row is not in the table, and the server is not ready but counts another rank's
    registration. SGLang names no rank before the topology is ready, so nothing it answers
    can tell this world from the one where the row is there (the attempt arrived; or no
    restart came while the rank could not see one): sending again could count the rank
    twice, and the topology would look ready one rank early. The rank holds instead
    (docs/reliability.md)."""
    server = world.server
    return 0 < server.count < TOPOLOGY and any(
        rank.blind and me not in server.table and rank.loop.unanswered + rank.loop.checks > 0
        for me, rank in enumerate(world.ranks)
    )


@pytest.mark.timeout(120)
def test_two_ranks_through_restarts_and_faults(
    record_property: Callable[[str, object], None],
) -> None:
    """Two ranks of one topology, the server down or up at first, one restart and one fault
    anywhere: no double PUT, no `registered` beside `missing`, and every rank registered
    within the bound once the server stays up, except where SGLang's answers cannot tell (an
    unanswered attempt while another rank's PUT made the count ambiguous), which is held."""
    global CONFIG_IN_USE
    CONFIG_IN_USE = Scenario(replace(CONFIG, max_attempts=None), TOPOLOGY, go_on=True)
    start = [initial(TOPOLOGY, up, faults=1, restarts=1) for up in (False, True)]
    result = explore(start, depth=8, check_liveness=True)
    held = [path for found, path in result.unsettled if found == HELD]
    stuck = [path for found, path in result.unsettled if found == STUCK]
    _report(record_property, "two ranks, a restart and a fault", result)
    record_property("figures", f"decide explorer: {len(held)} states end holding (undecidable)")
    assert result.states > 10_000
    assert not stuck, "\n".join(["never settles once the server stays up, after:", *stuck[0]])


@pytest.mark.timeout(120)
def test_one_rank_through_two_restarts_and_two_faults(
    record_property: Callable[[str, object], None],
) -> None:
    global CONFIG_IN_USE
    CONFIG_IN_USE = Scenario(replace(CONFIG, max_attempts=None), 1, go_on=True)
    start = [initial(1, up, faults=2, restarts=2) for up in (False, True)]
    result = explore(start, depth=16, check_liveness=False)
    _report(record_property, "one rank, two restarts and two faults", result)
    assert result.states > 1_000


@pytest.mark.timeout(120)
def test_the_startup_budget_counts_attempts_not_probes(
    record_property: Callable[[str, object], None],
) -> None:
    """max_attempts=3, on_failure="stop": every way to spend it (refusals with free probes,
    lost answers, a server that comes and goes) fails after exactly 3 counted attempts."""
    global CONFIG_IN_USE
    CONFIG_IN_USE = Scenario(replace(CONFIG, max_attempts=3), 1, go_on=False)
    start = [initial(1, up, faults=2, restarts=1) for up in (False, True)]
    result = explore(start, depth=16, check_liveness=False)
    _report(record_property, "the startup budget", result)
    assert result.states > 100
