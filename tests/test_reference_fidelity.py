"""The reference server answers as SGLang 0.5.23's CommonKVBootstrapServer does, in the cases
where it used to differ (tests/sglang_real/test_differential.py checks every answer against the
real server; these keep the core suite honest where SGLang is not installed)."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest
import requests
from bootstrap_lab import BootstrapLab, Fault
from support import sglang_payload, wait_until

CRASH = "500 Internal Server Error\n\nServer got itself in trouble"
RANK0 = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0"


def test_a_wrongly_typed_size_is_accepted_then_every_lookup_is_a_500() -> None:
    # The real server stores "1" as the size, then fails comparing its count with it.
    with BootstrapLab() as server:
        put = requests.put(f"{server.url}/route", json=sglang_payload(tp_size="1"), timeout=5)
        assert (put.status_code, put.text) == (200, "OK")
        for _ in range(2):
            answer = requests.get(server.url + RANK0, timeout=5)
            assert (answer.status_code, answer.text) == (500, CRASH)
        assert server.registered_count == 1
        assert server.ready is False


def test_a_null_size_is_a_500_after_the_row_is_counted() -> None:
    with BootstrapLab() as server:
        put = requests.put(f"{server.url}/route", json=sglang_payload(tp_size=None), timeout=5)
        assert (put.status_code, put.text) == (500, CRASH)
        assert server.registered_count == 1  # counted before the real server fails


def test_policy_absent_then_prefill_complete_is_a_400() -> None:
    with BootstrapLab() as server:
        first = sglang_payload(tp_rank=0, tp_size=2)
        second = sglang_payload(tp_rank=1, tp_size=2, decode_allocation_policy="prefill_complete")
        assert requests.put(f"{server.url}/route", json=first, timeout=5).status_code == 200
        answer = requests.put(f"{server.url}/route", json=second, timeout=5)
        assert answer.status_code == 400
        assert answer.text == "Inconsistent prefill allocation policies"


def test_a_differing_dsv41_layout_is_a_400() -> None:
    with BootstrapLab() as server:
        first = sglang_payload(tp_rank=0, tp_size=2, dsv41_spec_layout={"k": 1})
        second = sglang_payload(tp_rank=1, tp_size=2, dsv41_spec_layout={"k": 2})
        assert requests.put(f"{server.url}/route", json=first, timeout=5).status_code == 200
        answer = requests.put(f"{server.url}/route", json=second, timeout=5)
        assert answer.status_code == 400
        assert answer.text == "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks"


INFO = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


@pytest.mark.parametrize(
    ("release", "added"),
    [
        ("0.5.13", ()),
        ("0.5.19", ("enable_dsa_cache_layer_split", "prefill_http_port")),
        ("0.5.21", ("enable_dsa_cache_layer_split", "prefill_http_port", "dsv41_spec_layout")),
        (
            "0.5.22.post1",
            (
                "enable_dsa_cache_layer_split",
                "dsv41_spec_layout",
                "decode_allocation_policy",
                "prefill_http_port",
            ),
        ),
    ],
)
def test_an_older_release_ignores_the_later_fields_and_their_checks(
    release: str, added: tuple[str, ...]
) -> None:
    # Each rank differs in every later field: only the release's own checks refuse a PUT.
    layouts = [{"k": 1}, {"k": 2}]
    policies = ["early", "prefill_complete"]
    with BootstrapLab(release=release) as server:
        for tp in (0, 1):
            payload = sglang_payload(
                tp_rank=tp,
                tp_size=2,
                dsv41_spec_layout=layouts[tp],
                decode_allocation_policy=policies[tp],
                kv_layout="hnd",
                enable_kv_cache_sharding=True,
                prefill_http_port="30000",
            )
            answer = requests.put(f"{server.url}/route", json=payload, timeout=5)
            assert answer.status_code == (400 if tp and "dsv41_spec_layout" in added else 200)
        if "dsv41_spec_layout" in added:
            return
        info = requests.get(server.url + INFO, timeout=5).json()
    base = ["attn_tp_size", "attn_cp_size", "dp_size", "pp_size", "page_size", "kv_cache_dtype"]
    targets = [name for name in info if name.startswith("target_") or name.startswith("required")]
    assert [name for name in info if name not in base + targets] == [
        "follow_bootstrap_room",
        *added,
    ]


@pytest.mark.parametrize("release", ["0.5.9", "0.4.10", "latest", "0.5", "0.5.19rc1"])
def test_a_release_the_reference_server_cannot_copy_is_refused_by_name(release: str) -> None:
    with pytest.raises(ValueError, match=f"release={release!r}"):
        BootstrapLab(release=release)


def test_404_and_405_bodies() -> None:
    with BootstrapLab() as server:
        requests.put(f"{server.url}/route", json=sglang_payload(tp_size=2), timeout=5)
        requests.put(f"{server.url}/route", json=sglang_payload(tp_size=2, port=1), timeout=5)
        rank1 = RANK0.replace("target_tp_rank=0", "target_tp_rank=1")
        missing = requests.get(server.url + rank1, timeout=5)
        assert (missing.status_code, missing.text) == (
            404,
            "Bootstrap info not found for dp_rank=0 cp_rank=0 tp_rank=1 pp_rank=0",
        )
        post = requests.post(f"{server.url}/route", json={}, timeout=5)
        assert (post.status_code, post.text) == (405, "Method not allowed")
        assert post.headers["Content-Type"].startswith("application/json")
        other = requests.get(f"{server.url}/elsewhere", timeout=5)
        assert (other.status_code, other.text) == (404, "404: Not Found")


def test_an_answer_leaves_in_one_write_on_a_kept_alive_connection() -> None:
    """Headers and body written apart meet the client's delayed ACK (Nagle holds the body
    back ~40 ms per request on a kept-alive connection): each answer must arrive whole in
    the first read, request after request."""
    with BootstrapLab() as server, socket.create_connection(("127.0.0.1", server.port)) as s:
        for _ in range(5):
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            first = s.recv(65536)
            assert first.startswith(b"HTTP/1.1 200"), first
            assert first.endswith(b"\r\n\r\nOK"), first


def test_a_put_read_before_a_restart_is_not_counted_after_it() -> None:
    """A restarted SGLang server is a new process: a PUT the old one had read and not yet
    applied died with it, unanswered. The reference server must not apply it to the new
    lifetime's memory (a rank would be counted twice there, by no fault of its client)."""
    with BootstrapLab() as server:
        server.inject(Fault("delay", seconds=60.0, method="PUT"))
        body = json.dumps(sglang_payload()).encode()
        answers: list[object] = []

        def put() -> None:
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            try:
                conn.request("PUT", "/route", body, {"Content-Type": "application/json"})
                answers.append(conn.getresponse().status)
            except (OSError, http.client.HTTPException) as exc:
                answers.append(exc)
            finally:
                conn.close()

        sender = threading.Thread(target=put)
        sender.start()
        try:
            # The handler has taken the delay: the request was read, its answer is held back.
            assert wait_until(lambda: server.pending_faults == 0)
            server.restart()  # ends the delay: the held request goes on, in the new lifetime
            assert wait_until(lambda: len(server.records()) == 1)
        finally:
            sender.join(30)
        assert [(r.method, r.status) for r in server.records()] == [("PUT", None)]
        assert server.registered_count == 0
        assert server.routes() == {}
        assert len(answers) == 1
        assert not isinstance(answers[0], int)  # no answer: the connection was closed
        # A connection of the new lifetime is served by it.
        put_again = requests.put(f"{server.url}/route", json=sglang_payload(), timeout=5)
        assert put_again.status_code == 200
        assert server.registered_count == 1
