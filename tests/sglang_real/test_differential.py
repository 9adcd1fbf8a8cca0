"""The reference bootstrap server against SGLang's real one: the same request scripts, every
answer compared (status, content type, body; the counting shows in the 503 texts and the
server info). A difference here means registrar's tests and demo exercise a server that is not
SGLang's. The reference server copies the installed release (its test lab's `release` knob,
tests/bootstrap_lab.py), so each release of the CI matrix checks the fields and 400s it has, and
that it ignores the later ones (every script sends them all)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from bootstrap_lab import BootstrapLab
from sglang_support.harness import Server
from sglang_support.release import installed
from support import process_port, sglang_payload

pytestmark = pytest.mark.timeout(120)

Step = tuple[str, str, Any]
"""(method, path with query, JSON body | raw bytes | None)."""

RANK = "/route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank={tp}&target_pp_rank=0"
INFO = "/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"


def rank(tp: int) -> str:
    return RANK.format(tp=tp)


def query(dp: str = "0", cp: str = "0", tp: str = "0", pp: str | None = "0") -> str:
    path = f"/route?prefill_dp_rank={dp}&prefill_cp_rank={cp}&target_tp_rank={tp}"
    return path if pp is None else f"{path}&target_pp_rank={pp}"


def put(**fields: Any) -> Step:
    return ("PUT", "/route", sglang_payload(**fields))


SCRIPTS: dict[str, list[Step]] = {
    "two ranks, counting, lookups": [
        ("GET", rank(0), None),
        ("GET", INFO, None),
        put(tp_rank=0, tp_size=2),
        ("GET", rank(0), None),
        put(tp_rank=0, tp_size=2),  # a second PUT of a present rank counts: "ready" too early
        ("GET", INFO, None),
        ("GET", rank(1), None),
        put(tp_rank=1, tp_size=2, port=20001),
        ("GET", rank(1), None),
        ("GET", rank(0), None),
        ("GET", query(pp=None), None),
        ("GET", query(dp=""), None),
        ("GET", query(dp="x"), None),
        ("GET", query(tp="x"), None),
        ("GET", query(dp="-1", cp="0"), None),
        ("GET", RANK.format(tp=0) + "&target_tp_rank=1", None),
    ],
    "methods and paths": [
        ("POST", "/route", {}),
        ("DELETE", "/route", None),
        ("PATCH", "/route", None),
        ("GET", "/nothing-here", None),
        ("PUT", "/health", None),
        ("GET", "/health", None),
    ],
    "bad bodies": [
        ("PUT", "/route", b"{not json"),
        ("PUT", "/route", b"[1, 2]"),
        ("PUT", "/route", {k: v for k, v in sglang_payload().items() if k != "kv_cache_dtype"}),
        put(page_size=None),
        put(rank_port="x"),
        ("GET", rank(0), None),
    ],
    "decode_allocation_policy: absent, then prefill_complete": [
        put(tp_rank=0, tp_size=2),
        put(tp_rank=1, tp_size=2, decode_allocation_policy="prefill_complete"),
        ("GET", rank(1), None),
        put(tp_rank=1, tp_size=2, decode_allocation_policy="early"),
        ("GET", INFO, None),
    ],
    "dsv41_spec_layout differs": [
        put(tp_rank=0, tp_size=3, dsv41_spec_layout={"k": 1}),
        put(tp_rank=1, tp_size=3, dsv41_spec_layout={"k": 2}),
        put(tp_rank=1, tp_size=3),
        put(tp_rank=1, tp_size=3, dsv41_spec_layout={"k": 1}),
        put(tp_rank=2, tp_size=3, dsv41_spec_layout={"k": 1}, kv_layout="nhd"),
        ("GET", INFO, None),
    ],
    "server info fields": [
        put(
            prefill_http_port="30000",
            load_balance_method="round_robin",
            enable_dsa_cache_layer_split=1,
            enable_kv_cache_sharding=True,
            kv_layout="hnd",
            page_size="64",
        ),
        ("GET", INFO, None),
        ("GET", rank(0), None),
    ],
    "a wrongly typed size field": [
        put(tp_size="1"),
        ("GET", rank(0), None),
        ("GET", INFO, None),
    ],
    "a null size field": [
        put(tp_size=None),
        ("GET", rank(0), None),
        put(),
        ("GET", rank(0), None),
    ],
    "a float size and rank": [
        put(tp_size=2.0, tp_rank=1.0),
        put(tp_size=2, tp_rank=0),
        ("GET", rank(1), None),
        ("GET", INFO, None),
    ],
}


def run(base: str, script: list[Step]) -> list[tuple[int, str, str]]:
    answers = []
    with requests.Session() as session:
        for method, path, body in script:
            kwargs: dict[str, Any] = {"timeout": 10}
            if isinstance(body, bytes):
                kwargs["data"] = body
            elif body is not None:
                kwargs["json"] = body
            answer = session.request(method, base + path, **kwargs)
            mime = answer.headers.get("Content-Type", "").split(";")[0]
            answers.append((answer.status_code, mime, answer.text))
    return answers


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_reference_server_answers_as_sglang_does(name: str) -> None:
    script = SCRIPTS[name]
    real = Server(process_port()).start()
    try:
        expected = run(f"http://127.0.0.1:{real.port}", script)
    finally:
        real.close()
    with BootstrapLab(release=installed()) as reference:
        got = run(reference.url, script)
    for step, want, have in zip(script, expected, got, strict=True):
        assert have == want, f"{name}: {step[0]} {step[1]} {json.dumps(step[2], default=str)}"
