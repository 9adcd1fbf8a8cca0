"""DP attention (`--tp 2 --dp 2 --enable-dp-attention`, issue 36's scenario 7) through the rank
harness: whole servers cannot run it on CPU (docs/e2e.md says why), so two prefill ranks are
built as SGLang's data-parallel controller starts them (sglang_support/release.py), with
registrar's plugin, against SGLang's real bootstrap server.

Each rank is attention-DP rank R with one attention-TP rank: it sends `system_dp_rank` R,
`system_dp_size` 1, `attn_dp_size` 2, `attn_tp_size` 1, and SGLang's server files its row under
`attn_dp_rank` R (as measured on a real 0.5.23 server with those flags)."""

from __future__ import annotations

from typing import Any

import pytest
import requests
from sglang_support.harness import (
    assert_init_left_registration_to_the_background,
    assert_one_put_each,
)
from support import process_port

pytestmark = pytest.mark.timeout(300)

DP = 2
"""Attention-DP groups, one TP rank each (`--tp 2 --dp 2`)."""


def route(port: int, **query: int) -> requests.Response:
    """Ask SGLang's bootstrap server, as a decode does."""
    url = f"http://127.0.0.1:{port}/route"
    return requests.get(url, params={k: str(v) for k, v in query.items()}, timeout=10)


def row(port: int, dp_rank: int) -> dict[str, Any]:
    """What the server answers a decode asking for attention-DP rank `dp_rank`'s TP rank 0."""
    answer = route(
        port, prefill_dp_rank=dp_rank, prefill_cp_rank=0, target_tp_rank=0, target_pp_rank=0
    )
    assert answer.status_code == 200, (dp_rank, answer.status_code, answer.text)
    found: dict[str, Any] = answer.json()
    return found


def test_dp_attention_ranks_register_under_their_attention_dp_rank_once_per_server_lifetime(
    spawn_rank, bootstrap
) -> None:
    port = process_port()
    procs = [spawn_rank(port, rank=r, tp_size=DP, dp_attention=DP) for r in range(DP)]
    inits = [proc.event("init", timeout=240) for proc in procs]
    ports = [init["rank_port"] for init in inits]
    for dp_rank, init in enumerate(inits):  # what SGLang put in the payload, as measured
        assert init["place"] == {
            "attn_tp_rank": 0,
            "attn_tp_size": 1,
            "attn_dp_rank": dp_rank,
            "attn_dp_size": DP,
            "system_dp_rank": dp_rank,
            "system_dp_size": 1,
        }, init
    for proc in procs:
        assert_init_left_registration_to_the_background(proc)
    # Both ranks are TP rank 0 of their own attention-DP group.
    everyone = {(dp, 0, 0, 0) for dp in range(DP)}
    for lifetime in range(2):  # a late start, then a restart on the same port, empty
        server = bootstrap(port).start()
        assert_one_put_each(server, procs, everyone, lifetime)
        # The widths the server took from the PUTs: two attention-DP groups of one TP rank.
        info = route(
            port, prefill_dp_rank=-1, prefill_cp_rank=-1, target_tp_rank=-1, target_pp_rank=-1
        )
        assert info.status_code == 200, info.text
        assert (info.json()["dp_size"], info.json()["attn_tp_size"]) == (DP, 1), info.json()
        # Each attention-DP rank's row is that rank's own address.
        for dp_rank, rank_port in enumerate(ports):
            found = row(port, dp_rank)
            assert (found["rank_ip"], found["rank_port"]) == ("127.0.0.1", rank_port), found
        server.close()
    for proc in procs:
        [status] = proc.status()
        assert status["rank"]["dp"] == procs.index(proc), status
        assert (status["state"], status["registrations"]) == ("registered", 2), status
