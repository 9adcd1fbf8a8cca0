"""Each misconfiguration staged for real on 127.0.0.1, against real servers (the reference
bootstrap server, plain HTTP servers that are not bootstrap servers, the real smg gateway, TLS
on one side only), seen through a running registrar: its own diagnosis in the log, the status
and the health document, within a small threshold; a server that is merely late gets none."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hostile_server import Conn, HostileServer, Request, answer
from smg_support import Gateway
from support import Ports, sglang_payload, wait_until
from test_cli import run

from registrar import Backoff, Registrar, State
from registrar.core._diagnosis import Code
from registrar.core._errors import ConfigError
from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.surfaces.cli import main
from registrar.surfaces.health import render_health, start_health_server
from registrar.surfaces.metrics import RegistrarMetrics

FAST = Backoff(initial=0.05, multiplier=2.0, maximum=0.2, jitter=0.25)
AFTER = 0.3
"""The threshold here: small, so the test runs quickly (nothing asserts how long it took)."""
_PAGE = [("Content-Type", "text/html")]
_WELCOME = answer(200, "<!doctype html><html><body>It works</body></html>", _PAGE)
_NOT_ALLOWED = answer(405, "<html><body>405 Not Allowed</body></html>", _PAGE)


def HTML(conn: Conn, request: Request) -> bool:
    """A web server's welcome page on GET, and its HTML 405 on anything else (as nginx)."""
    return (_WELCOME if request.method == "GET" else _NOT_ALLOWED)(conn, request)


NOT_FOUND_JSON = answer(404, '{"detail":"Not Found"}', [("Content-Type", "application/json")])


@pytest.fixture
def staged(registrars: list[Registrar]) -> Callable[..., Registrar]:
    def start(url: str, **payload: Any) -> Registrar:
        reg = Registrar(
            url,
            sglang_payload(**payload),
            backoff=FAST,
            max_attempts=None,
            diagnose_after=AFTER,
            timeout=2.0,
        )
        registrars.append(reg)
        return reg.start()

    return start


def _diagnosed(reg: Registrar, code: Code, caplog: pytest.LogCaptureFixture) -> str:
    """Wait for the diagnosis; check it in the status, the log (once) and the health
    document; the sentence."""
    assert wait_until(lambda: reg.status().diagnosis is not None, timeout=30)
    diagnosis = reg.status().diagnosis
    assert diagnosis is not None
    assert diagnosis.code == code, diagnosis
    assert reg.status().retrying  # words, not behaviour: attempts go on
    assert wait_until(lambda: any(f"[diagnosis {code}]" in r.getMessage() for r in caplog.records))
    stated = [r for r in caplog.records if f"[diagnosis {code}]" in r.getMessage()]
    assert len(stated) == 1
    assert stated[0].levelno == logging.WARNING
    status, document = render_health(reg.status(), probe="readyz")
    assert status == 503
    assert diagnosis.sentence in document["output"]
    entry = document["checks"]["registration:state"][0]
    assert entry["diagnosis"] == {"code": str(code), "sentence": diagnosis.sentence}
    return diagnosis.sentence


@pytest.fixture(autouse=True)
def _warnings(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="registrar")


def test_wrong_port_with_the_host_up(
    staged: Any, server: BootstrapServer, ports: Ports, caplog: pytest.LogCaptureFixture
) -> None:
    # The rank's HTTP port (here the reference server's) answers; the bootstrap port does not.
    up = int(server.url.rsplit(":", 1)[1])
    wrong = ports.refusing()
    reg = staged(f"http://127.0.0.1:{wrong}", prefill_http_port=up)
    sentence = _diagnosed(reg, Code.REFUSED_HOST_UP, caplog)
    assert f"nothing listens on 127.0.0.1:{wrong}; 127.0.0.1:{up}" in sentence
    assert "answers HTTP" in sentence


def test_the_http_port_given_as_the_bootstrap_port(
    staged: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # SGLang's HTTP server answers PUT and GET /route with FastAPI's JSON 404.
    with HostileServer(NOT_FOUND_JSON) as http_server:
        reg = staged(http_server.url, prefill_http_port=http_server.port)
        sentence = _diagnosed(reg, Code.HTTP_PORT, caplog)
    assert "the rank's own HTTP port" in sentence
    assert "answered 404 application/json" in sentence


def test_an_html_server_on_the_port(staged: Any, caplog: pytest.LogCaptureFixture) -> None:
    with HostileServer(HTML) as page:
        reg = staged(page.url)
        sentence = _diagnosed(reg, Code.NOT_BOOTSTRAP, caplog)
    assert "answers with an HTML page" in sentence


def test_an_unrelated_json_server_keeps_the_old_404_hint(
    staged: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with HostileServer(NOT_FOUND_JSON) as other:
        reg = staged(other.url)
        sentence = _diagnosed(reg, Code.NOT_BOOTSTRAP, caplog)
        assert reg.status().state is State.FAILED  # the 404 is fatal; on_failure=retry goes on
    assert "check the bootstrap URL: this server does not take registrations there" in sentence


def test_a_gateway_on_the_port(
    staged: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = Gateway(tmp_path / "gw").start()
    try:
        reg = staged(gateway.url)
        sentence = _diagnosed(reg, Code.GATEWAY, caplog)
    finally:
        gateway.kill()
    assert "GET /workers lists workers" in sentence


def test_an_unresolvable_name(staged: Any, caplog: pytest.LogCaptureFixture) -> None:
    reg = staged("http://bootstrap.invalid:8998")  # RFC 6761: never resolves
    sentence = _diagnosed(reg, Code.UNRESOLVED, caplog)
    assert "the name bootstrap.invalid does not resolve" in sentence


def test_a_plain_url_against_a_tls_server(
    staged: Any, tls_server: BootstrapServer, caplog: pytest.LogCaptureFixture
) -> None:
    reg = staged(tls_server.url.replace("https://", "http://"))
    sentence = _diagnosed(reg, Code.TLS_ON_PLAIN, caplog)
    assert "speaks TLS but the bootstrap URL says http://" in sentence


def test_a_tls_url_against_a_plain_server(
    staged: Any, server: BootstrapServer, caplog: pytest.LogCaptureFixture
) -> None:
    reg = staged(server.url.replace("http://", "https://"))
    sentence = _diagnosed(reg, Code.PLAIN_ON_TLS, caplog)
    assert "answers plain HTTP but the bootstrap URL says https://" in sentence


def test_none_as_the_port_is_refused_at_construction_with_its_diagnosis() -> None:
    expected = r"no usable port \(':None'\).*\[diagnosis port-missing\]"
    with pytest.raises(ConfigError, match=expected):
        Registrar("http://127.0.0.1:None", sglang_payload())


def test_a_late_server_gets_no_diagnosis(registrars: list[Registrar], ports: Ports) -> None:
    sock = ports.reserve()
    port = sock.getsockname()[1]
    reg = Registrar(
        f"http://127.0.0.1:{port}",
        sglang_payload(),
        backoff=FAST,
        max_attempts=None,
        diagnose_after=60.0,  # far longer than this server is late
    )
    registrars.append(reg)
    reg.start()
    assert wait_until(lambda: reg.status().attempts_total + reg.status().reregistrations > 0)
    with BootstrapServer(sock=sock) as late:
        assert reg.wait_for(State.REGISTERED, timeout=30)
        assert late.url.endswith(f":{port}")
        assert reg.status().diagnosis is None


def test_the_diagnosis_clears_once_the_bootstrap_server_answers(
    staged: Any, ports: Ports, caplog: pytest.LogCaptureFixture
) -> None:
    sock = ports.reserve()
    reg = staged(f"http://127.0.0.1:{sock.getsockname()[1]}")
    _diagnosed(reg, Code.REFUSED, caplog)
    with BootstrapServer(sock=sock):
        assert reg.wait_for(State.REGISTERED, timeout=30)
        assert wait_until(lambda: reg.status().diagnosis is None)
    assert any("diagnosis refused cleared" in r.getMessage() for r in caplog.records)


def test_the_metrics_carry_the_diagnosis_as_a_labelled_gauge(
    staged: Any, ports: Ports, caplog: pytest.LogCaptureFixture
) -> None:
    reg = staged(f"http://127.0.0.1:{ports.refusing()}")
    metrics = RegistrarMetrics().attach(reg)
    _diagnosed(reg, Code.REFUSED, caplog)
    value = metrics.registry.get_sample_value
    assert value("registrar_diagnosis", {"code": "refused"}) == 1.0
    assert value("registrar_diagnosis", {"code": "refused-host-up"}) == 0.0


def test_giving_up_with_on_failure_exit_states_the_diagnosis_before_the_process_ends(
    server: BootstrapServer, ports: Ports
) -> None:
    up = int(server.url.rsplit(":", 1)[1])
    wrong = ports.refusing()
    result = run(
        "register",
        "--url",
        f"http://127.0.0.1:{wrong}",
        "--payload",
        json.dumps(sglang_payload(prefill_http_port=up)),
        "--max-attempts",
        "2",
        "--on-failure",
        "exit",
    )
    assert result.returncode == 3
    assert f"nothing listens on 127.0.0.1:{wrong}; 127.0.0.1:{up}" in result.stderr
    assert "[diagnosis refused-host-up]" in result.stderr


def test_registrar_status_reads_the_diagnosis_from_the_health_server(
    staged: Any, ports: Ports, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    reg = staged(f"http://127.0.0.1:{ports.refusing()}")
    sentence = _diagnosed(reg, Code.REFUSED, caplog)
    health = start_health_server(reg, metrics=False)
    try:
        assert main(["status", "--health-url", health.url]) == 1
    finally:
        health.stop()
    assert f"diagnosis:    refused: {sentence}" in capsys.readouterr().out
