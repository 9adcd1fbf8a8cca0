"""The scenarios of the end-to-end suite, each run on a `Stack` with or without registrar, each
leaving a `Record` (events, requests over time, health at each step, figures) for the report.

Times in a record are seconds from the scenario's event: the bootstrap server listening (1),
the bootstrap server started again (2), the prefill killed (3).
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from .stack import PROMPTS, Probe, Record, Stack, generate

__all__ = ["bootstrap_restart", "cache_moved", "prefill_relaunch", "race", "run"]

UPSTREAM_BUDGET = 16.0
"""The upstream retry loop's longest span: 5 attempts, 1+2+4+8 s at most between them."""
FAIL_WINDOW = 30.0
"""How long a deployment without registrar is watched failing after the event."""
RECOVER_BOUND = 120.0
"""The bound within which a deployment with registrar must serve again (2 loaded cores)."""

UPSTREAM_GAVE_UP = "failed to register to bootstrap server after 5 retries"
PLUGIN_STARTED = "in the background (registrar"
DECODE_DROPPED = "Lost connection with prefill instance"
REGISTRAR_DROPPED = "restarted ("
"""registrar's decode side logs `the prefill at ADDR restarted (why); dropping ...`."""


def _finish(record: Record, probe: Probe, zero: float) -> None:
    record.samples = [
        asdict(s) | {"t": round(s.t - zero, 2), "done": round(s.done - zero, 2)}
        for s in probe.samples
    ]


def _failures(probe: Probe, after: float) -> dict[str, int]:
    """The distinct failing answers (status and text) after `after`, with their counts."""
    seen: dict[str, int] = {}
    for sample in probe.since(after):
        if not sample.ok:
            key = f"{sample.status}: {sample.detail[:120]}"
            seen[key] = seen.get(key, 0) + 1
    return seen


def _wait_log(process: Any, text: str, timeout: float, start: int = 0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in process.text()[start:]:
            return time.monotonic()
        time.sleep(0.25)
    raise AssertionError(f"{process.name} never logged {text!r} in {timeout} s:\n{process.tail()}")


def _puts(stack: Stack) -> list[int]:
    """Accepted PUTs in each lifetime of the current prefill's bootstrap server."""
    return [life["count"] for life in stack.bootstrap()["lifetimes"]]


def _outcome(stack: Stack, probe: Probe, record: Record, since: float, figure: str) -> None:
    """With registrar: wait for the first request answered served after `since` (within the
    bound) and record how long that took as `figure`; without: watch for FAIL_WINDOW seconds."""
    if stack.registrar:
        first = probe.wait_ok(RECOVER_BOUND, after=since)
        assert first is not None, f"not served after the event: {probe.samples[-3:]}"
        record.figures[figure] = round(first.done - since, 2)
        time.sleep(3)
    else:
        time.sleep(FAIL_WINDOW)


def _serving(stack: Stack, probe: Probe, record: Record) -> None:
    """The deployment serves before the scenario's event."""
    assert probe.wait_ok(RECOVER_BOUND) is not None, f"not serving before: {probe.samples[-3:]}"
    record.health.append(stack.health("serving"))


def run(results: list[dict[str, Any]], name: str, registrar: bool, step: Any, *args: Any) -> None:
    """Run one scenario step; its record goes to `results` whether it passed or not."""
    record = Record(name, registrar=registrar)
    try:
        step(*args, record)
    finally:
        results.append(asdict(record))


def race(stack: Stack, record: Record) -> None:
    """1. The bootstrap server comes up after the upstream retry budget is spent."""
    assert stack.prefill is not None
    if stack.registrar:
        seen = _wait_log(stack.prefill, PLUGIN_STARTED, 60)
        time.sleep(max(0.0, seen + UPSTREAM_BUDGET - time.monotonic()))
    else:
        _wait_log(stack.prefill, UPSTREAM_GAVE_UP, 60)
        record.notes.append(f"prefill log: {UPSTREAM_GAVE_UP!r}")
    start = time.monotonic()
    with Probe(stack.router_url, start) as probe:
        time.sleep(3)
        record.health.append(stack.health("bootstrap server not listening yet"))
        stack.bootstrap("start")
        zero = time.monotonic()
        record.events["bootstrap server listening"] = 0.0
        _outcome(stack, probe, record, zero - start, "listening to first success (s)")
        record.health.append(stack.health("bootstrap server listening"))
    _finish(record, probe, zero - start)
    record.figures["failures after listening"] = _failures(probe, zero - start)
    record.figures["PUTs per lifetime"] = _puts(stack)
    served = [s for s in probe.since(zero - start) if s.ok]
    if stack.registrar:
        assert record.health[0]["prefill /ready"] == "503", record.health
        assert record.health[-1]["prefill /ready"] == "200", record.health
        assert record.figures["PUTs per lifetime"] == [1]
    else:
        assert not served, f"served without registrar after the race: {served[:3]}"
        assert record.figures["PUTs per lifetime"] == [0]


def cache_moved(stack: Stack, single_url: str, record: Record) -> None:
    """5. Greedy outputs through the prefill/decode pair equal a single server's."""
    for prompt in PROMPTS:
        pd = generate(stack.router_url, prompt, timeout=60)
        alone = generate(single_url, prompt, timeout=60)
        record.figures.setdefault("outputs", []).append(
            {"prompt": prompt, "pd": pd[1], "single": alone[1]}
        )
        assert pd[0] == 200, pd
        assert alone[0] == 200, alone
        assert pd[1] == alone[1], f"{prompt!r}: PD {pd[1]!r} != single {alone[1]!r}"


def _serve_again(stack: Stack, record: Record, why: str) -> None:
    """Without registrar a failed deployment is recovered the only way it can be: relaunching
    the prefill (the seed's workaround)."""
    stack.relaunch_prefill(kill=False)
    stack.wait_prefill_up()
    stack.wait_router_ready()
    begun = time.monotonic()
    with Probe(stack.router_url, begun) as probe:
        assert probe.wait_ok(RECOVER_BOUND) is not None, probe.samples[-3:]
    record.notes.append(f"{why}: the prefill was relaunched first (the seed's workaround)")


def bootstrap_restart(stack: Stack, record: Record) -> None:
    """2. The bootstrap server stopped and started again inside the live prefill, empty."""
    assert stack.decode is not None
    if not stack.registrar:
        _serve_again(stack, record, "scenario 1 left the deployment failing")
    start = time.monotonic()
    with Probe(stack.router_url, start) as probe:
        _serving(stack, probe, record)
        mark = len(stack.decode.text())
        stack.bootstrap("stop")
        record.events["bootstrap server stopped"] = time.monotonic() - start
        # Down long enough for the decode's own heartbeat (2 misses, 5 s apart) to drop the
        # prefill: a decode that had not cached it would be in the same place.
        dropped = _wait_log(stack.decode, DECODE_DROPPED, 60, mark)
        record.events["decode dropped the prefill"] = dropped - start
        record.health.append(stack.health("bootstrap server down"))
        stack.bootstrap("start-new")
        zero = time.monotonic() - start
        record.events["bootstrap server listening again"] = zero
        _outcome(stack, probe, record, zero, "restart to first success (s)")
        record.health.append(stack.health("bootstrap server back"))
    _finish(record, probe, zero)
    record.events = {k: round(v - zero, 2) for k, v in record.events.items()}
    record.figures["failures after restart"] = _failures(probe, zero)
    record.figures["PUTs per lifetime"] = _puts(stack)
    served = [s for s in probe.since(zero) if s.ok]
    if stack.registrar:
        assert record.figures["PUTs per lifetime"][-1] == 1, record.figures
    else:
        assert not served, f"served without registrar after the restart: {served[:3]}"
        assert record.figures["PUTs per lifetime"][-1] == 0, record.figures


def prefill_relaunch(stack: Stack, record: Record) -> None:
    """3. The prefill killed and relaunched, decode and router left running."""
    assert stack.decode is not None
    assert stack.prefill is not None
    if not stack.registrar:
        _serve_again(stack, record, "scenario 2 left the deployment failing")
    start = time.monotonic()
    with Probe(stack.router_url, start) as probe:
        _serving(stack, probe, record)
        mark = len(stack.decode.text())
        # As when the relaunched bootstrap server answers /health after one miss: the decode's
        # own heartbeat does not drop the dead prefill, whatever this machine's speed.
        stack.decode_heartbeat("heartbeat-tolerant")
        zero = time.monotonic() - start
        record.events["prefill killed"] = zero
        stack.relaunch_prefill(kill=True)
        stack.wait_prefill_up()
        up = time.monotonic() - start
        record.events["prefill up again"] = up
        record.health.append(stack.health("prefill up again"))
        registered = _registered(stack, RECOVER_BOUND) - start
        record.events["prefill registered again"] = registered
        _outcome(stack, probe, record, registered, "registered to first success (s)")
        record.health.append(stack.health("after the relaunch"))
        stack.decode_heartbeat("heartbeat-default")
    decode_log = stack.decode.text()[mark:]
    dropped_by_registrar = REGISTRAR_DROPPED in decode_log
    record.notes.append(
        "the decode's heartbeat did not drop the dead prefill (made to tolerate the outage, as "
        "when a relaunched bootstrap server answers /health after one miss)"
    )
    record.figures["decode drops by registrar"] = decode_log.count(REGISTRAR_DROPPED)
    _finish(record, probe, zero)
    record.events = {k: round(v - zero, 2) for k, v in record.events.items()}
    record.figures["failures after the relaunch"] = _failures(probe, registered)
    record.figures["PUTs per lifetime"] = _puts(stack)
    assert record.figures["PUTs per lifetime"] == [1], record.figures
    served = [s for s in probe.since(registered) if s.ok]
    if stack.registrar:
        assert dropped_by_registrar, f"registrar never dropped the prefill:\n{decode_log[-3000:]}"
    else:
        assert not served, f"served with stale addresses cached on the decode: {served[:3]}"


def _registered(stack: Stack, timeout: float) -> float:
    """When the current prefill's bootstrap server first held a row."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(life["count"] for life in stack.bootstrap()["lifetimes"]):
            return time.monotonic()
        time.sleep(0.25)
    raise AssertionError(f"the relaunched prefill never registered in {timeout} s")
