"""Each piece of evidence that a 503 comes from a server that forgot us, on its own, against the
reference server over real HTTP (the transport driven directly, one request at a time)."""

from __future__ import annotations

import pytest
import requests
from bootstrap_lab import BootstrapLab, Fault
from support import sglang_payload

from registrar import HttpSettings, Route, Verdict
from registrar.protocols._sglang import SGLangTransport


def put(server: BootstrapLab, payload: dict) -> None:
    assert requests.put(f"{server.url}/route", json=payload, timeout=5).status_code == 200


def ours(server: BootstrapLab) -> tuple[SGLangTransport, dict]:
    transport = SGLangTransport(HttpSettings(server.url, timeout=5.0))
    payload = sglang_payload(tp_rank=0, tp_size=3, port=20000)
    assert transport.register(payload).verdict is Verdict.ACCEPTED
    return transport, payload


def reasons(evidence: str) -> list[str]:
    return evidence.split(": ", 1)[1].split("; ")


def test_other_ranks_missing_is_undetermined(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    first = transport.check(payload)
    second = transport.check(payload)
    transport.close()
    assert first.route is Route.UNDETERMINED
    assert second.route is Route.UNDETERMINED
    assert "1 workers registered" in second.evidence


def test_zero_workers(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    server.forget()  # a wipe with no restart: only the count can tell
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == ["the server has 0 workers registered"]


def test_seen_ready_then_503(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
    put(server, sglang_payload(tp_rank=2, tp_size=3, port=20002))
    assert transport.check(payload).route is Route.PRESENT
    server.forget()
    put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == ["the topology was ready since our registration"]


def test_count_fell_below_highest(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
    assert transport.check(payload).route is Route.UNDETERMINED  # highest seen: 2
    server.forget()
    put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == ["the count fell from 2 to 1"]


@pytest.mark.parametrize("instance_id", [True, False])
def test_a_changed_instance_id(instance_id: bool) -> None:
    # Upstream PR #34289 (not in 0.5.23). A new process behind something that keeps our connection,
    # another rank back first: "503, 1 worker registered", the count not below the highest seen,
    # nothing refused or re-opened. Only the id tells; without it, today's evidence stands.
    with BootstrapLab(instance_id=instance_id) as server:
        transport, payload = ours(server)
        first = server.instance_id
        server.forget()
        put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
        check = transport.check(payload)
        transport.close()
    if instance_id:
        assert check.route is Route.MISSING
        changed = f"the server's instance id changed from {first} to {server.instance_id}"
        assert reasons(check.evidence) == [changed]
    else:
        assert check.route is Route.UNDETERMINED


def test_refused_since_our_put(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    assert transport.check(payload).route is Route.UNDETERMINED
    server.stop()  # refuses connections, keeps its memory
    assert transport.check(payload).route is Route.UNREACHABLE
    server.start()
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == ["a connection was refused since our registration"]


def test_reopened_keepalive_connection(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    assert transport.check(payload).route is Route.UNDETERMINED
    server.drop_connections()  # what a restarted process does to open connections
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == [
        "the kept-alive connection was re-opened since our registration"
    ]


@pytest.mark.parametrize("kind", ["drop", "reset"])
def test_keepalive_connection_broken_under_a_check(server: BootstrapLab, kind: str) -> None:
    # The server drops our connection while a check is in flight: that check fails, and the
    # next one must still know the connection was lost (else a rank that saw neither the
    # server ready nor its count fall waits for ever).
    transport, payload = ours(server)
    assert transport.check(payload).route is Route.UNDETERMINED
    server.inject(Fault(kind, method="GET"))
    assert transport.check(payload).route is Route.UNREACHABLE
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == [
        "the kept-alive connection was re-opened since our registration"
    ]


def test_evidence_resets_at_each_accepted_put(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    server.drop_connections()
    assert transport.check(payload).route is Route.MISSING
    assert transport.register(payload).verdict is Verdict.ACCEPTED
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.UNDETERMINED


def test_connection_close_answers_are_not_reconnect_evidence(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    server.inject(Fault("status", status=503, body="(1 workers registered)", close=True))
    # An answer that closes its connection makes the next connect expected, not evidence.
    assert transport.check(payload).route is Route.UNDETERMINED
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.UNDETERMINED


def test_404_for_our_rank(server: BootstrapLab) -> None:
    transport = SGLangTransport(HttpSettings(server.url))
    payload = sglang_payload(tp_rank=1, tp_size=2, port=20001)
    put(server, sglang_payload(tp_rank=0, tp_size=2, port=20000))
    put(server, sglang_payload(tp_rank=0, tp_size=2, port=20000))  # counted twice: "ready"
    check = transport.check(payload)
    transport.close()
    assert check.route is Route.MISSING
    assert check.status_code == 404


def test_conflict_and_unparseable(server: BootstrapLab) -> None:
    transport, payload = ours(server)
    put(server, sglang_payload(tp_rank=0, tp_size=3, port=29999))
    put(server, sglang_payload(tp_rank=1, tp_size=3, port=20001))
    conflict = transport.check(payload)
    server.fail_next(1, 200, body="<html>not json</html>", content_type="text/html")
    odd = transport.check(payload)
    transport.close()
    assert conflict.route is Route.CONFLICT
    assert "29999" in conflict.evidence
    assert odd.route is Route.UNDETERMINED


@pytest.mark.parametrize(
    ("timeout", "cut_by"),
    [(0.5, "the request deadline"), ((5.0, 0.5), "the read timeout")],
)
def test_a_reopened_connection_stays_evidence_when_its_request_gets_no_answer(
    server: BootstrapLab, timeout: float | tuple[float, float], cut_by: str
) -> None:
    # A restarted server dropped our kept-alive connection; the check that re-opens it gets no
    # answer in time (a loaded server, a thousand ranks at once). The re-opening happened all
    # the same: the next check must still know it, else this rank reads "503, k workers"
    # from then on, never registers again, and the topology is never ready.
    transport = SGLangTransport(HttpSettings(server.url, timeout=timeout))
    payload = sglang_payload(tp_rank=0, tp_size=3, port=20000)
    assert transport.register(payload).verdict is Verdict.ACCEPTED
    assert transport.check(payload).route is Route.UNDETERMINED
    server.drop_connections()
    server.inject(Fault("delay", seconds=1.5, method="GET"))
    cut = transport.check(payload)
    check = transport.check(payload)
    transport.close()
    assert cut.route is Route.UNREACHABLE, cut_by
    assert check.route is Route.MISSING
    assert reasons(check.evidence) == [
        "the kept-alive connection was re-opened since our registration"
    ]
