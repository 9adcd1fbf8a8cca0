"""Hostile input: every option with a clear message, payloads that cannot or should not be sent,
odd URLs (IPv6 literals, credentials)."""

from __future__ import annotations

import base64
import json
import logging
import socket
from typing import Any

import pytest
import requests
from bootstrap_lab import BootstrapLab
from support import sglang_payload, wait_until

from registrar import Backoff, ConfigError, Registrar, State
from registrar.surfaces.health import start_health_server

URL = "http://127.0.0.1:8998"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"url": ""}, "url must be an http(s) URL such as http://127.0.0.1:8998"),
        ({"url": "127.0.0.1:8998"}, "must start with http:// or https://"),
        ({"url": "ftp://127.0.0.1"}, "must start with http:// or https://"),
        ({"url": "http://"}, "has no host"),
        ({"url": "http://[::1"}, "is not a valid URL"),
        ({"url": "http://127.0.0.1:99999"}, "is not a valid URL"),
        ({"url": "http://127.0.0.1:0"}, "has no usable port (':0')"),
        ({"url": "http://127.0.0.1:None"}, "has no usable port (':None')"),
        ({"url": "http://127.0.0.1:8998/?x=1"}, "must not carry a query"),
        ({"backoff": 1.0}, "backoff must be a registrar.Backoff"),
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1 or None, got 0"),
        ({"max_attempts": 2.5}, "max_attempts must be an integer >= 1 or None"),
        ({"max_attempts": True}, "max_attempts must be an integer >= 1 or None"),
        ({"on_failure": "crash"}, "on_failure must be 'retry', 'stop', 'exit' or a callable"),
        ({"watch_interval": 0}, "watch_interval must be a positive number of seconds or None"),
        ({"watch_interval": float("nan")}, "watch_interval must be a positive number"),
        ({"timeout": 0}, "timeout must be positive seconds or a (connect, read) pair"),
        ({"timeout": (1, 0)}, "timeout must be positive seconds or a (connect, read) pair"),
        ({"timeout": "5"}, "timeout must be positive seconds"),
        ({"protocol": "grpc"}, "protocol must be one of 'etcd', 'http', 'sglang', 'smg'"),
        ({"token": "a\nb"}, "token must be a single-line string"),
        ({"verify": "/nonexistent/ca.pem"}, "verify '/nonexistent/ca.pem' is not"),
        ({"max_payload_bytes": 0}, "max_payload_bytes must be a positive integer"),
        ({"transport": object()}, "transport must implement registrar.Transport"),
    ],
)
def test_every_option_has_a_clear_message(kwargs: dict[str, Any], message: str) -> None:
    url = kwargs.pop("url", URL)
    with pytest.raises(ConfigError) as info:
        Registrar(url, sglang_payload(), **kwargs)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"when": object()}, "payload is not JSON-serialisable"),
        ({"tags": {1, 2}}, "payload is not JSON-serialisable"),
        ({"ratio": float("nan")}, "payload is not JSON-serialisable"),
        ([1, 2], "payload must be a mapping"),
        ("rank0", "payload must be a mapping"),
    ],
)
def test_payloads_that_cannot_be_sent(payload: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Registrar(URL, payload, protocol="http")


def test_oversized_payload_is_refused_before_sending(server: BootstrapLab) -> None:
    big = sglang_payload(kv_layout="x" * 70_000)
    with pytest.raises(ConfigError, match=r"over max_payload_bytes=65536"):
        Registrar(server.url, big)
    assert server.records() == []
    # The limit is configurable.
    reg = Registrar(server.url, big, max_payload_bytes=200_000, watch_interval=None)
    with reg:
        assert reg.wait_for(State.REGISTERED, timeout=10)
    assert len(_puts(server)[0].body) > 70_000


def test_server_refuses_bodies_over_its_limit(registrars: list) -> None:
    with BootstrapLab(max_body_bytes=1000) as server:
        answer = requests.put(f"{server.url}/route", data=b"x" * 5000, timeout=5)
        assert answer.status_code == 413
        reg = Registrar(server.url, sglang_payload(kv_layout="y" * 2000), watch_interval=None)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.FAILED, timeout=10)
        assert "larger than the server accepts" in (reg.status().last_error or "")
        assert reg.status().attempts_total == 1


def test_caller_changes_to_the_payload_do_not_reach_the_thread(server: BootstrapLab) -> None:
    payload = sglang_payload()
    reg = Registrar(server.url, payload, watch_interval=None)
    payload["rank_port"] = 1
    with reg:
        assert reg.wait_for(State.REGISTERED, timeout=10)
    assert json.loads(_puts(server)[0].body)["rank_port"] == 20000


def _puts(server: BootstrapLab) -> list:
    """The registrations a server received (a look at the route comes before the first)."""
    return [record for record in server.records() if record.method == "PUT"]


def _ipv6_available() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as sock:
            sock.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_available(), reason="this machine has no ::1")
def test_ipv6_literal_host(registrars: list) -> None:
    with BootstrapLab("::1", 0) as server:
        assert server.url.startswith("http://[::1]:")
        reg = Registrar(server.url, sglang_payload(ip="::1"), watch_interval=0.1)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        server.restart()
        assert wait_until(lambda: reg.status().registrations == 2)
        assert reg.status().url == server.url
        reg.stop()


def test_url_credentials_are_used_and_never_shown(
    server: BootstrapLab, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = server.url.replace("http://", "http://agent:pa55word@")
    server.fail_next(1, 503, method="PUT")
    reg = Registrar(
        url, sglang_payload(), watch_interval=0.1, backoff=Backoff(initial=0.05, maximum=0.1)
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    expected = "Basic " + base64.b64encode(b"agent:pa55word").decode()
    assert server.records()[0].authorization == expected
    with start_health_server(reg, metrics=False) as health:
        shown = requests.get(f"{health.url}/health", timeout=5).text
    everything = caplog.text + shown + repr(reg) + json.dumps(reg.status().to_dict())
    assert "pa55word" not in everything
    assert "agent:" not in everything
    assert "http://***@127.0.0.1:" in reg.status().url
    with pytest.raises(ConfigError) as info:
        Registrar("ftp://agent:pa55word@127.0.0.1:1", sglang_payload())
    assert "pa55word" not in str(info.value)
