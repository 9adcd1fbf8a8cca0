"""The topology scenarios (issue 36): the deployments people run have several prefill ranks. Each
runs on a `Stack` whose prefill is TP 2 (one scheduler process, and with registrar one
registrar, per rank) beside a TP 2 decode, with and without registrar, requests through the
router all along, and leaves a `Record` for the report like the 1-rank scenarios.

Beside the probe, a `ReadyWatch` asks the prefill's `/ready` and then its bootstrap server's
table all along: a 200 followed by a table with a row missing is a `/ready` that said ready
with a row missing (rows only come in during a lifetime, so the order of the two asks makes
every such sample a real one).

Times in a record are seconds from the scenario's event: the bootstrap server listening (t1),
the prefill killed (t2).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import requests

from .deploy import wait_http
from .scenarios import (
    FAIL_WINDOW,
    PLUGIN_STARTED,
    RECOVER_BOUND,
    REGISTRAR_DROPPED,
    UPSTREAM_BUDGET,
    UPSTREAM_GAVE_UP,
    _failures,
    _finish,
    _serve_again,
    _serving,
)
from .stack import Probe, Record, Sample, Stack

__all__ = ["ReadyWatch", "link_cut", "node_dies", "tp_race", "tp_relaunch"]

RELAUNCH_BOUND = 1.0
"""With registrar the relaunched prefill serves within this of its `/health` (issue 36)."""
ROUTED_TO_SERVED = "router routing again to first served request sent (s)"
"""The issue's 1-s figure, from the moment the router routes to the relaunched prefill again
(what the deployment does from then on), not from its /health: on /health the router only
looks again at its next 2-s health check."""
NO_WORKERS = "no_available_workers"
"""smg's 503 while it lists no healthy worker of a kind."""
REFUSED_TP = 1
"""In t1 the bootstrap server refuses this rank's PUTs (503) until the test has seen `/ready`
with its row missing; then it admits them."""


class ReadyWatch:
    """The prefill's `/ready`, then its bootstrap server's rows, every `gap` seconds."""

    def __init__(self, stack: Stack, zero: float, gap: float = 0.25) -> None:
        self.stack = stack
        self.zero = zero
        self.gap = gap
        self.samples: list[tuple[float, int, int]] = []
        """(seconds from zero, /ready status, rows in the table asked after it)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ReadyWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            at = time.monotonic() - self.zero
            prefill = self.stack.prefill
            try:
                assert prefill is not None
                ready = requests.get(prefill.url + "/ready", timeout=5).status_code
                lifetimes = self.stack.bootstrap()["lifetimes"]
            except (requests.RequestException, AssertionError):
                pass  # down, or relaunching: nothing to compare
            else:
                rows = len(lifetimes[-1]["rows"]) if lifetimes else 0
                self.samples.append((round(at, 2), ready, rows))
            self._stop.wait(self.gap)

    def ready_with_rows_missing(self) -> list[tuple[float, int, int]]:
        return [s for s in self.samples if s[1] == 200 and s[2] < self.stack.tp]

    def figures(self, record: Record) -> None:
        seen = list(self.samples)
        record.figures["/ready asked (times)"] = len(seen)
        missing = [s for s in seen if s[1] == 200 and s[2] < self.stack.tp]
        record.figures["/ready 200 with a row missing (times)"] = len(missing)
        partial = [s for s in seen if 0 < s[2] < self.stack.tp]
        record.figures["/ready while rows were partly in"] = _codes(partial)


def _codes(samples: list[tuple[float, int, int]]) -> str:
    counts: dict[int, int] = {}
    for _, code, _ in samples:
        counts[code] = counts.get(code, 0) + 1
    return ", ".join(f"{n} x {code}" for code, n in sorted(counts.items())) or "never seen"


def _count_log(stack: Stack, text: str, count: int, timeout: float) -> float:
    """Until `text` is in the prefill's logs (every node's) `count` times (once per rank); when
    it happened."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if stack.prefill_text().count(text) >= count:
            return time.monotonic()
        time.sleep(0.25)
    tails = "\n".join(node.tail() for node in stack.prefill_nodes)
    raise AssertionError(f"the prefill logged {text!r} < {count} times in {timeout} s:\n{tails}")


def _state_until(stack: Stack, check: Any, what: str, timeout: float = RECOVER_BOUND) -> float:
    """Until the bootstrap server's state passes `check`; when it did."""
    deadline = time.monotonic() + timeout
    state: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            state = stack.bootstrap()
        except requests.RequestException:
            state = {}
        if state and check(state):
            return time.monotonic()
        time.sleep(0.1)
    raise AssertionError(f"{what}: not in {timeout} s: {state}")


def _first_served(probe: Probe, after: float, timeout: float) -> Sample | None:
    """The first request sent after `after` (the kill) that was served, waited for."""
    deadline = time.monotonic() + timeout
    while True:
        found = next((s for s in list(probe.samples) if s.ok and s.t >= after), None)
        if found is not None or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _first_routed(probe: Probe, after: float) -> Sample | None:
    """The first request sent after `after` (the relaunched prefill's /health) that the router
    did not refuse for want of a healthy prefill: it lists the prefill again (smg looks at its
    workers every 2 s here, so that is 0-2 s after /health, whatever registrar does)."""
    return next(
        (s for s in list(probe.samples) if s.t >= after and NO_WORKERS not in s.detail), None
    )


def _puts(stack: Stack) -> list[dict[str, int]]:
    """Accepted PUTs per rank in each lifetime of the current prefill's bootstrap server."""
    return [life["puts"] for life in stack.bootstrap()["lifetimes"]]


def _each_rank_once(stack: Stack) -> dict[str, int]:
    return {f"dp 0 cp 0 tp {tp} pp 0": 1 for tp in range(stack.tp)}


def tp_race(stack: Stack, record: Record) -> None:
    """t1. The seed's race at TP 2: node 0's bootstrap server comes up after the upstream retry
    budget of both ranks is spent. With registrar, rank 1's PUTs are then refused for a moment:
    `/ready` must say 503 while its row is missing."""
    assert stack.prefill is not None
    if stack.registrar:
        seen = _count_log(stack, PLUGIN_STARTED, stack.tp, 120)
        time.sleep(max(0.0, seen + UPSTREAM_BUDGET - time.monotonic()))
    else:
        _count_log(stack, UPSTREAM_GAVE_UP, stack.tp, 120)
        record.notes.append(f"prefill log, once per rank: {UPSTREAM_GAVE_UP!r}")
    start = time.monotonic()
    with Probe(stack.router_url, start) as probe, ReadyWatch(stack, start) as watch:
        _state_until(stack, lambda s: s["held"], "the bootstrap server held")
        record.health.append(stack.health("bootstrap server not listening yet"))
        stack.bootstrap("start")
        zero = time.monotonic() - start
        record.events["bootstrap server listening"] = zero
        if stack.registrar:
            first_in = _state_until(
                stack,
                lambda s: s["refused"] and s["lifetimes"][-1]["rows"],
                f"a row in and rank tp {REFUSED_TP}'s PUT refused",
            )
            record.events[f"one row in, tp {REFUSED_TP} refused"] = first_in - start
            record.health.append(stack.health(f"rank tp {REFUSED_TP} refused"))
            stack.bootstrap("admit")
            admitted = time.monotonic() - start
            record.events[f"tp {REFUSED_TP} admitted"] = admitted
            all_in = _state_until(
                stack, lambda s: len(s["lifetimes"][-1]["rows"]) == stack.tp, "every row in"
            )
            record.events["every row in"] = all_in - start
            first = probe.wait_ok(RECOVER_BOUND, after=admitted)
            assert first is not None, f"not served after the race: {probe.samples[-3:]}"
            record.figures["listening to first success (s)"] = round(first.done - zero, 2)
            record.figures["admitted to first success (s)"] = round(first.done - admitted, 2)
            # Watch on a little: requests go on being served, /ready stays what it says.
            probe.wait_ok(10, after=first.done + 2)
        else:
            probe.wait_ok(FAIL_WINDOW, after=zero)  # a request served would end the watch
        record.health.append(stack.health("bootstrap server listening"))
    _finish(record, probe, zero)
    record.events = {k: round(v - zero, 2) for k, v in record.events.items()}
    watch.figures(record)
    record.figures["failures after listening"] = _failures(probe, zero)
    record.figures["accepted PUTs per rank per lifetime"] = _puts(stack)
    served = [s for s in probe.since(zero) if s.ok]
    if stack.registrar:
        steps = {h["step"]: h for h in record.health}
        assert steps["bootstrap server not listening yet"]["prefill /ready"] == "503", steps
        assert steps[f"rank tp {REFUSED_TP} refused"]["prefill /ready"] == "503", steps
        assert record.health[-1]["prefill /ready"] == "200", record.health
        assert not watch.ready_with_rows_missing(), watch.ready_with_rows_missing()[:5]
        assert record.figures["accepted PUTs per rank per lifetime"] == [_each_rank_once(stack)]
    else:
        assert not served, f"served without registrar after the race: {served[:3]}"
        assert record.figures["accepted PUTs per rank per lifetime"] == [{}]


def tp_relaunch(stack: Stack, record: Record) -> None:
    """t2. The TP 2 prefill killed and relaunched under the live TP 2 decode and the router, the
    decode's heartbeat made to tolerate the outage (as in scenario 3): the time from the
    relaunched prefill's `/health` to the first request served, and each decode rank dropping
    its cached rows of the dead prefill once."""
    assert stack.decode is not None
    assert stack.prefill is not None
    if not stack.registrar:
        _serve_again(stack, record, "t1 left the deployment failing")
    start = time.monotonic()
    # Requests 0.2 s apart: the figure is read to the gap (the router answers 503 at once while
    # it lists no prefill).
    with Probe(stack.router_url, start, gap=0.2) as probe, ReadyWatch(stack, start) as watch:
        _serving(stack, probe, record)
        mark = len(stack.decode.text())
        stack.decode_heartbeat("heartbeat-tolerant")
        zero = time.monotonic() - start
        record.events["prefill killed"] = zero
        stack.relaunch_prefill(kill=True)
        stack.wait_prefill_up(every=0.05)
        up = time.monotonic() - start
        record.events["prefill /health 200"] = up
        record.health.append(stack.health("prefill up again"))
        all_in = _state_until(
            stack, lambda s: len(s["lifetimes"][-1]["rows"]) == stack.tp, "every row in"
        )
        record.events["every row in"] = all_in - start
        first = _first_served(probe, zero, RECOVER_BOUND if stack.registrar else FAIL_WINDOW)
        routed = _first_routed(probe, up)
        if routed is not None:
            record.figures["/health to the router routing again (s)"] = round(routed.t - up, 2)
        if first is not None:
            # Sent: from then on the deployment serves; answered: plus one request's time on
            # this machine (1-2 s at load 20 on 2 cores, ~0.2 s idle).
            record.figures["/health to first served request sent (s)"] = round(first.t - up, 2)
            record.figures["/health to first served request answered (s)"] = round(
                first.done - up, 2
            )
            routed_at = up if routed is None else routed.t
            record.figures[ROUTED_TO_SERVED] = round(first.t - routed_at, 2)
            probe.wait_ok(10, after=first.done + 2)
        else:
            none = f"none in {FAIL_WINDOW:.0f} s"
            record.figures["/health to first served request sent (s)"] = none
            record.figures[ROUTED_TO_SERVED] = none
        record.health.append(stack.health("after the relaunch"))
        decodes = stack.decode_states()
        stack.decode_heartbeat("heartbeat-default")
    decode_log = stack.decode.text()[mark:]
    record.notes.append(
        "the decode's heartbeat did not drop the dead prefill (made to tolerate the outage on "
        "every decode rank, as in scenario 3)"
    )
    drops = decode_log.count(REGISTRAR_DROPPED)
    record.figures["decode drops by registrar (one per decode rank expected)"] = drops
    _finish(record, probe, zero)
    record.events = {k: round(v - zero, 2) for k, v in record.events.items()}
    watch.figures(record)
    record.figures["failures after /health"] = _failures(probe, up)
    record.figures["accepted PUTs per rank per lifetime"] = _puts(stack)
    assert record.figures["accepted PUTs per rank per lifetime"] == [_each_rank_once(stack)]
    served = [s for s in probe.since(up) if s.ok]
    if stack.registrar:
        assert drops == stack.decode_tp, f"{drops} drops:\n{decode_log[-3000:]}"
        new = {(row[4], row[5]) for row in stack.bootstrap()["lifetimes"][-1]["rows"]}
        cached = {tuple(a) for d in decodes for rows in d["rows"].values() for a in rows}
        assert cached, f"the decode caches nothing of the prefill: {decodes}"
        assert cached <= new, f"the decode caches {cached}, the prefill is at {new}"
        assert not watch.ready_with_rows_missing(), watch.ready_with_rows_missing()[:5]
        figure = record.figures[ROUTED_TO_SERVED]
        assert figure <= RELAUNCH_BOUND, f"served {figure} s after routed: {probe.samples}"
    else:
        assert not served, f"served with stale addresses cached on the decode: {served[:3]}"


QUIET_WATCH = 20.0
"""How long node 0 is watched after node 1 dies with no request from the test (the router's
health checks go on, as in any deployment)."""
BUSY_WATCH = 20.0
"""Then how long with requests through the router."""
TRUTH_BOUND = 5.0
"""How long after node 1 dies node 0's `/ready` may still say 200 (issue 36: "within a few
seconds"); a group with a node gone serves nothing."""


def _code(url: str, patience: float = 2.0) -> str:
    """A status with a short patience: a hung server shows as a timeout, not a stalled watch."""
    try:
        return str(requests.get(url, timeout=patience).status_code)
    except requests.Timeout:
        return "timeout"
    except requests.RequestException:
        return "refused"


def _glance(stack: Stack, zero: float) -> dict[str, Any]:
    assert stack.prefill is not None
    assert stack.router is not None
    url = stack.prefill.url
    # /ready first, at the glance's time; SGLang's /health waits for a stuck scheduler (20 s), so
    # it gets half a second: a glance then takes about a second, not two.
    return {
        "t": round(time.monotonic() - zero, 2),
        "node 0 alive": stack.prefill.alive(),
        "prefill /ready": _code(url + "/ready"),
        "router /readiness": _code(stack.router.url + "/readiness"),
        "prefill /health": _code(url + "/health", 0.5),
    }


def _spans(glances: list[dict[str, Any]], key: str) -> str:
    """`key`'s values over time as `value from..to` runs, for the record."""
    runs: list[list[Any]] = []
    for g in glances:
        if runs and runs[-1][0] == g[key]:
            runs[-1][2] = g["t"]
        else:
            runs.append([g[key], g["t"], g["t"]])
    return ", ".join(f"{v} {a}..{b} s" for v, a, b in runs)


def _watch(stack: Stack, zero: float, until: float, glances: list[dict[str, Any]]) -> None:
    while time.monotonic() < zero + until:
        glances.append(_glance(stack, zero))
        time.sleep(0.25)


def node_dies(stack: Stack, record: Record) -> None:
    """n4. Node 1 of the two-node prefill killed, node 0 left running: what SGLang does with the
    broken group, and what `/health`, `/ready` and the router say meanwhile, first with no
    request from the test, then with requests. Node 0's `/ready` may not say 200 later than
    `TRUTH_BOUND` after the kill."""
    assert len(stack.prefill_nodes) == 2
    node0, node1 = stack.prefill_nodes
    start = time.monotonic()
    with Probe(stack.router_url, start) as probe:
        served = probe.wait_ok(RECOVER_BOUND if stack.registrar else 20)
        assert served is not None or not stack.registrar, f"not serving: {probe.samples[-3:]}"
    record.health.append(stack.health("before node 1 dies"))
    node1.kill()
    zero = time.monotonic()
    glances: list[dict[str, Any]] = []
    _watch(stack, zero, QUIET_WATCH, glances)
    with Probe(stack.router_url, zero) as probe:
        _watch(stack, zero, QUIET_WATCH + BUSY_WATCH, glances)
    record.health.append(stack.health(f"{QUIET_WATCH + BUSY_WATCH:.0f} s after node 1 died"))
    _finish(record, probe, 0.0)
    record.events = {"node 1 killed": 0.0, "requests from the test again": QUIET_WATCH}
    gone = next((g["t"] for g in glances if not g["node 0 alive"]), None)
    if gone is not None:
        record.events["node 0 seen exited"] = gone
    record.figures["node 0 exit code"] = node0.proc.returncode
    for key in ("prefill /health", "prefill /ready", "router /readiness"):
        record.figures[f"{key} after node 1 died"] = _spans(glances, key)
    record.figures["requests served after node 1 died"] = sum(s.ok for s in probe.samples)
    record.figures["failures after node 1 died"] = _failures(probe, 0.0)
    ready = [g["t"] for g in glances if g["prefill /ready"] == "200"]
    record.figures["last /ready 200 after node 1 died (s)"] = ready[-1] if ready else "none"
    errors = [line for line in node0.text().splitlines() if "Error" in line]
    record.notes.append(f"node 0's last error line: {errors[-1][:300] if errors else 'none'}")
    late = [t for t in ready if t > TRUTH_BOUND]
    assert not late, f"/ready said 200 {late[:5]} s after node 1 died: {glances[:40]}"


CUT_WATCH = 30.0
"""How long the link stays cut: past SGLang's own 20-s `/health` patience, after which its
readiness turns false whatever registrar does."""
HEAL_WATCH = 60.0
"""How long the group is watched once the link carries packets again (TCP's retransmissions
back off to tens of seconds by then)."""
SILENT_LINE = "does not answer ("
BACK_LINE = "answers again"
BLIP = 4.0
"""A first cut shorter than gloo's patience here (its read times out about 8 s after a cut): the
group lives through it, so the plugin's every promise shows in a real node 0 (n3)."""
"""Node 0's log when a row's address stops answering (registrar/integrations/sglang/_reach.py)."""


def _heal(stack: Stack, record: Record, probe: Probe, healed: float) -> None:
    """The group serving again after the link healed, or relaunched so that the next scenario
    starts from a live node 0 (serving, with registrar)."""
    first = probe.first_ok(after=healed)
    record.figures["healed to first served request answered (s)"] = (
        round(first.done - healed, 2) if first else f"none in {HEAL_WATCH:.0f} s"
    )
    if first is None:  # the next scenario needs node 0 up (and, with registrar, serving)
        stack.relaunch_prefill(kill=True)
        stack.wait_prefill_up()
        record.notes.append("the group served nothing after the link healed: relaunched after it")


def _blip(stack: Stack, record: Record) -> None:
    """The link cut for `BLIP` seconds, no request in flight: with registrar node 0's `/ready`
    503 while node 1's row does not answer and the rank named in node 0's log, then `answers
    again` and `/ready` 200 once the link is back. (`/server_info` is recorded, not asserted:
    SGLang builds it from its schedulers, which wait in gloo while the link is cut.)"""
    assert stack.nodes is not None
    assert stack.prefill is not None
    node0, mark, zero = stack.prefill, len(stack.prefill.text()), time.monotonic()
    seen: dict[str, set[Any]] = {"/ready": set(), "/server_info": set()}
    for node in (0, 1):
        stack.nodes.drop(node)
    while time.monotonic() < zero + BLIP:
        seen["/ready"].add(_code(node0.url + "/ready"))
        try:
            info = requests.get(node0.url + "/server_info", timeout=1).json()
            silent = (info.get("registrar_bootstrap") or {}).get("silent_rows") or []
            seen["/server_info"].add(f"silent_rows {[row['tp'] for row in silent]}")
        except (requests.RequestException, ValueError) as exc:
            seen["/server_info"].add(type(exc).__name__)
        time.sleep(0.25)
    for node in (0, 1):
        stack.nodes.drop(node, on=False)
    wait_http(node0, "/ready", 30)
    back = time.monotonic() - zero
    text = node0.text()[mark:]
    record.figures["blip: /ready while cut"] = sorted(seen["/ready"])
    record.figures["blip: /server_info while cut"] = sorted(seen["/server_info"])
    record.figures["blip: cut to /ready 200 again (s)"] = round(back, 2)
    if stack.registrar:
        assert "503" in seen["/ready"], seen
        assert SILENT_LINE in text, text[-3000:]
        assert BACK_LINE in text.partition(SILENT_LINE)[2], text[-3000:]
    else:
        assert "sglang-registrar" not in text


def link_cut(stack: Stack, record: Record) -> None:
    """n3. Every packet between the two nodes dropped, both nodes alive (a partition: no reset
    reaches either side). Node 0's scheduler waits in gloo for node 1, so the group serves
    nothing; SGLang's readiness turns false only once a `/health` call has waited 20 s. With
    registrar node 0's `/ready` must say 503 within `TRUTH_BOUND` (node 1's row no longer
    answers) and its log say which rank; then the link heals."""
    assert stack.nodes is not None
    node0 = stack.prefill
    assert node0 is not None
    _blip(stack, record)
    start = time.monotonic()
    mark = len(node0.text())
    with Probe(stack.router_url, start) as probe:
        # Stock serves nothing here since the relaunch before (the decode keeps dead addresses).
        served = probe.wait_ok(RECOVER_BOUND if stack.registrar else 20)
        assert served is not None or not stack.registrar, f"not serving: {probe.samples[-3:]}"
        record.health.append(stack.health("before the cut"))
        zero = time.monotonic() - start
        for node in (0, 1):
            stack.nodes.drop(node)
        glances: list[dict[str, Any]] = []
        _watch(stack, start + zero, CUT_WATCH, glances)
        for node in (0, 1):
            stack.nodes.drop(node, on=False)
        healed = time.monotonic() - start
        record.health.append(stack.health("link healed"))
        _watch(stack, start + zero, CUT_WATCH + HEAL_WATCH, glances)
        _heal(stack, record, probe, healed)
    _finish(record, probe, zero)
    record.events = {"link cut": 0.0, "link healed": round(healed - zero, 2)}
    for key in ("prefill /health", "prefill /ready", "router /readiness"):
        record.figures[f"{key} from the cut"] = _spans(glances, key)
    cut = [g for g in glances if g["t"] < CUT_WATCH]
    turned = next((g["t"] for g in cut if g["prefill /ready"] != "200"), None)
    record.figures["/ready first not 200 after the cut (s)"] = (
        turned if turned is not None else "never"
    )
    served = [s for s in probe.since(zero) if s.ok and s.t < healed]
    record.figures["requests served while cut"] = len(served)
    lines = [ln for ln in node0.text()[mark:].splitlines() if SILENT_LINE in ln]
    record.figures["node 0's log: rank does not answer (lines)"] = len(lines)
    if lines:
        record.notes.append(f"node 0's log: {lines[0][:240]}")
    if stack.registrar:
        assert turned is not None, _spans(cut, "prefill /ready")
        assert turned <= TRUTH_BOUND, _spans(cut, "prefill /ready")
        late = [g["t"] for g in cut if g["prefill /ready"] == "200" and g["t"] > TRUTH_BOUND]
        assert not late, f"/ready 200 while cut at {late[:5]} s"
        assert lines, "node 0 did not log which rank does not answer"
    else:
        assert not lines, lines
