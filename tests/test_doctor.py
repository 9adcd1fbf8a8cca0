"""`registrar doctor` against real servers on 127.0.0.1: the reference bootstrap server (complete,
incomplete, a rank registered twice), the real smg gateway (healthy, a worker listed twice, an
unhealthy worker), a real etcd, and each misconfiguration staged for real. Exit 0 only when
every check passed; the JSON is the documented schema."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from etcd_support import etcd_cluster
from hostile_server import HostileServer, answer
from smg_support import Gateway, StandInWorker
from support import Ports, sglang_payload, wait_until
from test_diagnosis_staged import HTML, NOT_FOUND_JSON

from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.surfaces.cli import main

Doctor = Callable[..., tuple[int, dict[str, Any]]]


@pytest.fixture
def doctor(capsys: pytest.CaptureFixture[str]) -> Doctor:
    """Run `registrar doctor ARGS --json`: the exit status and the parsed report."""

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        code = main(["doctor", *args, "--json"])
        out = capsys.readouterr().out
        return code, json.loads(out)

    return run


def _check(report: dict[str, Any], target: str, check: str) -> dict[str, Any]:
    (found,) = [c for c in report["checks"] if c["target"] == target and c["check"] == check]
    return found


def _put(server: BootstrapServer, **payload: Any) -> None:
    answered = requests.put(f"{server.url}/route", json=sglang_payload(**payload), timeout=5)
    assert answered.status_code == 200


def _code(report: dict[str, Any]) -> str:
    (failed,) = [c for c in report["checks"] if c["status"] == "fail"]
    assert failed["diagnosis"] is not None, failed
    return str(failed["diagnosis"]["code"])


def test_a_complete_topology_is_healthy(doctor: Doctor, server: BootstrapServer) -> None:
    _put(server, tp_rank=0, tp_size=2, port=20000)
    _put(server, tp_rank=1, tp_size=2, port=20001)
    code, report = doctor("--url", server.url, "--expect", "2")
    assert code == 0
    assert report["healthy"] is True
    checks = ["resolves", "listens", "protocol", "rows", "auth"]
    assert [c["check"] for c in report["checks"]] == checks
    assert _check(report, "bootstrap", "auth")["status"] == "pass"  # 0.5.23: no token to send
    assert _check(report, "bootstrap", "rows")["data"] == {
        "registered": 2,
        "expected": 2,
        "missing": [],
    }


def test_an_incomplete_topology_says_how_many_are_in(
    doctor: Doctor, server: BootstrapServer
) -> None:
    _put(server, tp_rank=0, tp_size=2)
    code, report = doctor("--url", server.url, "--expect", "2")
    assert code == 1
    rows = _check(report, "bootstrap", "rows")
    assert rows["status"] == "fail"
    assert rows["data"]["registered"] == 1
    assert "1 of 2 rows registered" in rows["detail"]


def test_with_no_row_registered_every_rank_is_named_missing(
    doctor: Doctor, server: BootstrapServer
) -> None:
    """No rank registered (node 0's server out of the ranks' reach): the server knows no
    topology to list, so doctor says every rank is missing and where to look."""
    code, report = doctor("--url", server.url, "--expect", "2")
    rows = _check(report, "bootstrap", "rows")
    assert code == 1
    assert rows["data"] == {"registered": 0, "expected": 2, "missing": None}
    assert "0 of 2 rows registered" in rows["detail"]
    assert "no rank has registered, so every rank is missing" in rows["detail"]
    assert "--dist-init-addr" in rows["detail"]


def test_before_the_count_is_reached_the_plugins_server_info_names_the_missing_rank(
    doctor: Doctor, server: BootstrapServer, ports: Ports
) -> None:
    """The real server answers 503 for every rank until the count is reached; node 0's plugin
    lists the rows it lacks in the prefill's /server_info, which `--http-port` points at."""
    _put(server, tp_rank=0, tp_size=2)
    info = {"registrar_bootstrap": {"missing_rows": [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]}}
    missing = info["registrar_bootstrap"]["missing_rows"]
    with HostileServer(answer(200, json.dumps(info))) as prefill:
        code, report = doctor(
            "--url", server.url, "--expect", "2", "--http-port", str(prefill.port)
        )
    rows = _check(report, "bootstrap", "rows")
    assert code == 1
    assert rows["data"] == {"registered": 1, "expected": 2, "missing": missing}
    assert "1 of 2 rows registered" in rows["detail"]
    assert "missing, as the prefill's /server_info lists them: dp0 cp0 tp1 pp0" in rows["detail"]
    code, report = doctor(
        "--url", server.url, "--expect", "2", "--http-port", str(ports.refusing())
    )
    assert _check(report, "bootstrap", "rows")["data"]["missing"] is None  # nothing answers there


def test_a_rank_registered_twice_leaves_another_missing_and_doctor_names_it(
    doctor: Doctor, server: BootstrapServer
) -> None:
    _put(server, tp_rank=0, tp_size=2)
    _put(server, tp_rank=0, tp_size=2)  # counted twice: the server says "ready"
    code, report = doctor("--url", server.url)
    assert code == 1
    rows = _check(report, "bootstrap", "rows")
    assert rows["data"]["missing"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]
    assert "dp0 cp0 tp1 pp0" in rows["detail"]


def test_a_topology_of_another_size_than_expected_fails(
    doctor: Doctor, server: BootstrapServer
) -> None:
    _put(server)
    code, report = doctor("--url", server.url, "--expect", "4")
    assert code == 1
    assert "1 rows, 4 expected" in _check(report, "bootstrap", "rows")["detail"]


def test_a_server_that_requires_a_token_is_named_with_the_variable_to_set(
    doctor: Doctor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Upstream PR #39416 (not in 0.5.23): 401 on PUT /route without the token; GETs stay open.
    monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", raising=False)
    with BootstrapServer(token="s3cret") as server:
        _put_with = {"headers": {"Authorization": "Bearer s3cret"}}
        answered = requests.put(
            f"{server.url}/route", json=sglang_payload(), timeout=5, **_put_with
        )
        assert answered.status_code == 200
        code, report = doctor("--url", server.url)
        unknown = _check(report, "bootstrap", "auth")
        assert code == 0  # the ranks may hold SGLang's own token: not a failure by itself
        assert unknown["status"] == "skip"
        assert unknown["diagnosis"]["code"] == "denied"
        assert "requires a bearer token on PUT /route (401 without one)" in unknown["detail"]
        assert (
            "set SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN (or REGISTRAR_TOKEN_FILE)"
            in (unknown["detail"])
        )
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "wrong")
        code, report = doctor("--url", server.url)
        assert code == 1
        assert _code(report) == "denied"
        assert (
            "refuses the token in SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"
            in (_check(report, "bootstrap", "auth")["detail"])
        )
        assert "wrong" not in json.dumps(report)
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "s3cret")
        code, report = doctor("--url", server.url)
        assert code == 0
        assert _check(report, "bootstrap", "auth")["status"] == "pass"
        assert server.registered_count == 1  # the doctor's PUTs registered nothing


def test_wrong_port_with_the_host_up(doctor: Doctor, server: BootstrapServer, ports: Ports) -> None:
    up = server.url.rsplit(":", 1)[1]
    code, report = doctor("--url", f"http://127.0.0.1:{ports.refusing()}", "--http-port", up)
    assert code == 1
    assert _code(report) == "refused-host-up"
    assert _check(report, "bootstrap", "rows")["status"] == "skip"


def test_none_as_the_port(doctor: Doctor) -> None:
    code, report = doctor("--url", "http://127.0.0.1:None")
    assert code == 1
    assert _code(report) == "port-missing"


def test_the_http_port_given_as_the_bootstrap_port(doctor: Doctor) -> None:
    with HostileServer(NOT_FOUND_JSON) as http_server:
        code, report = doctor("--url", http_server.url, "--http-port", str(http_server.port))
    assert code == 1
    assert _code(report) == "http-port"


def test_an_html_server(doctor: Doctor) -> None:
    with HostileServer(HTML) as page:
        code, report = doctor("--url", page.url)
    assert code == 1
    assert _code(report) == "not-bootstrap"


def test_an_unresolvable_name(doctor: Doctor) -> None:
    code, report = doctor("--url", "http://bootstrap.invalid:8998")
    assert code == 1
    assert _code(report) == "unresolved"
    assert _check(report, "bootstrap", "listens")["status"] == "skip"


def test_tls_on_one_side_only(
    doctor: Doctor, tls_server: BootstrapServer, server: BootstrapServer
) -> None:
    code, report = doctor("--url", tls_server.url.replace("https://", "http://"))
    assert (code, _code(report)) == (1, "tls-on-plain")
    code, report = doctor("--url", server.url.replace("http://", "https://"))
    assert (code, _code(report)) == (1, "plain-on-tls")
    code, report = doctor("--url", tls_server.url)  # TLS on both sides: it speaks the protocol
    assert _check(report, "bootstrap", "protocol")["status"] == "pass"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    gw = Gateway(tmp_path / "gw").start()
    try:
        yield gw
    finally:
        gw.kill()


@pytest.fixture
def worker() -> Iterator[StandInWorker]:
    made = StandInWorker("decode").start()
    try:
        yield made
    finally:
        made.close()


def _add(gateway: Gateway, url: str) -> None:
    added = requests.post(
        f"{gateway.url}/workers", json={"url": url, "worker_type": "decode"}, timeout=5
    )
    assert added.status_code == 202, added.text


def _listed(gateway: Gateway, healthy: bool, count: int) -> bool:
    body = requests.get(f"{gateway.url}/workers", timeout=5).json()
    found = [w for w in body["workers"] if w.get("is_healthy") is healthy]
    return len(found) == count


def test_a_gateway_listing_each_worker_once_and_healthy(
    doctor: Doctor, gateway: Gateway, worker: StandInWorker
) -> None:
    _add(gateway, worker.url)
    assert wait_until(lambda: _listed(gateway, True, 1), timeout=30)
    code, report = doctor("--gateway", gateway.url)
    assert code == 0, report
    assert _check(report, "gateway", "workers")["data"]["workers"] == 1


def test_a_gateway_listing_a_worker_twice_or_unhealthy(
    doctor: Doctor, gateway: Gateway, worker: StandInWorker
) -> None:
    _add(gateway, worker.url)
    _add(gateway, worker.url + "/")  # the same worker: smg lists both
    assert wait_until(lambda: _listed(gateway, True, 2), timeout=30)
    code, report = doctor("--gateway", gateway.url)
    assert code == 1
    workers = _check(report, "gateway", "workers")
    assert workers["data"]["duplicates"] == [worker.url]
    worker.healthy = False
    assert wait_until(lambda: _listed(gateway, False, 2), timeout=30)
    code, report = doctor("--gateway", gateway.url)
    assert code == 1
    assert "unhealthy" in _check(report, "gateway", "workers")["detail"]


def test_a_gateway_with_a_key(
    doctor: Doctor, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway = Gateway(tmp_path / "gw", keys=("s3cret-key",)).start()
    key_file = tmp_path / "key"
    key_file.write_text("s3cret-key\n")
    try:
        code, report = doctor("--gateway", gateway.url)
        assert (code, _code(report)) == (1, "denied")
        code, report = doctor("--gateway", gateway.url, "--gateway-key-file", str(key_file))
        assert code == 0, report
    finally:
        gateway.kill()
    assert "s3cret-key" not in json.dumps(report)


def test_a_gateway_given_as_the_bootstrap_url(doctor: Doctor, gateway: Gateway) -> None:
    code, report = doctor("--url", gateway.url)
    assert (code, _code(report)) == (1, "gateway")


def test_a_bootstrap_server_given_as_the_gateway(doctor: Doctor, server: BootstrapServer) -> None:
    code, report = doctor("--gateway", server.url)
    assert (code, _code(report)) == (1, "not-gateway")


def test_etcd_endpoints(doctor: Doctor, tmp_path: Path, server: BootstrapServer) -> None:
    with etcd_cluster(tmp_path) as etcd:
        code, report = doctor("--etcd", etcd.url)
        assert code == 0, report
        assert "etcdserver" in _check(report, "etcd", "protocol")["detail"]
        code, report = doctor("--etcd", f"{etcd.url},{server.url}")
    assert code == 1
    assert _code(report) == "not-etcd"


def test_everything_at_once_is_healthy_only_when_each_part_is(
    doctor: Doctor, server: BootstrapServer, gateway: Gateway, ports: Ports
) -> None:
    _put(server)
    code, report = doctor("--url", server.url, "--gateway", gateway.url)
    assert code == 0, report
    code, report = doctor("--url", server.url, "--gateway", f"http://127.0.0.1:{ports.refusing()}")
    assert code == 1
    assert {c["target"] for c in report["checks"] if c["status"] == "fail"} == {"gateway"}


def test_the_human_report(capsys: pytest.CaptureFixture[str], ports: Ports) -> None:
    code = main(["doctor", "--url", f"http://127.0.0.1:{ports.refusing()}"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[FAIL] listens: nothing listens on 127.0.0.1:" in out
    assert "[diagnosis refused]" in out
    assert out.rstrip().endswith("not healthy: 1 check(s) failed")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((), "nothing to check: give --url, --gateway, --etcd or --sglang"),
        (("--gateway", "ftp://x"), "--gateway 'ftp://x' must start with http:// or https://"),
    ],
)
def test_bad_input_is_a_usage_error(
    capsys: pytest.CaptureFixture[str], args: tuple[str, ...], words: str
) -> None:
    assert main(["doctor", *args]) == 2
    assert words in capsys.readouterr().err


def test_the_hint_of_the_404_is_one_of_the_diagnoses(doctor: Doctor) -> None:
    with HostileServer(answer(404, "not here")) as other:
        code, report = doctor("--url", other.url)
    assert code == 1
    failed = _check(report, "bootstrap", "protocol")
    assert "this server does not take registrations there" in failed["detail"]


def test_sglang_absent_is_named_and_fails(doctor: Doctor) -> None:
    # This suite's environment has no SGLang (tests/sglang_real checks the one that has it).
    code, report = doctor("--sglang")
    assert code == 1
    assert report["healthy"] is False
    release = _check(report, "sglang", "release")
    assert release["status"] == "fail"
    assert "not installed" in release["detail"]
    assert _check(report, "sglang", "plugin")["status"] == "skip"


def test_sglang_joins_the_other_checks(doctor: Doctor, server: BootstrapServer) -> None:
    code, report = doctor("--url", server.url, "--sglang")
    assert code == 1
    assert [c["target"] for c in report["checks"]][-2:] == ["sglang", "sglang"]
    assert _check(report, "bootstrap", "protocol")["status"] == "pass"
