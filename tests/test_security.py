"""Secrets never leak, TLS verification is on by default, and nothing is exposed unasked."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from support import free_port, sglang_payload, wait_until

from registrar import Backoff, Registrar, State
from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.surfaces.health import start_health_server

TOKEN = "tok-9f3b2c7e-secret"
FAST = Backoff(initial=0.05, maximum=0.2)


def test_token_never_appears_in_any_output(
    registrars: list, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.DEBUG)  # urllib3's debug lines included
    with BootstrapServer(token=TOKEN) as server:
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
    payload = tmp_path / "p.json"
    payload.write_text(json.dumps(sglang_payload(port=20009)))
    port = free_port()
    env = {**os.environ, "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "registrar",
            "register",
            "--url",
            url,
            "--payload",
            f"@{payload}",
            "--health-port",
            str(port),
            "-v",
            "--watch-interval",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:

        def ready() -> bool:
            try:
                return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).ok
            except requests.RequestException:
                return False

        assert wait_until(ready, timeout=20)
        status = subprocess.run(
            [
                sys.executable,
                "-m",
                "registrar",
                "status",
                "--health-url",
                f"http://127.0.0.1:{port}",
            ],
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
    return out + err + status.stdout + status.stderr


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
    with BootstrapServer(certfile=cert, keyfile=key) as server:
        assert server.url.startswith("https://127.0.0.1:")
        refused = Registrar(server.url, sglang_payload(), backoff=FAST, watch_interval=None)
        trusted = Registrar(
            server.url, sglang_payload(port=20001), ca_bundle=cert, backoff=FAST, watch_interval=0.2
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
