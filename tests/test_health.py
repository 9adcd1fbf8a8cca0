"""Health responses for every state through a real HTTP client, the WSGI app under a real WSGI
server, and metrics read from the registry."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIServer, make_server

import pytest
import requests
from bootstrap_lab import BootstrapLab
from prometheus_client import CollectorRegistry
from support import FakeClock, ScriptedTransport, accepted, fatal, retry, sglang_payload, wait_until

import registrar
from registrar import Backoff, Registrar, State, Status
from registrar.surfaces.health import health_app, render_health, start_health_server
from registrar.surfaces.metrics import RegistrarMetrics

PAYLOAD = {"service": "demo", "secret_field": "do-not-show"}


def scripted(
    registrars: list, outcomes: list, clock: FakeClock | None = None, **kwargs: object
) -> Registrar:
    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=ScriptedTransport(outcomes),
        clock=clock or FakeClock(),
        watch_interval=None,
        **kwargs,
    )  # type: ignore[arg-type]
    registrars.append(reg)
    return reg


def get(url: str) -> requests.Response:
    return requests.get(url, timeout=5)


@pytest.mark.parametrize(
    ("state", "verdict", "code"),
    [
        (State.REGISTERED, "pass", 200),
        (State.UNREGISTERED, "fail", 503),
        (State.REGISTERING, "fail", 503),
        (State.FAILED, "fail", 503),
        (State.STOPPED, "fail", 503),
    ],
)
def test_render_every_state(state: State, verdict: str, code: int) -> None:
    status = Status(
        state=state, since=0.0, url="http://127.0.0.1:1", last_error="boom", attempts_total=3
    )
    got_code, document = render_health(status)
    assert (got_code, document["status"]) == (code, verdict)
    check = document["checks"]["registration:state"][0]
    assert check["observedValue"] == state.value
    assert check["observedUnit"] == "state"
    assert check["attemptsTotal"] == 3
    assert ("output" in check) is (verdict != "pass")
    assert ("output" in document) is (verdict != "pass")
    # The levels agree: the top is the worst of the checks shown.
    shown = [entry[0]["status"] for entry in document["checks"].values()]
    assert document["status"] == max(shown, key=["pass", "warn", "fail"].index)


def endpoints(url: str) -> dict[str, int]:
    return {path: get(f"{url}{path}").status_code for path in ("/health", "/readyz", "/livez")}


def test_each_state_over_http(registrars: list) -> None:
    # unregistered
    reg = scripted(registrars, [accepted()])
    with start_health_server(reg, metrics=False) as health:
        assert endpoints(health.url) == {"/health": 503, "/readyz": 503, "/livez": 200}
        answer = get(f"{health.url}/health")
        assert answer.headers["Content-Type"] == "application/health+json"
        assert answer.headers["Cache-Control"] == "no-store"
        assert answer.json()["status"] == "fail"  # not ready is fail
        # registered
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=5)
        assert endpoints(health.url) == {"/health": 200, "/readyz": 200, "/livez": 200}
        assert get(f"{health.url}/health").json()["status"] == "pass"
        # stopped
        reg.stop()
        assert endpoints(health.url) == {"/health": 503, "/readyz": 503, "/livez": 200}


def test_registering_and_failed_states_over_http(registrars: list) -> None:
    clock = FakeClock(horizon=0.1)  # parks in the first backoff wait: REGISTERING
    registering = scripted(registrars, [retry()], clock=clock).start()
    given_up = scripted(registrars, [fatal()], on_failure="stop").start()
    retrying = scripted(registrars, [retry()], clock=FakeClock(horizon=20), max_attempts=1)
    retrying.start()
    assert wait_until(lambda: registering.status().next_attempt_at is not None)
    assert clock.waits == []
    assert given_up.wait_for(State.FAILED, timeout=5)
    assert retrying.wait_for(State.FAILED, timeout=5)
    assert wait_until(lambda: retrying.status().next_attempt_at is not None)
    with (
        start_health_server(registering, metrics=False) as a,
        start_health_server(given_up, metrics=False) as b,
        start_health_server(retrying, metrics=False) as c,
    ):
        assert endpoints(a.url) == {"/health": 503, "/readyz": 503, "/livez": 200}
        check = get(f"{a.url}/health").json()["checks"]["registration:state"][0]
        assert check["nextAttemptAt"]
        # Given up for good: liveness fails, and says why.
        assert endpoints(b.url) == {"/health": 503, "/readyz": 503, "/livez": 503}
        assert "auth token" in get(f"{b.url}/livez").json()["output"]
        # Failed but still trying in the background: alive.
        assert endpoints(c.url) == {"/health": 503, "/readyz": 503, "/livez": 200}


def test_dead_thread_fails_liveness(registrars: list) -> None:
    # A transport that raises no longer ends the thread (the loop classifies it); a bug in the
    # loop's own machinery, here its clock, still does.
    class BrokenClock(FakeClock):
        def wait(self, event: object, timeout: float | None) -> bool:  # type: ignore[override]
            raise RuntimeError("clock bug")

    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=ScriptedTransport([retry()]),
        clock=BrokenClock(),
        watch_interval=None,
    )
    registrars.append(reg)
    reg.start()
    assert wait_until(lambda: reg.thread_died)
    with start_health_server(reg, metrics=False) as health:
        answer = get(f"{health.url}/livez")
        assert answer.status_code == 503
        # The levels agree: a failing /livez has a failing check, and says why at the top.
        document = answer.json()
        assert document["status"] == "fail"
        assert document["checks"]["registrar:thread"][0]["status"] == "fail"
        assert document["checks"]["registrar:thread"][0]["observedValue"] is False
        assert "clock bug" in document["output"]


def test_bootstrap_outage_never_fails_liveness(server: BootstrapLab, registrars: list) -> None:
    reg = Registrar(
        server.url, sglang_payload(), watch_interval=0.1, backoff=Backoff(initial=0.1, maximum=0.5)
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    with start_health_server(reg, metrics=False) as health:
        server.stop()
        assert wait_until(lambda: reg.status().server_reachable is False)
        assert get(f"{health.url}/livez").status_code == 200
        # Registered, the server unreachable at the last check: ready, with the reason (warn).
        ready = get(f"{health.url}/readyz")
        assert ready.status_code == 200
        assert ready.json()["status"] == "warn"
        assert "did not answer" in ready.json()["output"]
        reachable = ready.json()["checks"]["bootstrap:reachable"][0]
        assert (reachable["observedValue"], reachable["status"]) == (False, "warn")
        server.forget()
        server.start()
        assert wait_until(lambda: reg.status().registrations == 2)
        assert get(f"{health.url}/readyz").status_code == 200


def test_payload_hidden_by_default_and_other_requests(registrars: list) -> None:
    reg = scripted(registrars, [accepted()])
    with (
        start_health_server(reg, metrics=False) as hidden,
        start_health_server(reg, metrics=False, expose_payload=True) as shown,
    ):
        assert "do-not-show" not in get(f"{hidden.url}/health").text
        assert get(f"{shown.url}/health").json()["payload"] == PAYLOAD
        # Unknown paths and methods are not health documents.
        missing = get(f"{hidden.url}/nope")
        assert missing.status_code == 404
        assert missing.headers["Content-Type"].startswith("text/plain")
        refused = requests.post(f"{hidden.url}/health", timeout=5)
        assert refused.status_code == 405
        assert refused.headers["Content-Type"].startswith("text/plain")
        assert refused.headers["Allow"] == "GET, HEAD"
        head = requests.head(f"{hidden.url}/readyz", timeout=5)
        assert head.status_code == 503
        assert head.content == b""
        assert get(f"{hidden.url}/metrics").status_code == 404


@pytest.fixture
def wsgi_server(registrars: list) -> Iterator[tuple[Registrar, str]]:
    reg = scripted(registrars, [accepted()])
    server: WSGIServer = make_server("127.0.0.1", 0, health_app(reg))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    try:
        yield reg, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_wsgi_app_under_a_real_wsgi_server(wsgi_server: tuple[Registrar, str]) -> None:
    reg, url = wsgi_server
    assert get(f"{url}/readyz").status_code == 503
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    answer = get(f"{url}/readyz")
    assert answer.status_code == 200
    assert answer.json()["status"] == "pass"


def test_metrics_values(server: BootstrapLab, registrars: list) -> None:
    registry = CollectorRegistry()
    server.fail_next(2, 503, method="PUT")
    reg = Registrar(
        server.url, sglang_payload(), watch_interval=0.1, backoff=Backoff(initial=0.05, maximum=0.2)
    )
    registrars.append(reg)
    RegistrarMetrics(registry).attach(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    server.restart()
    assert wait_until(lambda: reg.status().registrations == 2)
    value = registry.get_sample_value
    assert value("registrar_attempts_total", {"result": "retry"}) == 2
    assert value("registrar_attempts_total", {"result": "accepted"}) == 2
    assert value("registrar_reregistrations_total") == 1
    assert value("registrar_state", {"registrar_state": "registered"}) == 1
    assert value("registrar_state", {"registrar_state": "failed"}) == 0
    assert value("registrar_last_success_timestamp_seconds") == pytest.approx(
        reg.status().last_success_at
    )
    assert value("registrar_request_duration_seconds_count", {"kind": "register"}) == 4
    # The look before the first registration, and the check after the restart.
    assert value("registrar_checks_total", {"result": "missing"}) == 2
    assert value("registrar_server_reachable") == 1
    assert value("registrar_next_attempt_timestamp_seconds") == 0  # none scheduled
    assert value("registrar_build_info", {"version": registrar.__version__}) == 1


def test_health_server_serves_metrics_when_installed(registrars: list) -> None:
    reg = scripted(registrars, [accepted()])
    with start_health_server(reg) as health:
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=5)
        text = get(f"{health.url}/metrics").text
    assert 'registrar_attempts_total{result="accepted"} 1.0' in text


def test_core_never_imports_prometheus() -> None:
    code = (
        "import sys, registrar, registrar.surfaces.health; "
        "assert 'prometheus_client' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_metrics_true_serves_metrics_and_false_does_not(registrars: list) -> None:
    reg = scripted(registrars, [accepted()])
    with (
        start_health_server(reg, metrics=True) as on,
        start_health_server(reg, metrics=False) as off,
    ):
        assert "registrar_state" in get(f"{on.url}/metrics").text
        assert get(f"{off.url}/metrics").status_code == 404


def test_head_metrics_announces_the_length_of_the_get_body(registrars: list) -> None:
    """HEAD answers the headers GET would: a Content-Length of the body it leaves out."""
    reg = scripted(registrars, [accepted()])
    metrics = RegistrarMetrics(CollectorRegistry()).attach(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    with start_health_server(reg, metrics=metrics) as health:
        # Uncompressed both times (a client asking for gzip gets a gzip length).
        plain = {"Accept-Encoding": "identity"}
        body = requests.get(f"{health.url}/metrics", headers=plain, timeout=5).content
        head = requests.head(f"{health.url}/metrics", headers=plain, timeout=5)
    assert body
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["Content-Length"]) == len(body)
