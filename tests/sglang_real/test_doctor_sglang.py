"""`registrar doctor` and the diagnosis against SGLang 0.5.23's real `CommonKVBootstrapServer`:
the doctor reads its rows as registrar's reference server's (complete, incomplete, a rank
counted twice), and a real rank pointed at a port where nothing listens states a diagnosis in
its log and `/server_info`, which clears once the server is there."""

from __future__ import annotations

import json
from typing import Any

import pytest
import requests
from sglang_support.harness import wait_for
from support import process_port, sglang_payload

from registrar.surfaces.cli import main

pytestmark = pytest.mark.timeout(300)


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = main(["doctor", *args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _rows(report: dict[str, Any]) -> dict[str, Any]:
    (rows,) = [c for c in report["checks"] if c["check"] == "rows"]
    return rows


def _put(server_port: int, **payload: Any) -> None:
    url = f"http://127.0.0.1:{server_port}/route"
    assert requests.put(url, json=sglang_payload(**payload), timeout=5).status_code == 200


def test_doctor_reads_the_real_servers_rows(bootstrap: Any, capsys: Any) -> None:
    port = process_port()
    bootstrap(port).start()
    url = f"http://127.0.0.1:{port}"
    code, report = _doctor(capsys, "--url", url, "--expect", "2")
    assert code == 1
    assert report["checks"][2]["status"] == "pass"  # it speaks the protocol, with no row
    assert _rows(report)["data"]["registered"] == 0
    _put(port, tp_rank=0, tp_size=2, port=20000)
    code, report = _doctor(capsys, "--url", url, "--expect", "2")
    assert (code, _rows(report)["data"]["registered"]) == (1, 1)
    _put(port, tp_rank=1, tp_size=2, port=20001)
    code, report = _doctor(capsys, "--url", url, "--expect", "2")
    assert code == 0, report
    assert _rows(report)["data"] == {"registered": 2, "expected": 2, "missing": []}


def test_doctor_names_the_rank_a_double_count_left_out(bootstrap: Any, capsys: Any) -> None:
    port = process_port()
    bootstrap(port).start()
    _put(port, tp_rank=0, tp_size=2)
    _put(port, tp_rank=0, tp_size=2)  # the real server counts every PUT
    code, report = _doctor(capsys, "--url", f"http://127.0.0.1:{port}")
    assert code == 1
    assert _rows(report)["data"]["missing"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]


@pytest.mark.same_on_every_release
def test_a_real_rank_on_a_wrong_port_states_a_diagnosis_that_clears(
    spawn_rank: Any, bootstrap: Any
) -> None:
    port = process_port()
    rank = spawn_rank(port, REGISTRAR_DIAGNOSE_AFTER="0.5")
    rank.event("init")

    def diagnosis() -> Any:
        rows = rank.status()
        return rows[0].get("diagnosis") if rows else None

    assert wait_for(lambda: diagnosis() is not None, timeout=60)
    seen = diagnosis()
    assert seen["code"] in ("refused", "refused-host-up"), seen
    assert f"nothing listens on 127.0.0.1:{port}" in seen["sentence"]
    assert f"[diagnosis {seen['code']}]" in rank.log.read_text()
    bootstrap(port).start()
    assert wait_for(lambda: rank.status()[0]["state"] == "registered", timeout=60)
    assert wait_for(lambda: diagnosis() is None, timeout=30)


def test_doctor_reads_this_sglang_release_and_what_the_plugin_does(capsys: Any) -> None:
    from importlib.metadata import version

    code, report = _doctor(capsys, "--sglang")
    release, plugin = (c for c in report["checks"] if c["target"] == "sglang")
    assert release["status"] == "pass", release
    assert f"sglang {version('sglang')}" in release["detail"]
    assert plugin["status"] == "pass", plugin
    assert code == 0
    assert report["healthy"] is True
