"""The command end to end, as subprocesses, against the reference server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from support import (
    CLI_ENV,
    FakeClock,
    Ports,
    ScriptedTransport,
    accepted,
    process_port,
    sglang_payload,
    wait_until,
)

from registrar import Registrar, State
from registrar.core._board import mermaid_diagram
from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.surfaces.health import start_health_server

ENV = CLI_ENV


def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "registrar", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=ENV,
    )


def readyz(port: int) -> int | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code
    except requests.RequestException:
        return None


def test_agent_registers_serves_health_and_stops_on_sigterm(
    spawn, tmp_path: Path, ports: Ports
) -> None:
    server = BootstrapServer(sock=ports.reserve())  # not listening yet
    payload_file = tmp_path / "rank0.json"
    payload_file.write_text(json.dumps(sglang_payload()))
    health_port = process_port()
    agent = spawn(
        "register",
        "--url",
        server.url,
        "--payload",
        f"@{payload_file}",
        "--health-port",
        str(health_port),
        "--watch-interval",
        "0.5",
        "--max-attempts",
        "none",
    )
    try:
        assert wait_until(lambda: readyz(health_port) == 503, timeout=20)
        not_yet = run("status", "--health-url", f"http://127.0.0.1:{health_port}")
        assert not_yet.returncode == 1
        assert "registration: registering" in not_yet.stdout
        server.start()
        assert wait_until(lambda: readyz(health_port) == 200, timeout=20)
        status = run("status", "--health-url", f"http://127.0.0.1:{health_port}")
        assert status.returncode == 0, status.stderr
        assert "registration: registered (pass)" in status.stdout
        assert server.registered_count == 1
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=20)
    finally:
        server.close()
    assert agent.returncode == 0, err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert any("Connection refused; next attempt in" in line for line in lines)
    assert any("state registering -> registered" in line for line in lines)
    assert any("state registered -> stopped" in line for line in lines)
    # one timestamped line each: 2026-11-30T03:00:00+0000 LEVEL message
    assert all(line[:4].isdigit() and "T" in line[:11] for line in lines if "state " in line)


def test_exit_policy_ends_the_agent_with_status_3(ports: Ports) -> None:
    result = run(
        "register",
        "--url",
        ports.refusing_url(),
        "--payload",
        json.dumps(sglang_payload()),
        "--max-attempts",
        "1",
        "--on-failure",
        "exit",
    )
    assert result.returncode == 3
    assert "Connection refused" in result.stderr
    assert "on_failure='exit'" in result.stderr


def test_status_of_an_unreachable_agent(ports: Ports) -> None:
    result = run("status", "--health-url", ports.refusing_url())
    assert result.returncode == 4  # distinct from a usage error (2)
    assert "cannot reach" in result.stderr
    assert "Traceback" not in result.stderr


def test_diagram_is_the_table() -> None:
    result = run("diagram")
    assert result.returncode == 0
    assert result.stdout == mermaid_diagram()


def test_bootstrap_command_serves_until_sigterm(spawn) -> None:
    port = process_port()
    proc = spawn("bootstrap", "--host", "127.0.0.1", "--port", str(port))

    def healthy() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    assert wait_until(healthy, timeout=20)
    put = requests.put(f"http://127.0.0.1:{port}/route", json=sglang_payload(), timeout=5)
    assert put.status_code == 200
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=20)
    assert proc.returncode == 0


def test_demo_exits_zero() -> None:
    result = run("demo", timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "[Errno 111] Connection refused" in out
    assert "GET /readyz -> 503" in out
    assert "GET /readyz -> 200" in out
    assert "is missing" in out
    assert "registered again" in out
    assert "summary:" in out
    assert "demo passed" in out


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--payload", "{not json"], "--payload is not valid JSON"),
        (["--payload", "@/nonexistent/rank.json"], "cannot read --payload file"),
        (["--payload", "[1, 2]"], "--payload must be a JSON object"),
        (["--payload", json.dumps({"rank_ip": "127.0.0.1"})], "missing attn_tp_size"),
        (["--url", "ftp://127.0.0.1:8998"], "must start with http:// or https://"),
        (["--url", "http://"], "has no host"),
        (["--max-attempts", "0"], "--max-attempts: must be an integer >= 1"),
        (["--watch-interval", "soon"], "--watch-interval: must be a positive number"),
        (["--health-port", "70000"], "--health-port: must be a port number within [0, 65535]"),
        (["--on-failure", "explode"], "--on-failure: must be retry, stop or exit"),
        (["--ca-bundle", "/nonexistent/ca.pem"], "--ca-bundle: '/nonexistent/ca.pem' is not"),
    ],
)
def test_bad_input_is_one_clear_line(args: list[str], message: str) -> None:
    base = {"--url": "http://127.0.0.1:8998", "--payload": json.dumps(sglang_payload())}
    given = dict(zip(args[::2], args[1::2], strict=True))
    argv = ["register"]
    for key, value in {**base, **given}.items():
        argv += [key, value]
    result = run(*argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith(("registrar: error:", "registrar register: error:"))
    )


def test_health_port_in_use(busy_port: int) -> None:
    result = run(
        "register",
        "--url",
        "http://127.0.0.1:8998",
        "--payload",
        json.dumps(sglang_payload()),
        "--health-port",
        str(busy_port),
    )
    assert result.returncode == 2
    assert f"cannot serve health on 127.0.0.1:{busy_port}" in result.stderr
    assert "Address already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_bootstrap_port_in_use(busy_port: int) -> None:
    result = run("bootstrap", "--port", str(busy_port))
    assert result.returncode == 2
    assert "Address already in use" in result.stderr


@pytest.mark.parametrize("form", [(), ("--json",)])
def test_status_to_a_reader_that_closed_early(registrars: list, form: tuple[str, ...]) -> None:
    """`registrar status | head -c 1`: the reader is gone before the answer is written. No
    traceback, and the exit status is still the answer's (registered: 0), not 1."""
    reg = Registrar(
        "http://127.0.0.1:8998",
        {"service": "demo"},
        transport=ScriptedTransport([accepted()]),
        clock=FakeClock(),
        watch_interval=None,
    )
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    reader, writer = os.pipe()
    os.close(reader)  # the reader closed early: every write gets EPIPE
    try:
        with start_health_server(reg, metrics=False) as health:
            result = subprocess.run(
                [sys.executable, "-m", "registrar", "status", "--health-url", health.url, *form],
                check=False,
                stdout=writer,
                stderr=subprocess.PIPE,
                text=True,
                timeout=60,
                env=ENV,
            )
    finally:
        os.close(writer)
    assert "Traceback" not in result.stderr
    assert "BrokenPipeError" not in result.stderr
    assert result.returncode == 0, result.stderr
