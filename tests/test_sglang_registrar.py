"""Registrars of the SGLang protocol against the reference bootstrap server over real HTTP:
restarts that forget, multi-rank topologies, conflicts, reports, tokens, validation."""

from __future__ import annotations

import logging

import pytest
import requests
from bootstrap_lab import BootstrapLab, Fault
from support import SENTINEL, sglang_payload, wait_until

from registrar import Backoff, ConfigError, Registrar, State

FAST = Backoff(initial=0.2, multiplier=2.0, maximum=1.0, jitter=0.25)


def start(
    registrars: list[Registrar], server: BootstrapLab, payload: dict, **kwargs: object
) -> Registrar:
    kwargs.setdefault("backoff", FAST)
    kwargs.setdefault("watch_interval", 0.3)
    reg = Registrar(server.url, payload, **kwargs)  # type: ignore[arg-type]
    registrars.append(reg)
    return reg.start()


def topology(
    registrars: list[Registrar], server: BootstrapLab, tp: int, pp: int = 1, **kwargs: object
) -> list[Registrar]:
    regs = []
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            payload = sglang_payload(
                tp_rank=tp_rank,
                tp_size=tp,
                port=21000 + pp_rank * tp + tp_rank,
                pp_size=pp,
                pp_rank=pp_rank,
            )
            regs.append(start(registrars, server, payload, **kwargs))
    return regs


def all_back(server: BootstrapLab, regs: list[Registrar], registrations: int) -> bool:
    return server.ready and all(
        r.state is State.REGISTERED and r.status().registrations >= registrations for r in regs
    )


def assert_every_rank_at_its_address(server: BootstrapLab, regs: list[Registrar]) -> None:
    routes = server.routes()
    for reg in regs:
        p = reg.payload
        key = (p["attn_dp_rank"], p["attn_cp_rank"], p["attn_tp_rank"], p["pp_rank"])
        assert routes[key] == {"rank_ip": p["rank_ip"], "rank_port": p["rank_port"]}
    assert len(routes) == len(regs)
    answer = requests.get(f"{server.url}/route", params=SENTINEL, timeout=5)
    assert answer.status_code == 200
    assert answer.json()["attn_tp_size"] == regs[0].payload["attn_tp_size"]
    # Every PUT is counted by the server: exactly one per rank means no double registration.
    assert server.registered_count == len(regs)


def test_restart_that_forgets_is_repaired(server: BootstrapLab, registrars: list) -> None:
    reg = start(registrars, server, sglang_payload())
    assert reg.wait_for(State.REGISTERED, timeout=10)
    server.restart()
    assert wait_until(lambda: reg.status().registrations == 2, timeout=10)
    status = reg.status()
    assert status.reregistrations == 1
    assert status.server_reachable is True
    assert status.last_check_at is not None
    assert_every_rank_at_its_address(server, [reg])


def test_server_down_for_a_while_then_back_empty(
    server: BootstrapLab, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="registrar")
    reg = start(registrars, server, sglang_payload())
    assert reg.wait_for(State.REGISTERED, timeout=10)
    server.stop()
    # A check in flight while the server goes down may see a reset rather than a refusal.
    assert wait_until(lambda: "[Errno 111] Connection refused" in caplog.text, timeout=10)
    assert reg.status().server_reachable is False
    assert reg.state is State.REGISTERED  # unreachable is not missing
    server.forget()
    server.start()
    assert wait_until(lambda: reg.status().registrations == 2, timeout=10)
    assert "a connection was refused since our registration" in caplog.text
    assert_every_rank_at_its_address(server, [reg])


@pytest.mark.parametrize("down_for", [0.0, 1.5], ids=["fast", "slow"])
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (2, 2)], ids=["2-ranks", "4-ranks"])
def test_topology_through_a_restart(
    server: BootstrapLab, registrars: list, tp: int, pp: int, down_for: float
) -> None:
    regs = topology(registrars, server, tp, pp)
    assert wait_until(lambda: all_back(server, regs, 1), timeout=15)
    assert_every_rank_at_its_address(server, regs)
    server.restart(down_for=down_for)
    assert wait_until(lambda: all_back(server, regs, 2), timeout=20)
    assert_every_rank_at_its_address(server, regs)
    assert all(r.status().reregistrations == 1 for r in regs)


def test_a_new_instance_id_is_acted_on_within_one_check_once(registrars: list) -> None:
    # Upstream PR #34289 (not in 0.5.23): rank A registered, B not yet; the server is replaced
    # behind a kept connection and B registers first. A reads "503, 1 worker registered", which
    # only the changed id tells from "B missing"; it registers again within one check interval,
    # and each rank is counted once in the new lifetime.
    interval = 0.5
    with BootstrapLab(instance_id=True) as server:
        a = start(registrars, server, sglang_payload(0, 2, port=21000), watch_interval=interval)
        assert a.wait_for(State.REGISTERED, timeout=10)
        server.forget()
        b = start(registrars, server, sglang_payload(1, 2, port=21001), watch_interval=interval)
        assert wait_until(lambda: all_back(server, [a, b], 1), timeout=10)
        assert a.status().reregistrations == 1
        assert wait_until(lambda: len([r for r in server.records() if r.method == "GET"]) > 12)
        puts = [r for r in server.records() if r.method == "PUT"]
    # One PUT per rank per lifetime (A's check may rarely fall between the replacement and B's
    # PUT: it then reads "0 workers" and goes first).
    assert puts[0].rank_port == 21000
    assert sorted(p.rank_port for p in puts[1:]) == [21000, 21001]
    assert abs(puts[2].at - puts[1].at) < interval * 1.2 + 0.3  # the jitter, a loaded machine
    assert server.registered_count == 2


def test_system_dp_ranks(server: BootstrapLab, registrars: list) -> None:
    regs = [
        start(
            registrars, server, sglang_payload(system_dp_size=2, system_dp_rank=d, port=22000 + d)
        )
        for d in range(2)
    ]
    assert wait_until(lambda: all_back(server, regs, 1), timeout=10)
    assert set(server.routes()) == {(0, 0, 0, 0), (1, 0, 0, 0)}


def test_dp_attention_ranks_register_by_their_attention_dp_rank(
    server: BootstrapLab, registrars: list
) -> None:
    """`--dp 2 --enable-dp-attention` on SGLang 0.5.23 (measured): each rank sends its attention-DP
    rank as `system_dp_rank` with `system_dp_size` 1, and the server files it by `attn_dp_rank`.
    Rank 1's payload was refused before (system_dp_rank outside [0, 1)), so it fell back to
    SGLang's own PUT."""
    regs = [
        start(
            registrars,
            server,
            sglang_payload(
                attn_dp_size=2, attn_dp_rank=d, system_dp_size=1, system_dp_rank=d, port=23000 + d
            ),
        )
        for d in range(2)
    ]
    assert wait_until(lambda: all_back(server, regs, 1), timeout=10)
    assert set(server.routes()) == {(0, 0, 0, 0), (1, 0, 0, 0)}


def test_present_route_is_never_sent_again(server: BootstrapLab, registrars: list) -> None:
    reg = start(registrars, server, sglang_payload(), watch_interval=0.05)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert wait_until(lambda: sum(r.method == "GET" for r in server.records()) >= 21, timeout=20)
    assert [r.method for r in server.records()].count("PUT") == 1
    assert server.registered_count == 1
    assert reg.status().route == "present"


def test_conflict_is_reported_not_fought(
    server: BootstrapLab, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    reg = start(registrars, server, sglang_payload(port=20000), watch_interval=0.1)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    other = sglang_payload(port=29999)
    assert requests.put(f"{server.url}/route", json=other, timeout=5).status_code == 200
    assert wait_until(lambda: reg.status().route == "conflict", timeout=10)
    assert wait_until(lambda: "29999" in caplog.text, timeout=5)
    assert [r.rank_port for r in server.records() if r.method == "PUT"] == [20000, 29999]
    assert reg.state is State.REGISTERED


def test_report_route_missing_acts_at_once(server: BootstrapLab, registrars: list) -> None:
    reg = start(registrars, server, sglang_payload(), watch_interval=3600)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    server.restart()
    reg.report_route_missing()
    assert wait_until(lambda: reg.status().registrations == 2, timeout=10)
    assert reg.status().reregistrations == 1
    assert_every_rank_at_its_address(server, [reg])


def test_report_of_a_present_route_is_verified_and_ignored(
    server: BootstrapLab, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    reg = start(registrars, server, sglang_payload(), watch_interval=3600)
    assert reg.wait_for(State.REGISTERED, timeout=10)
    reg.report_route_missing()
    assert wait_until(lambda: "not registering again" in caplog.text, timeout=10)
    assert server.registered_count == 1
    assert reg.status().registrations == 1


def test_token_is_sent_and_never_shown(
    registrars: list, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.DEBUG)
    with BootstrapLab(token="s3cret-token") as server:
        good = start(registrars, server, sglang_payload(), token="s3cret-token")
        assert good.wait_for(State.REGISTERED, timeout=10)
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "s3cret-token")
        from_env = start(registrars, server, sglang_payload(port=20001))
        assert from_env.wait_for(State.REGISTERED, timeout=10)
        monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN")
        wrong = start(registrars, server, sglang_payload(port=20002), token="wrong-token")
        missing = start(registrars, server, sglang_payload(port=20003))
        assert wrong.wait_for(State.FAILED, timeout=10)
        assert missing.wait_for(State.FAILED, timeout=10)
        for reg in (good, from_env, wrong, missing):
            reg.stop()
    error = wrong.status().last_error or ""
    assert error.startswith("401 Unauthorized from http://127.0.0.1:")
    assert "check the bootstrap auth token (from token)" in error  # the one that was sent
    assert "pass one with token= or SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN" in (
        missing.status().last_error or ""
    )
    assert wrong.status().attempts_total == 1  # not retried
    shown = caplog.text + repr(wrong) + str(wrong.status().to_dict())
    assert "s3cret-token" not in shown
    assert "wrong-token" not in shown


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"rank_ip": None}, "rank_ip must be a non-empty string"),
        ({"rank_port": "8000"}, "rank_port must be an integer"),
        ({"rank_port": 70000}, "rank_port must be within [1, 65535]"),
        ({"attn_tp_rank": 2}, "attn_tp_rank must be within [0, attn_tp_size=1)"),
        (
            {"system_dp_size": 2, "system_dp_rank": 2},
            "system_dp_rank must be within [0, system_dp_size=2)",
        ),
        ({"page_size": None}, "page_size must be an integer"),
        ({"pp_size": 0}, "pp_size must be >= 1"),
        ({"attn_dp_rank": True}, "attn_dp_rank must be an integer"),
    ],
)
def test_payload_validation_messages(change: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Registrar("http://127.0.0.1:8998", sglang_payload(**change))
    assert message in str(info.value)


def test_missing_fields_are_listed_together() -> None:
    payload = sglang_payload()
    del payload["page_size"], payload["kv_cache_dtype"]
    with pytest.raises(ValueError, match="missing page_size, kv_cache_dtype"):
        Registrar("http://127.0.0.1:8998", payload)


def test_fatal_payload_answer_says_what_to_fix(server: BootstrapLab, registrars: list) -> None:
    server.fail_next(1, 400, body="Inconsistent decode_allocation_policy", method="PUT")
    reg = start(registrars, server, sglang_payload())
    assert reg.wait_for(State.FAILED, timeout=10)
    assert reg.status().last_error == (
        f"400 Bad Request from {server.url}/route: check the payload "
        "(Inconsistent decode_allocation_policy)"
    )


def test_restart_while_checks_are_in_flight(server: BootstrapLab, registrars: list) -> None:
    # The server restarts while every rank's check is waiting for an answer: those checks fail
    # on a dropped connection, and every rank must still come back exactly once.
    regs = topology(registrars, server, tp=4, watch_interval=0.5)
    assert wait_until(lambda: all_back(server, regs, 1), timeout=15)
    server.inject(Fault("hang", count=len(regs), method="GET"))
    # Every rank's next check has taken its hang (a fault is spent as its request starts).
    assert wait_until(lambda: server.pending_faults == 0, timeout=15)
    server.restart()
    assert wait_until(lambda: all_back(server, regs, 2), timeout=20)
    assert_every_rank_at_its_address(server, regs)
