"""The command's configuration and manners, as subprocesses: REGISTRAR_* variables (the flag
wins), rank_ip from POD_IP, a token file read again on each request, one-line errors, distinct
exit statuses, status --json, -v, one startup line, and Ctrl-C that never waits out a request."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from bootstrap_lab import BootstrapLab
from support import CLI_ENV, Ports, process_port, sglang_payload, wait_until

from registrar.surfaces import cli
from registrar.surfaces.cli import Signals


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "registrar", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={**CLI_ENV, **(env or {})},
    )


def health(port: int, path: str = "/health") -> dict | None:
    try:
        return requests.get(f"http://127.0.0.1:{port}{path}", timeout=2).json()
    except (requests.RequestException, ValueError):
        return None


def registration(port: int) -> dict:
    document = health(port) or {}
    return document.get("checks", {}).get("registration:state", [{}])[0]


def stop(proc: subprocess.Popen[str]) -> tuple[str, str]:
    proc.send_signal(signal.SIGTERM)
    return proc.communicate(timeout=20)


@pytest.mark.parametrize(
    ("args", "env", "says"),
    [
        (["--max-attempts", "0"], {}, "--max-attempts: must be an integer >= 1"),
        (["--health-port", "99999"], {}, "--health-port: must be a port number within"),
        (["--watch-interval", "0"], {}, "--watch-interval: must be a positive number"),
        (["--timeout", "-1"], {}, "--timeout: must be a positive number"),
        (["--bogus"], {}, "unrecognized arguments: --bogus"),
        (["--payload", "{}"], {}, "--url is required (or set REGISTRAR_URL)"),
        (
            ["--payload", "{}"],
            {"REGISTRAR_URL": "http://127.0.0.1:1", "REGISTRAR_MAX_ATTEMPTS": "0"},
            "REGISTRAR_MAX_ATTEMPTS='0' must be an integer >= 1",
        ),
        (
            ["--url", "http://127.0.0.1:1"],
            {"REGISTRAR_PAYLOAD": "[1]"},
            "REGISTRAR_PAYLOAD must be a JSON object",
        ),
        (
            ["--url", "http://127.0.0.1:1", "--payload", "{}", "--rank-ip-env", "NO_SUCH_VAR"],
            {},
            "the variable NO_SUCH_VAR is not set",
        ),
        (
            ["--payload", "{}"],
            {"REGISTRAR_ETCD": "http://127.0.0.1:1"},
            "--etcd needs --key",
        ),
        (
            ["--payload", "{}"],
            {"REGISTRAR_TTL": "0", "REGISTRAR_ETCD": "http://127.0.0.1:1"},
            "REGISTRAR_TTL='0' must be a positive number of seconds",
        ),
    ],
)
def test_every_usage_error_is_one_line_with_status_2(
    args: list[str], env: dict[str, str], says: str
) -> None:
    result = run("register", *args, env=env)
    assert result.returncode == cli.EXIT_USAGE
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert says in lines[0]
    assert "usage:" not in result.stderr


def test_every_subcommand_help_has_examples_and_exit_statuses() -> None:
    for command in ("register", "status", "diagram", "bootstrap", "demo"):
        text = run(command, "--help").stdout
        assert "example" in text, command
    register = run("register", "--help").stdout
    assert "REGISTRAR_TOKEN_FILE" in register  # every variable is listed
    assert "'off' for none (0 is refused)" in " ".join(register.split())
    assert "4    status: the agent cannot be reached" in run("--help").stdout


def test_options_from_the_environment_and_the_flag_wins(tmp_path: Path, ports: Ports) -> None:
    url = ports.refusing_url()  # refuses: the budget is spent at once
    env = {
        "REGISTRAR_URL": url,
        "REGISTRAR_PAYLOAD": json.dumps(sglang_payload()),
        "REGISTRAR_ON_FAILURE": "exit",
        "REGISTRAR_MAX_ATTEMPTS": "1",
    }
    assert run("register", env=env).returncode == 3  # all from the environment
    # The flag wins, and a variable whose flag is given is not even read.
    env["REGISTRAR_MAX_ATTEMPTS"] = "not a number"
    env["REGISTRAR_ON_FAILURE"] = "stop"
    result = run("register", "--max-attempts", "1", "--on-failure", "exit", env=env)
    assert result.returncode == 3, result.stderr


def test_env_agent_with_rank_ip_from_pod_ip_and_a_rotated_token_file(spawn, tmp_path: Path) -> None:
    server = BootstrapLab("127.0.0.1", 0, token="first-token").start()
    token_file = tmp_path / "token"
    token_file.write_text("first-token\n")
    port = process_port()
    try:
        agent = spawn(
            "register",
            env={
                "REGISTRAR_URL": server.url,
                "REGISTRAR_PAYLOAD": json.dumps(sglang_payload(ip="192.0.2.1")),
                "REGISTRAR_RANK_IP_ENV": "POD_IP",
                "POD_IP": "127.0.0.7",
                "REGISTRAR_TOKEN_FILE": str(token_file),
                "REGISTRAR_HEALTH_PORT": str(port),
                "REGISTRAR_WATCH_INTERVAL": "0.2",
            },
        )
        assert wait_until(lambda: registration(port).get("registrations") == 1, timeout=20)
        (route,) = server.routes().values()
        assert route["rank_ip"] == "127.0.0.7"
        # The token rotates: the server now wants the new one, and forgets every route.
        token_file.write_text("second-token\n")
        server.token = "second-token"
        server.restart()
        assert wait_until(lambda: registration(port).get("registrations") == 2, timeout=20)
        assert len(server.routes()) == 1
        _out, err = stop(agent)
    finally:
        server.close()
    assert agent.returncode == 0, err
    assert "first-token" not in err
    assert "second-token" not in err


@pytest.fixture
def registered_agent(spawn) -> Iterator[tuple[BootstrapLab, int]]:
    """A `registrar register` agent, registered with a reference server, health on a port."""
    server = BootstrapLab("127.0.0.1", 0).start()
    port = process_port()
    try:
        agent = spawn(
            "register",
            "--url",
            server.url,
            "--payload",
            json.dumps(sglang_payload()),
            "--health-port",
            str(port),
        )
        assert wait_until(lambda: registration(port).get("observedValue") == "registered", 20)
        yield server, port
        stop(agent)
    finally:
        server.close()


def test_status_json_and_exit_statuses(
    registered_agent: tuple[BootstrapLab, int], ports: Ports
) -> None:
    _, port = registered_agent
    result = run("status", "--health-url", f"http://127.0.0.1:{port}", "--json")
    assert result.returncode == cli.EXIT_OK, result.stderr
    document = json.loads(result.stdout)
    assert document["status"] == "pass"
    assert document["checks"]["registration:state"][0]["observedValue"] == "registered"
    unreachable = run("status", "--health-url", ports.refusing_url(), "--json")
    assert unreachable.returncode == cli.EXIT_UNREACHABLE
    assert unreachable.stdout == ""
    bad = run("status", "--health-url", "ftp://127.0.0.1:1")
    assert bad.returncode == cli.EXIT_USAGE


def test_status_counts_in_words_for_a_person(registered_agent: tuple[BootstrapLab, int]) -> None:
    server, port = registered_agent
    server.restart()  # forgets the route: one re-registration
    assert wait_until(lambda: registration(port).get("reregistrations") == 1, 30)
    result = run("status", "--health-url", f"http://127.0.0.1:{port}")
    assert result.returncode == cli.EXIT_OK, result.stderr
    assert "accepted, 1 re-registration\n" in result.stdout


def test_help_of_each_command_lists_its_own_exit_statuses_and_one_demo_time() -> None:
    status = run("status", "--help").stdout
    assert "4    the agent cannot be reached" in status
    assert "130" not in status
    assert "3    " not in status
    register = run("register", "--help").stdout
    assert "3    --on-failure exit" in register
    assert "status" not in register.split("exit status:")[1]
    main = run("--help").stdout
    assert f"narrated ({cli.DEMO_DURATION})" in main
    readme = Path(__file__).resolve().parent.parent.joinpath("README.md").read_text()
    assert f"in {cli.DEMO_DURATION})" in " ".join(readme.split())


def test_a_file_name_without_at_gets_the_at_suggested(tmp_path: Path) -> None:
    result = run("register", "--url", "http://127.0.0.1:8998", "--payload", "rank0.json")
    assert result.returncode == cli.EXIT_USAGE
    assert result.stderr.endswith("; to read the file, write --payload @rank0.json\n")
    result = run(
        "register", "--url", "http://127.0.0.1:8998", env={"REGISTRAR_PAYLOAD": "rank0.json"}
    )
    assert result.stderr.endswith("write REGISTRAR_PAYLOAD=@rank0.json\n")


def test_one_startup_line_and_verbose_requests(spawn) -> None:
    server = BootstrapLab("127.0.0.1", 0).start()
    port = process_port()
    try:
        agent = spawn(
            "register",
            "--url",
            server.url,
            "--payload",
            json.dumps(sglang_payload()),
            "--health-port",
            str(port),
            "--watch-interval",
            "0.1",
            "-v",
        )
        assert wait_until(lambda: registration(port).get("observedValue") == "registered", 20)
        # A few route checks that found the route in place.
        assert wait_until(
            lambda: sum(r.method == "GET" and r.status == 200 for r in server.records()) >= 2, 20
        )
        _out, err = stop(agent)
    finally:
        server.close()
    lines = err.splitlines()
    startup = [line for line in lines if "health on" in line or "health endpoints" in line]
    assert len(startup) == 1, err
    assert f"health on http://127.0.0.1:{port}/readyz" in startup[0]
    assert any("registration: accepted (200) in" in line for line in lines), err
    assert any("route check: present (200) in" in line for line in lines), err


def test_bootstrap_verbose_logs_each_request(spawn) -> None:
    port = process_port()
    proc = spawn("bootstrap", "--port", str(port), "-v")

    def up() -> bool:
        try:
            return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok
        except requests.RequestException:
            return False

    assert wait_until(up, timeout=20)
    requests.put(f"http://127.0.0.1:{port}/route", json=sglang_payload(), timeout=5)
    _out, err = stop(proc)
    assert '"PUT /route HTTP/1.1" 200' in err
    assert len([line for line in err.splitlines() if "bootstrap server" in line]) == 1, err


def test_ctrl_c_does_not_wait_out_the_request_in_flight(spawn) -> None:
    # A server that accepts the connection and never answers: the PUT hangs until its deadline.
    silent = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        agent = spawn(
            "register", "--url", url, "--payload", json.dumps(sglang_payload()), "--timeout", "60"
        )
        silent.settimeout(20)
        conn, _ = silent.accept()  # the request is in flight now
        try:
            time.sleep(0.3)
            started = time.monotonic()
            agent.send_signal(signal.SIGINT)
            _out, err = agent.communicate(timeout=40)
            took = time.monotonic() - started
        finally:
            conn.close()
    finally:
        silent.close()
    assert agent.returncode == cli.EXIT_OK, err
    # Not a speed target: half the request's 60 s deadline, reached only by an agent that
    # waited the request out instead of cutting it short.
    assert took < 30, f"waited {took:.1f} s: the 60 s request was not cut short"
    assert "state registering -> stopped" in err


def test_a_second_signal_while_stopping_ends_at_once() -> None:
    exits: list[int] = []
    signals = Signals(exit=exits.append)
    signals.handle(signal.SIGINT, None)
    assert signals.done.is_set()
    assert exits == []  # the first asks for a clean stop
    signals.handle(signal.SIGINT, None)
    assert exits == [cli.EXIT_INTERRUPTED]
