"""The construction contract: whatever a caller or a command line hands over, the answer is one
`ConfigError` at construction (one line and a documented exit status from the command), never
a `RecursionError`, never an error that waits to surface in the thread; and `registrar status`
reads whatever answers (a hostile health server on 127.0.0.1) without a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hostile_server import HostileServer, answer
from support import CLI_ENV, sglang_payload

from registrar import ConfigError, Registrar
from registrar.surfaces import cli

URL = "http://127.0.0.1:8998"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


@pytest.mark.parametrize("protocol", ["sglang", "http"])
@pytest.mark.parametrize("depth", [65, 10_000])
def test_a_deeply_nested_payload_is_a_config_error(protocol: str, depth: int) -> None:
    payload = sglang_payload(kv_layout=_nested(depth))
    with pytest.raises(ConfigError, match="payload is nested more than 64 levels deep"):
        Registrar(URL, payload, protocol=protocol)


def test_a_payload_that_contains_itself_is_a_config_error() -> None:
    payload = sglang_payload()
    payload["self"] = [payload]
    with pytest.raises(ConfigError, match="payload is nested more than 64 levels deep"):
        Registrar(URL, payload, protocol="http")


def test_a_payload_nested_within_the_limit_is_accepted() -> None:
    reg = Registrar(URL, sglang_payload(kv_layout=_nested(60)), protocol="http")
    assert reg.payload["kv_layout"]["x"]["x"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8998\n",
        "http://127.0.0.1:8998\r\n",
        " http://127.0.0.1:8998",
        "http://127.0.0.1:8998/\t",
        "http://127.0.0.1:89\t98",
        "http://127.0.0.1:8998/ro ute",
        "http://127.0.0.1:8998\x00",
        "http://127.0.0.1:8998\x7f",
        "http://127.0.0.1:8998\u2028",
        "http://127.0.0.1:8998\u200b",
        "http://127.0.0.1:8998\u00a0",
    ],
)
def test_a_url_with_a_space_or_control_character_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="contains a space or control character") as info:
        Registrar(url, sglang_payload())
    assert "\n" not in str(info.value)
    assert "\r" not in str(info.value)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "registrar", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=CLI_ENV,
    )


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr[:2000]
    return lines[0]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ("[" * 50_000 + "]" * 50_000, "is JSON nested more than 64 levels deep"),
        ('{"a": ' * 50_000 + "1" + "}" * 50_000, "is JSON nested more than 64 levels deep"),
        (json.dumps(sglang_payload(kv_layout=_nested(100))), "is JSON nested more than 64"),
        ('{"rank_port": ' + "9" * 5000 + "}", "is not valid JSON"),
    ],
)
def test_the_command_refuses_a_hostile_payload_in_one_line(
    payload: str, message: str, tmp_path: Path
) -> None:
    # From a file: an argument of 300 KB is more than the system passes to a process.
    path = tmp_path / "payload.json"
    path.write_text(payload)
    result = run("register", "--url", URL, "--payload", f"@{path}")
    assert result.returncode == cli.EXIT_USAGE
    assert message in _one_line(result)


def test_the_command_refuses_a_url_with_a_newline_in_one_line() -> None:
    payload = json.dumps(sglang_payload())
    result = run("register", "--url", URL + "\n", "--payload", payload)
    assert result.returncode == cli.EXIT_USAGE
    assert "contains a space or control character" in _one_line(result)


@pytest.mark.parametrize(
    "body",
    [
        "[null]",
        "null",
        '{"checks": {"registration:state": [null]}}',
        '{"checks": {"registration:state": []}}',
        '{"checks": []}',
        "[" * 50_000 + "]" * 50_000,
        '{"checks": ' * 20_000 + "1" + "}" * 20_000,
        "<html>not json</html>",
        "9" * 5000,
    ],
    ids=lambda body: body[:30],
)
def test_status_reads_any_answer_without_a_traceback(body: str) -> None:
    with HostileServer(answer(200, body, [("Content-Type", "application/json")])) as server:
        result = run("status", "--health-url", server.url)
    assert result.returncode == cli.EXIT_UNREACHABLE
    assert "is not a registrar health endpoint" in _one_line(result)
    assert result.stdout == ""


def test_status_escapes_what_the_agent_says() -> None:
    check = {
        "observedValue": "registered\n\x1b[2Jforged: line",
        "url": "http://x/\u202eevil",
        "route": ["not", "a", "string"],
        "attemptsTotal": {"deep": [1, 2]},
    }
    document = {
        "status": "pass",
        "output": "A" * 10_000,
        "checks": {"registration:state": [check]},
    }
    with HostileServer(answer(200, json.dumps(document))) as server:
        result = run("status", "--health-url", server.url)
    assert result.returncode == cli.EXIT_NOT_REGISTERED
    assert "\x1b" not in result.stdout
    assert "\u202e" not in result.stdout
    assert "registered\\x0a\\x1b[2Jforged: line" in result.stdout
    assert all(len(line) < 400 for line in result.stdout.splitlines())
