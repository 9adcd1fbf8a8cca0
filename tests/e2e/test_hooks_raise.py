"""Scenario 7: every hook the plugin installs raises, and the deployment still starts and serves.

No hook may raise into SGLang's code (issue 25): the guard (registrar/integrations/sglang/
guard.py) logs a hook's failure once and SGLang's own behaviour goes on. Here every hook the
target table installs on the running release is made to raise inside the servers' processes
(e2e_support/raising.py, through `E2E_HOOKS_RAISE=1`), with `REGISTRAR_GATEWAY` set to a live smg
so the gateway hook is in play as well. The servers must start, a request through the router
must be answered, each hook must be reached, and each hook's failure must be logged exactly once
in each process it was raised in, however often it was called there.
"""

from __future__ import annotations

import re
import time
from collections import Counter

import pytest
import requests
from e2e_support.deploy import Deployment, Process, server_env, wait_http
from e2e_support.raising import INSTALLED, RAISED, failure_text
from e2e_support.release import has_feature, hidden_by_override, installed_targets
from e2e_support.stack import SERVE_TIMEOUT, generate
from support import process_port

pytestmark = pytest.mark.timeout(900)

REACH_TIMEOUT = 120.0
"""Within this every hook must have been called once its trigger was sent (2 loaded cores)."""

Hook = tuple[str, str]
"""(hook function name, target path)."""


def _pattern(template: str) -> re.Pattern[str]:
    fields = {"hook": r"(\S+)", "target": r"(\S+)", "pid": r"(\d+)"}
    return re.compile(re.escape(template).replace(r"\{", "{").replace(r"\}", "}").format(**fields))


INSTALLED_RE = _pattern(INSTALLED)
RAISED_RE = _pattern(RAISED)


def _installed(log: str) -> dict[str, set[Hook]]:
    """Per process of a server, the hooks the plugin installed there."""
    found: dict[str, set[Hook]] = {}
    for hook, target, pid in INSTALLED_RE.findall(log):
        found.setdefault(pid, set()).add((hook, target))
    return found


def _raised(log: str) -> Counter[tuple[str, str, str]]:
    """(hook, target, pid): how many times it raised."""
    return Counter(RAISED_RE.findall(log))


def _serve(prefill: Process, decode: Process, router: str) -> None:
    """A request through the router answered, and what the other hooks hook called: /ready
    and /server_info (registration ran at start; the heartbeat and the SIGTERM watchdog start
    with the first request)."""
    deadline = time.monotonic() + REACH_TIMEOUT
    answer = generate(router)
    while answer[0] != 200 and time.monotonic() < deadline:
        time.sleep(1)
        answer = generate(router)
    assert answer[0] == 200, f"no request through the router served: {answer}"
    for server in (prefill, decode):
        requests.get(f"{server.url}/ready", timeout=30)  # 200, 503 or 404: any answer is fine
        info = requests.get(f"{server.url}/server_info", timeout=30)
        assert info.status_code == 200, (server.name, info.status_code, info.text[:300])


def _switch_role(prefill: Process) -> None:
    """Where the release has a PD role switch, the idle prefill asked to become a decode:
    SGLang tears its prefill side down first (the hook's target). Whether the rebuild works
    on a CPU is not this test's business, only that the hook ran and the switch went on."""
    if has_feature("role switch"):
        body = {"new_role": "decode", "decode_cuda_graph_memory_gb": 0}
        answer = requests.post(f"{prefill.url}/pd_role_switch", json=body, timeout=120)
        print(f"role switch: {answer.status_code} {answer.text[:300]}")


def _wait_reached(servers: tuple[Process, ...], expected: set[Hook]) -> None:
    deadline = time.monotonic() + REACH_TIMEOUT
    while True:
        reached = {(h, t) for s in servers for h, t, _ in _raised(s.text())}
        if expected <= reached or time.monotonic() > deadline:
            missing = sorted(expected - reached)
            assert not missing, f"hooks never reached (made to raise, never called): {missing}"
            return
        time.sleep(1)


Unlogged = tuple[str, str, str]
"""(hook, target, pid) of a hook that raised and whose failure the guard did not log."""


def _check_logged_once(
    server: Process, expected: set[Hook]
) -> tuple[dict[str, int], list[Unlogged]]:
    """In each of the server's processes: the plugin installed every hook of the table, and
    no hook raised there is logged by the guard more than once. The calls per hook, and the
    hooks raised whose failure was never logged."""
    log = server.text()
    installed = _installed(log)
    assert installed, f"{server.name}: the plugin installed no hook:\n{server.tail()}"
    for pid, hooks in installed.items():
        assert hooks == expected, f"{server.name} pid {pid} installed {sorted(hooks)}"
    calls: dict[str, int] = {}
    unlogged: list[Unlogged] = []
    for (hook, target, pid), count in _raised(log).items():
        logged = log.count(failure_text(hook, target, pid))
        assert logged <= 1, (
            f"{server.name}: {hook} at {target} raised {count} times in pid {pid}, "
            f"its failure logged {logged} times (expected once)"
        )
        if not logged:
            unlogged.append((hook, target, pid))
        calls[hook] = calls.get(hook, 0) + count
    return calls, unlogged


def _logged_once_each(servers: tuple[Process, ...], expected: set[Hook]) -> None:
    """Each hook raised in a process is logged there exactly once (the guard keys its line by
    hook and target: two hooks on one target each get theirs)."""
    calls: dict[str, dict[str, int]] = {}
    for server in servers:
        calls[server.name], unlogged = _check_logged_once(server, expected)
        assert not unlogged, f"{server.name}: raised, never logged (hook, target, pid): {unlogged}"
    print(f"calls per hook, each failure logged once per process: {calls}")


def test_7_every_hook_raises_and_the_servers_start_and_serve(deploy: Deployment) -> None:
    expected = {(t.hook, t.path) for t in installed_targets()}
    gateway = deploy.router(process_port())
    wait_http(gateway, "/workers", 60)
    env = server_env(plugin=True, REGISTRAR_GATEWAY=gateway.url, E2E_HOOKS_RAISE="1")
    switch = ("--enable-pd-role-switch",) if has_feature("role switch") else ()
    bootstrap_port = process_port()
    prefill = deploy.prefill(process_port(), bootstrap_port, env, switch)
    decode = deploy.decode(process_port(), env, switch)
    for server in (prefill, decode):
        wait_http(server, "/health", SERVE_TIMEOUT)
    router = deploy.router(process_port(), (prefill.url, bootstrap_port, decode.url))
    wait_http(router, "/readiness", 120)

    _serve(prefill, decode, router.url)
    for server in (prefill, decode):
        assert requests.get(f"{server.url}/health", timeout=30).status_code == 200, server.name
    # The gateway hook raised before it started anything: the gateway never heard of them.
    listed = requests.get(f"{gateway.url}/workers", timeout=10).json()["workers"]
    assert listed == [], listed
    _switch_role(prefill)
    hidden = hidden_by_override(installed_targets())
    _wait_reached((prefill, decode), {(h, t) for h, t in expected if t not in hidden})
    _logged_once_each((prefill, decode), expected)
