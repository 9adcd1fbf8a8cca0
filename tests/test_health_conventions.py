"""Health as its users' conventions say: the health+json draft's field meanings, Kubernetes'
per-check paths, ?verbose and ?exclude=, the ASGI app under a real ASGI server (uvicorn) and
mounted into FastAPI, and /metrics through prometheus-client's own exposition."""

from __future__ import annotations

import asyncio
import gc
import gzip
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

import pytest
import requests
import uvicorn
from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from support import FakeClock, ScriptedTransport, accepted, retry, sglang_payload, wait_until

import registrar
from registrar import ConfigError, Registrar, State, Status
from registrar.surfaces.health import (
    HEALTH_CONTENT_TYPE,
    health_app,
    health_asgi_app,
    render_health,
    start_health_server,
)
from registrar.surfaces.metrics import RegistrarMetrics

PAYLOAD = sglang_payload(ip="10.0.0.5", port=20000)


class Registered:
    """A health source that is registered, with nothing behind it."""

    thread_died = False
    payload: ClassVar[dict[str, Any]] = {}

    def status(self) -> Status:
        return Status(state=State.REGISTERED, since=0.0, url="u")


def make(registrars: list, outcomes: list, **kwargs: Any) -> Registrar:
    reg = Registrar(
        "http://127.0.0.1:8998",
        PAYLOAD,
        transport=ScriptedTransport(outcomes),
        clock=kwargs.pop("clock", FakeClock()),
        watch_interval=None,
        **kwargs,
    )
    registrars.append(reg)
    return reg


def get(url: str, **kwargs: Any) -> requests.Response:
    return requests.get(url, timeout=5, **kwargs)


@contextmanager
def uvicorn_server(app: Any) -> Iterator[str]:
    """A real uvicorn on an ephemeral 127.0.0.1 port, in a thread; stopped on exit."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", ws="none", http="h11"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive()


def test_every_check_has_a_value_with_its_unit_and_the_time_of_its_reading() -> None:
    status = Status(
        state=State.REGISTERED,
        since=1_000.0,
        url="http://127.0.0.1:8998",
        server_reachable=True,
        last_request_at=2_000.0,
        last_check_at=2_000.0,
        route="present",
    )
    code, document = render_health(status, now=3_000.0)
    assert (code, document["status"]) == (200, "pass")
    for key, (entry,) in document["checks"].items():
        assert "observedUnit" in entry, key
        assert "observedValue" in entry, key
    checks = document["checks"]
    # The state was read now; it began at `since`.
    assert checks["registration:state"][0]["time"] == "1970-01-01T00:50:00.000Z"
    assert checks["registration:state"][0]["since"] == "1970-01-01T00:16:40.000Z"
    # Reachability and the route were read by the last request.
    assert checks["bootstrap:reachable"][0]["time"] == "1970-01-01T00:33:20.000Z"
    assert checks["route:check"][0]["time"] == "1970-01-01T00:33:20.000Z"
    # No reading yet: no time for it.
    fresh = Status(state=State.REGISTERING, since=1_000.0, url="http://127.0.0.1:8998")
    _, document = render_health(fresh, now=3_000.0)
    assert "time" not in document["checks"]["bootstrap:reachable"][0]
    assert "time" not in document["checks"]["route:check"][0]
    assert document["checks"]["registration:state"][0]["time"] == "1970-01-01T00:50:00.000Z"


def test_service_id_names_the_rank_or_what_the_caller_says() -> None:
    status = Status(state=State.REGISTERED, since=0.0, url="http://127.0.0.1:8998")
    assert render_health(status, payload=PAYLOAD)[1]["serviceId"] == "10.0.0.5:20000"
    assert render_health(status, service_id="prefill-0")[1]["serviceId"] == "prefill-0"
    v6 = {**PAYLOAD, "rank_ip": "::1"}
    assert render_health(status, payload=v6)[1]["serviceId"] == "[::1]:20000"


def test_a_route_conflict_is_ready_with_the_reason() -> None:
    status = Status(state=State.REGISTERED, since=0.0, url="u", route="conflict")
    code, document = render_health(status, probe="readyz")
    assert (code, document["status"]) == (200, "warn")
    assert "another registration" in document["output"]


def test_kubernetes_paths_verbose_and_exclude(registrars: list) -> None:
    reg = make(registrars, [retry()], clock=FakeClock(horizon=0.1)).start()
    with start_health_server(reg, metrics=False) as health:
        assert reg.wait_for(State.REGISTERING, timeout=5)
        # One path per check.
        assert get(f"{health.url}/readyz/registration").status_code == 503
        assert get(f"{health.url}/livez/thread").status_code == 200
        only = get(f"{health.url}/readyz/registration").json()
        assert list(only["checks"]) == ["registration:state"]
        assert get(f"{health.url}/readyz/thread").status_code == 404  # a liveness check
        assert get(f"{health.url}/readyz/nope").status_code == 404
        # ?verbose: Kubernetes' plain text.
        text = get(f"{health.url}/readyz?verbose")
        assert text.status_code == 503
        assert text.headers["Content-Type"].startswith("text/plain")
        lines = text.text.splitlines()
        assert lines[0].startswith("[-]registration failed: ")
        assert lines[-1] == "readyz check failed"
        assert get(f"{health.url}/livez?verbose").text.splitlines() == [
            "[+]thread ok",
            "[+]retrying ok",
            "livez check passed",
        ]
        # ?exclude= leaves a check out of the verdict, and says so.
        excluded = get(f"{health.url}/readyz?verbose&exclude=registration&exclude=nope")
        assert excluded.status_code == 200
        assert "[+]registration excluded: ok" in excluded.text
        assert "no matches for 'nope'" in excluded.text
        document = get(f"{health.url}/readyz?exclude=registration").json()
        assert "registration:state" not in document["checks"]
        assert document["status"] != "fail"


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    """A document without the reading times (taken per request)."""
    for (entry,) in document.get("checks", {}).values():
        entry.pop("time", None)
    return document


def test_asgi_app_under_uvicorn_answers_as_the_wsgi_app(registrars: list) -> None:
    reg = make(registrars, [accepted()])
    metrics = RegistrarMetrics().attach(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    with (
        uvicorn_server(health_asgi_app(reg, metrics=metrics)) as asgi,
        start_health_server(reg, metrics=metrics) as wsgi,
    ):
        for path in ("/health", "/readyz", "/livez", "/readyz/route", "/livez?verbose", "/nope"):
            a, w = get(asgi + path), get(wsgi.url + path)
            assert (a.status_code, a.headers["Content-Type"]) == (
                w.status_code,
                w.headers["Content-Type"],
            ), path
            if a.headers["Content-Type"] == HEALTH_CONTENT_TYPE:
                assert comparable(a.json()) == comparable(w.json()), path
            else:
                assert a.text == w.text, path
        assert requests.post(f"{asgi}/readyz", timeout=5).status_code == 405
        head = requests.head(f"{asgi}/readyz", timeout=5)
        assert (head.status_code, head.content) == (200, b"")
        # /metrics by prometheus-client's exposition: OpenMetrics on request, gzip.
        plain = get(f"{asgi}/metrics")
        assert plain.headers["Content-Type"].startswith("text/plain")
        assert 'registrar_attempts_total{result="accepted"} 1.0' in plain.text
        om = get(f"{asgi}/metrics", headers={"Accept": "application/openmetrics-text"})
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")
        raw = requests.get(
            f"{asgi}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=5, stream=True
        )
        assert raw.headers["Content-Encoding"] == "gzip"
        assert b"registrar_state" in gzip.decompress(raw.raw.read())
        head = requests.head(f"{asgi}/metrics", timeout=5)
        assert (head.status_code, head.content) == (200, b"")
        # HEAD announces the length of the body GET sends.
        plain_only = {"Accept-Encoding": "identity"}
        head = requests.head(f"{asgi}/metrics", headers=plain_only, timeout=5)
        body = get(f"{asgi}/metrics", headers=plain_only).content
        assert int(head.headers["Content-Length"]) == len(body) > 0
        # The same through the WSGI app.
        om = get(f"{wsgi.url}/metrics", headers={"Accept": "application/openmetrics-text"})
        assert om.headers["Content-Type"].startswith("application/openmetrics-text")
        assert requests.head(f"{wsgi.url}/metrics", timeout=5).content == b""


def test_mounted_into_fastapi(registrars: list) -> None:
    reg = make(registrars, [accepted()])
    app = FastAPI()

    @app.get("/generate")
    async def generate() -> dict[str, str]:
        # An async handler may wait for registration without blocking the loop.
        ok = await reg.wait_for_async(State.REGISTERED, timeout=5)
        return {"registered": str(ok)}

    app.mount("/registrar", health_asgi_app(reg))
    with uvicorn_server(app) as url:
        assert get(f"{url}/registrar/readyz").status_code == 503
        reg.start()
        assert get(f"{url}/generate").json() == {"registered": "True"}
        ready = get(f"{url}/registrar/readyz")
        assert (ready.status_code, ready.json()["status"]) == (200, "pass")
        assert get(f"{url}/registrar/readyz/registration").status_code == 200
        assert get(f"{url}/registrar/livez?verbose").text.endswith("livez check passed\n")
        assert get(f"{url}/registrar/nope").status_code == 404
        assert get(f"{url}/registrar/metrics").status_code == 404  # none given


def test_asgi_lifespan_alone() -> None:
    app = health_asgi_app(Registered())
    sent: list[dict[str, Any]] = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive() -> dict[str, Any]:
        return next(messages)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(app({"type": "lifespan"}, receive, send))
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_several_registrars_on_one_registry(registrars: list) -> None:
    registry = CollectorRegistry()
    ranks = []
    for rank in range(2):
        reg = make(registrars, [accepted()])
        RegistrarMetrics(registry, labels={"rank": str(rank), "role": "prefill"}).attach(reg)
        ranks.append(reg)
    ranks[0].start()
    assert ranks[0].wait_for(State.REGISTERED, timeout=5)
    value = registry.get_sample_value
    zero = {"rank": "0", "role": "prefill"}
    one = {"rank": "1", "role": "prefill"}
    assert value("registrar_attempts_total", {**zero, "result": "accepted"}) == 1
    assert value("registrar_attempts_total", {**one, "result": "accepted"}) == 0
    assert value("registrar_state", {**zero, "registrar_state": "registered"}) == 1
    assert value("registrar_state", {**one, "registrar_state": "unregistered"}) == 1
    assert value("registrar_server_reachable", zero) == 1
    assert value("registrar_server_reachable", one) == 0
    assert value("registrar_build_info", {"version": registrar_version()}) == 1
    # The same labels twice would mix two ranks' series: refused, naming the fix.
    with pytest.raises(ConfigError, match="distinct labels"):
        RegistrarMetrics(registry, labels={"rank": "0", "role": "prefill"})
    with pytest.raises(ConfigError, match="must use the labels"):
        RegistrarMetrics(registry, labels={"rank": "2"})
    with pytest.raises(ConfigError, match="used by registrar"):
        RegistrarMetrics(CollectorRegistry(), labels={"result": "x"})
    # A registrar that is gone frees its labels (SGLang's role switch registers again).
    registrars.remove(ranks[1])
    ranks.pop()
    del reg
    gc.collect()
    again = make(registrars, [retry()], clock=FakeClock(horizon=0.1))
    RegistrarMetrics(registry, labels={"rank": "1", "role": "prefill"}).attach(again)
    again.start()
    assert again.wait_for(State.REGISTERING, timeout=5)

    def gauge_is_the_status() -> bool:
        # Retries go on meanwhile: an attempt landing between the two reads is no disagreement.
        due = again.status().next_attempt_at
        gauge = value("registrar_next_attempt_timestamp_seconds", one)
        return due is not None and gauge == pytest.approx(due)

    assert wait_until(gauge_is_the_status)


def registrar_version() -> str:
    return registrar.__version__


def test_wsgi_app_is_plain_wsgi() -> None:
    seen: list[Any] = []
    body = health_app(Registered())(
        {"REQUEST_METHOD": "GET", "PATH_INFO": "/readyz", "QUERY_STRING": "verbose"},
        lambda status, headers: seen.append((status, headers)),
    )
    assert seen[0][0] == "200 OK"
    assert b"".join(body).decode().endswith("readyz check passed\n")
