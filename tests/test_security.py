"""Secrets never leak, TLS verification is on by default, and nothing is exposed unasked."""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
import requests
from bootstrap_lab import BootstrapLab
from hostile_server import Behaviour, Conn, HostileServer, Request, answer
from support import Ports, process_port, sglang_payload, wait_until

from registrar import Backoff, ConfigError, Registrar, State
from registrar.surfaces.health import start_health_server

TOKEN = "tok-9f3b2c7e-secret"
FAST = Backoff(initial=0.05, maximum=0.2)


def test_token_never_appears_in_any_output(
    registrars: list, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)  # urllib3's debug lines included
    with BootstrapLab(token=TOKEN) as server:
        good = Registrar(
            server.url, sglang_payload(), token=TOKEN, backoff=FAST, watch_interval=0.1
        )
        bad = Registrar(server.url, sglang_payload(port=20001), token=TOKEN + "-old", backoff=FAST)
        registrars += [good, bad]
        # The server echoes the token in an error body; `good` alone sends it (one at a time,
        # so the echo cannot reach `bad`, which never knew this token).
        server.fail_next(1, 503, body=f"echo: Bearer {TOKEN}", method="PUT")
        good.start()
        assert good.wait_for(State.REGISTERED, timeout=10)
        assert good.status().attempts_total == 2
        bad.start()
        assert bad.wait_for(State.FAILED, timeout=10)
        assert any(r.authorization == f"Bearer {TOKEN}" for r in server.records())
        with (
            start_health_server(good, metrics=False) as a,
            start_health_server(bad, metrics=False) as b,
        ):
            health = "".join(
                requests.get(f"{h.url}{path}", timeout=5).text
                for h in (a, b)
                for path in ("/health", "/readyz", "/livez")
            )
        agent = _agent_output(server.url, tmp_path)
    channels = {
        "logs": caplog.text,
        "status": json.dumps([good.status().to_dict(), bad.status().to_dict()]),
        "health": health,
        "repr": repr(good) + repr(bad) + repr(good.status()),
        "agent": agent,
    }
    for name, text in channels.items():
        assert TOKEN not in text, f"the token leaked into {name}"
    assert "check the bootstrap auth token" in (bad.status().last_error or "")
    assert "***" in caplog.text  # the echoed token was redacted, not dropped silently


def _agent_output(url: str, tmp_path: Path) -> str:
    def ready(port: int) -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).ok
        except requests.RequestException:
            return False

    return _run_agent(url, tmp_path, TOKEN, ready, "--watch-interval", "0.2")


def _run_agent(
    url: str, tmp_path: Path, token: str, until: Callable[[int], bool], *args: str
) -> str:
    """A `registrar register -v` agent with its token in the environment, run until `until`
    (given its health port) holds: its whole output, its /metrics, and `registrar status`'s."""
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps(sglang_payload(port=20009)))
    port = process_port()
    env = {**os.environ, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN": token}
    command = ["register", "--url", url, "--payload", f"@{payload}", "--health-port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "registrar", *command, "-v", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert wait_until(lambda: until(port), timeout=20)
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
        health_url = f"http://127.0.0.1:{port}"
        status = subprocess.run(
            [sys.executable, "-m", "registrar", "status", "--health-url", health_url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0
    return out + err + metrics + status.stdout + status.stderr


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_verification_on_by_default(registrars: list, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    with BootstrapLab(certfile=cert, keyfile=key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        refused = Registrar(
            server.url, sglang_payload(), backoff=FAST, watch_interval=None, on_failure="stop"
        )
        trusted = Registrar(
            server.url, sglang_payload(port=20001), verify=cert, backoff=FAST, watch_interval=0.2
        )
        registrars += [refused, trusted]
        refused.start()
        trusted.start()
        assert refused.wait_for(State.FAILED, timeout=10)
        error = refused.status().last_error or ""
        assert error.startswith(f"TLS certificate verification failed for {server.url}/route")
        assert "CERTIFICATE_VERIFY_FAILED" in error
        assert "CA bundle" in error
        assert refused.status().attempts_total == 1  # a configuration error: not retried
        assert trusted.wait_for(State.REGISTERED, timeout=10)
        server.restart()
        assert wait_until(lambda: trusted.status().registrations == 2)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_rotated_ca_bundle_is_read_again_on_the_next_connection(
    registrars: list, tmp_path: Path, ports: Ports
) -> None:
    """The server comes back with a certificate from another CA and the bundle file was
    rotated meanwhile: the new connection verifies against the bundle as it is now (a context
    kept from the first connection would fail the registration for good)."""
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old_cert, old_key = _self_signed(tmp_path / "old")
    new_cert, new_key = _self_signed(tmp_path / "new")
    bundle = tmp_path / "bundle.pem"
    bundle.write_text(Path(old_cert).read_text())
    with BootstrapLab(sock=ports.reserve(), certfile=old_cert, keyfile=old_key) as server:
        reg = Registrar(
            server.url, sglang_payload(), verify=str(bundle), backoff=FAST, watch_interval=0.2
        )
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        successor = ports.reserve(port=server.port)  # the port stays held between the two
    bundle.write_text(Path(new_cert).read_text())
    stamp = bundle.stat().st_mtime + 2  # a new stamp even on a coarse-grained file system
    os.utime(bundle, (stamp, stamp))
    with BootstrapLab(sock=successor, certfile=new_cert, keyfile=new_key) as server:
        assert wait_until(lambda: reg.status().registrations == 2, timeout=20)
        assert server.registered_count == 1


# ----------------------------------------------------------------- every secret, every channel

SECRET_TOKEN = "s3cr3t/T0k+en=~x"
"""Characters that percent-escape ('/', '+', '='), so an escaped form differs from the raw one."""
USER, PASSWORD = "ad@min", "p@ss/w0rd%"


def _encodings(secret: str) -> set[str]:
    """The forms a secret may take in an error text, a header or a body."""
    forms = {
        secret,
        quote(secret, safe=""),
        quote(secret),
        quote_plus(secret),
        repr(secret)[1:-1],
        json.dumps(secret)[1:-1],
        base64.b64encode(secret.encode()).decode(),
    }
    return {f for f in forms if len(f) >= 4}


def _echo(status: int) -> Behaviour:
    """Answers `status` and echoes what it received as credentials, in every encoding, in the
    body, in headers (a Location included) and in a route answer's rank_ip."""

    def behave(conn: Conn, request: Request) -> bool:
        auth = request.headers.get("authorization", "")
        value = auth.split(" ", 1)[-1]
        decoded = base64.b64decode(value).decode() if auth.startswith("Basic ") else value
        parts = [auth, value, decoded, *_encodings(decoded), *decoded.split(":")]
        echoed = " | ".join(parts)
        if request.method == "GET":
            body = json.dumps({"rank_ip": echoed, "rank_port": 1})
            return answer(200, body)(conn, request)
        headers = [("Location", f"http://10.0.0.1/?t={value}&d={quote(decoded)}"), ("X-Echo", auth)]
        return answer(status, f"denied: {echoed}\n{echoed!r}", headers)(conn, request)

    return behave


def _channels(
    reg: Registrar, caplog: pytest.LogCaptureFixture, extra: dict[str, str]
) -> dict[str, str]:
    with start_health_server(reg, metrics=True) as health:
        served = {
            path: requests.get(f"{health.url}{path}", timeout=5).text
            for path in ("/health", "/readyz", "/livez", "/metrics")
        }
    return {
        "logs": caplog.text,
        "status": json.dumps(reg.status().to_dict()) + repr(reg.status()),
        "repr": repr(reg),
        **served,
        **extra,
    }


@pytest.mark.parametrize("credential", ["token", "env-token", "url-userinfo"])
def test_no_secret_reaches_any_channel_in_any_encoding(
    credential: str,
    registrars: list,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = [SECRET_TOKEN] if credential != "url-userinfo" else [USER, PASSWORD]
    secrets.append(base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    kwargs: dict[str, Any] = {}
    if credential == "token":
        kwargs["token"] = SECRET_TOKEN
    elif credential == "env-token":
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", SECRET_TOKEN)
    # Two echoed 503s, an echoed 200 to register, an echoed route check (a conflict), then an
    # echoed 401 after the route is reported missing.
    script = [_echo(503), _echo(503), answer(200, ""), _echo(200), _echo(401)]
    with HostileServer(*script) as server:
        url = server.url
        if credential == "url-userinfo":
            url = (
                f"http://{quote(USER, safe='')}:{quote(PASSWORD, safe='')}@127.0.0.1:{server.port}"
            )
        reg = Registrar(url, sglang_payload(), backoff=FAST, watch_interval=None, **kwargs)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert wait_until(lambda: reg.status().route == "conflict", timeout=10)
        agent = ""
        if credential == "env-token":
            server.script(_echo(503), _echo(503), _echo(401))
            agent = _agent_channels(server.url, tmp_path)
        sent = [r.headers.get("authorization", "") for r in server.requests]
    expected = f"Bearer {SECRET_TOKEN}" if credential != "url-userinfo" else f"Basic {secrets[-1]}"
    assert sent[0] == expected  # the secret was really sent, and echoed
    channels = _channels(reg, caplog, {"agent": agent})
    for name, text in channels.items():
        for secret in secrets:
            for form in _encodings(secret):
                assert form not in text, f"a form of a secret ({form[:3]}...) leaked into {name}"
    assert "***" in caplog.text  # masked, not dropped silently


def _agent_channels(url: str, tmp_path: Path) -> str:
    """The agent against the echoing server, run until it has failed (503, 503, 401)."""

    def failed(port: int) -> bool:
        try:
            return "failed" in requests.get(f"http://127.0.0.1:{port}/health", timeout=2).text
        except requests.RequestException:
            return False

    return _run_agent(url, tmp_path, SECRET_TOKEN, failed, "--max-attempts", "none")


@pytest.mark.parametrize(
    ("env", "token", "message"),
    [
        ("a\nb", None, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN must be one line"),
        ("tok en", None, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN must be one line"),
        (None, "t\u00f6k\u2603", "token must be one line of visible ASCII"),
        (None, "tok\x00", "token must be one line of visible ASCII"),
    ],
)
def test_a_token_that_cannot_be_sent_is_refused_at_construction(
    env: str | None, token: str | None, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is not None:
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", env)
    with pytest.raises(ConfigError, match=message) as info:
        Registrar("http://127.0.0.1:8998", sglang_payload(), token=token)
    assert (env or token or "") not in str(info.value)


def test_url_credentials_and_a_token_are_refused_together(monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://user:pw@127.0.0.1:8998"
    with pytest.raises(ConfigError, match=r"url carries credentials .* and token sets a bearer"):
        Registrar(url, sglang_payload(), token="abc")
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "abc")
    with pytest.raises(ConfigError, match="SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN sets a"):
        Registrar(url, sglang_payload())


@pytest.mark.parametrize(
    ("credential", "blamed"),
    [
        ("token", "check the bootstrap auth token (from token)"),
        ("env", "check the bootstrap auth token (from SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)"),
        ("userinfo", "check the user name and password in the URL"),
        ("none", "none were sent; pass one with token= or SGLANG_"),
    ],
)
def test_a_401_blames_the_credential_that_was_sent(
    credential: str, blamed: str, registrars: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", raising=False)
    if credential == "env":
        monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "abcd")
    with HostileServer(answer(401, "no")) as server:
        url = server.url.replace("://", "://u:p@") if credential == "userinfo" else server.url
        token = "abcd" if credential == "token" else None
        reg = Registrar(url, sglang_payload(), token=token, watch_interval=None)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.FAILED, timeout=10)
    assert blamed in (reg.status().last_error or "")
