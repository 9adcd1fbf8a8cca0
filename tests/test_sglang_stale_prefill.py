"""The plugin's decode side (registrar/integrations/sglang/_stale_prefill.py): which answers make
the decode drop a prefill it cached, read from SGLang's cache layout, checked against the
reference bootstrap server over HTTP with a decode manager shaped like SGLang's."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from bootstrap_lab import BootstrapLab

from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.integrations.sglang import _stale_prefill as stale_prefill
from registrar.integrations.sglang._stale_prefill import (
    CachedRow,
    RowAnswer,
    after_heartbeat_success,
    cached_rows,
    check_prefill,
    close_checks,
    decide,
)
from registrar.protocols._sglang import make_payload

ROW = CachedRow(0, 0, 0, 0, "127.0.0.1", 5000)
SAME = RowAnswer(200, "127.0.0.1", 5000)


# ------------------------------------------------------------------ deciding


def test_a_rank_registered_elsewhere_drops_at_once() -> None:
    decision = decide([(ROW, RowAnswer(200, "127.0.0.1", 6000))], None, same_cache=True)
    assert decision.drop == (
        "rank dp 0 cp 0 tp 0 pp 0 is now at 127.0.0.1:6000, cached 127.0.0.1:5000"
    )


def test_a_rank_missing_from_a_ready_server_drops() -> None:
    decision = decide([(ROW, RowAnswer(404))], None, same_cache=True)
    assert decision.drop is not None
    assert "gone" in decision.drop


def test_the_same_rows_with_no_evidence_are_kept() -> None:
    assert decide([(ROW, SAME)], None, same_cache=True) == stale_prefill.Decision(None, None)


def test_a_503_is_remembered_and_drops_once_the_rows_are_back_unchanged() -> None:
    # A prefill relaunched on the same ports: its rows look the same, but it never got the
    # decode's buffers.
    first = decide([(ROW, RowAnswer(503))], None, same_cache=True)
    assert first.drop is None
    assert first.pending is not None
    second = decide([(ROW, SAME)], first.pending, same_cache=True)
    assert second.drop is not None
    assert "registered again" in second.drop


def test_a_reopened_connection_counts_only_between_checks_of_the_same_cache() -> None:
    again = RowAnswer(200, "127.0.0.1", 5000, reconnected=True)
    assert decide([(ROW, again)], None, same_cache=True).drop is not None
    # The first check of a fresh cache: the connection dropped before it was cached.
    assert decide([(ROW, again)], None, same_cache=False) == stale_prefill.Decision(None, None)


def test_a_reopened_connection_whose_request_got_no_answer_stays_evidence() -> None:
    """A check that re-opened the connection and was then cut at its deadline (a loaded server
    just restarted) keeps the evidence: the rows coming back unchanged later drop the prefill."""
    cut = RowAnswer(None, reconnected=True)
    first = decide([(ROW, cut)], None, same_cache=True)
    assert first.drop is None
    assert first.pending is not None
    second = decide([(ROW, SAME)], first.pending, same_cache=True)
    assert second.drop is not None


def test_a_changed_instance_id_drops_once_the_rows_are_back() -> None:
    # Upstream PR #34289 (not in 0.5.23): the server's id on each answer names its process.
    new = RowAnswer(200, "127.0.0.1", 5000, instance="b")
    decision = decide([(ROW, new)], None, same_cache=True, instance="a")
    assert decision.drop == (
        "its bootstrap server's instance id changed from a to b, and its ranks registered again"
    )
    not_back = decide([(ROW, RowAnswer(503, instance="b"))], None, same_cache=True, instance="a")
    assert not_back == stale_prefill.Decision(
        None, "its bootstrap server's instance id changed from a to b"
    )
    same = RowAnswer(200, "127.0.0.1", 5000, instance="a")
    assert decide([(ROW, same)], None, same_cache=True, instance="a").drop is None
    assert decide([(ROW, SAME)], None, same_cache=True, instance="a").drop is None  # no header


def test_no_answer_is_left_to_the_heartbeat() -> None:
    other = CachedRow(0, 0, 1, 0, "127.0.0.1", 5001)
    answers = [(ROW, RowAnswer(None)), (other, RowAnswer(404))]
    assert decide(answers, "pending", same_cache=True) == stale_prefill.Decision(None, "pending")


def test_an_unexpected_status_keeps_the_rows_and_the_evidence() -> None:
    kept = stale_prefill.Decision(None, "p")
    assert decide([(ROW, RowAnswer(500))], "p", same_cache=True) == kept


# ------------------------------------------------------------------ SGLang's cache layout


def test_rows_are_read_from_sglangs_connection_pool_keys() -> None:
    info = SimpleNamespace(target_tp_ranks=[0], target_pp_ranks=[0, 1])
    pool = {
        "127.0.0.1:8998_0_0_0": [
            {"rank_ip": "127.0.0.1", "rank_port": 7001, "pp_rank": 1, "is_dummy": False},
            {"rank_ip": "127.0.0.1", "rank_port": 7000, "pp_rank": 0, "is_dummy": False},
        ],
        "127.0.0.1:89980_0_0_0": [{"rank_ip": "127.0.0.1", "rank_port": 1, "pp_rank": 0}],
        "127.0.0.1:8998_bad_key": [{"rank_ip": "127.0.0.1", "rank_port": 2, "pp_rank": 0}],
    }
    assert cached_rows("127.0.0.1:8998", pool, info) == [
        CachedRow(0, 0, 0, 1, "127.0.0.1", 7001),
        CachedRow(0, 0, 0, 0, "127.0.0.1", 7000),
    ]


def test_several_target_tp_ranks_under_one_key_keep_their_own_tp() -> None:
    # A decode with a smaller attention TP than the prefill reads two prefill ranks per key.
    info = SimpleNamespace(target_tp_ranks=[2, 3], target_pp_ranks=[0])
    pool = {
        "h:1_0_0_2": [
            {"rank_ip": "h", "rank_port": 12, "pp_rank": 0},
            {"rank_ip": "h", "rank_port": 13, "pp_rank": 0},
        ]
    }
    assert [(r.tp, r.port) for r in cached_rows("h:1", pool, info)] == [(2, 12), (3, 13)]


# ------------------------------------------------------------------ against a real server


class FakeDecodeManager:
    """The attributes of SGLang's decode `CommonKVManager` that the check reads, and a
    `_handle_node_failure` that drops the prefill as SGLang's does."""

    def __init__(self) -> None:
        self.connection_lock = threading.Lock()
        self.prefill_info_table: dict[str, Any] = {}
        self.connection_pool: dict[str, list[dict[str, Any]]] = {}
        self.failures: list[str] = []

    def cache(self, addr: str, port: int) -> None:
        self.prefill_info_table[addr] = SimpleNamespace(target_tp_ranks=[0], target_pp_ranks=[0])
        entry = {"rank_ip": "127.0.0.1", "rank_port": port, "pp_rank": 0, "is_dummy": False}
        self.connection_pool[f"{addr}_0_0_0"] = [entry]

    def _handle_node_failure(self, addr: str) -> None:
        with self.connection_lock:
            for key in [k for k in self.connection_pool if k.startswith(addr)]:
                del self.connection_pool[key]
            self.prefill_info_table.pop(addr, None)
        self.failures.append(addr)


def register(server: BootstrapServer, port: int) -> None:
    answer = requests.put(f"{server.url}/route", json=make_payload("127.0.0.1", port), timeout=5)
    assert answer.status_code == 200


@pytest.fixture
def decode(server: BootstrapServer) -> Iterator[tuple[FakeDecodeManager, str]]:
    register(server, 5000)
    manager = FakeDecodeManager()
    addr = f"127.0.0.1:{server.port}"
    manager.cache(addr, 5000)
    yield manager, addr
    close_checks(manager)


def test_a_live_prefill_is_kept(decode: tuple[FakeDecodeManager, str]) -> None:
    manager, addr = decode
    for _ in range(3):
        assert check_prefill(manager, addr) is None
    assert manager.failures == []
    assert addr in manager.prefill_info_table


def test_a_prefill_relaunched_on_new_ports_is_dropped(
    server: BootstrapServer, decode: tuple[FakeDecodeManager, str]
) -> None:
    manager, addr = decode
    assert check_prefill(manager, addr) is None
    server.restart(down_for=0.2)
    register(server, 6000)
    reason = check_prefill(manager, addr)
    assert reason is not None
    assert "now at 127.0.0.1:6000" in reason
    assert manager.failures == [addr]
    assert manager.connection_pool == {}
    # A fresh cache of the new prefill is kept: no evidence carried over.
    manager.cache(addr, 6000)
    assert check_prefill(manager, addr) is None
    assert manager.failures == [addr]


def test_a_prefill_relaunched_on_the_same_ports_is_dropped_once_registered(
    server: BootstrapServer, decode: tuple[FakeDecodeManager, str]
) -> None:
    manager, addr = decode
    assert check_prefill(manager, addr) is None
    server.restart(down_for=0.2)
    assert check_prefill(manager, addr) is None  # 503, 0 registered: not back yet
    register(server, 5000)
    reason = check_prefill(manager, addr)
    assert reason is not None
    assert manager.failures == [addr]


@pytest.mark.parametrize("instance_id", [True, False])
def test_a_new_instance_behind_a_kept_connection_is_dropped_within_one_check(
    instance_id: bool,
) -> None:
    # A prefill relaunched on the same ports behind something that keeps the decode's connection
    # (a proxy): only the instance id tells; without it, today's evidence (none here) stands.
    with BootstrapLab(instance_id=instance_id) as server:
        register(server, 5000)
        manager = FakeDecodeManager()
        addr = f"127.0.0.1:{server.port}"
        manager.cache(addr, 5000)
        try:
            assert check_prefill(manager, addr) is None
            server.forget()
            register(server, 5000)
            reason = check_prefill(manager, addr)
        finally:
            close_checks(manager)
    if instance_id:
        assert reason is not None
        assert "instance id changed" in reason
        assert manager.failures == [addr]
    else:
        assert reason is None
        assert manager.failures == []


def test_the_heartbeat_hook_never_raises_into_sglang(caplog: pytest.LogCaptureFixture) -> None:
    broken = SimpleNamespace()  # no connection_lock: the check itself fails
    assert after_heartbeat_success("result", broken, "127.0.0.1:1") == "result"
    assert "checking the prefill at 127.0.0.1:1 for a restart failed" in caplog.text


def test_entries_without_pp_rank_get_it_from_their_position() -> None:
    # SGLang 0.5.13-0.5.17: entries are {"rank_ip", "rank_port"} only, listed tp outer and
    # reversed pp inner; each gets the pp of its position, not pp 0.
    info = SimpleNamespace(target_tp_ranks=[0, 1], target_pp_ranks=[0, 1])
    pool = {
        "127.0.0.1:8998_0_0_0": [
            {"rank_ip": "h", "rank_port": 11},  # tp 0, pp 1
            {"rank_ip": "h", "rank_port": 10},  # tp 0, pp 0
            {"rank_ip": "h", "rank_port": 21},  # tp 1, pp 1
            {"rank_ip": "h", "rank_port": 20},  # tp 1, pp 0
        ]
    }
    rows = cached_rows("127.0.0.1:8998", pool, info)
    assert {(r.tp, r.pp, r.port) for r in rows} == {(0, 1, 11), (0, 0, 10), (1, 1, 21), (1, 0, 20)}
    # An order that does not match the sizes and no pp_rank: left unchecked, never misfiled.
    odd = {"127.0.0.1:8998_0_0_0": [{"rank_ip": "h", "rank_port": 11}]}
    assert cached_rows("127.0.0.1:8998", odd, info) == []
