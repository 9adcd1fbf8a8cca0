"""After os.fork() (gunicorn --preload with the health app mounted, multiprocessing "fork"),
a child holds a copy of the registrar without its thread: it must say so, not answer health
from a frozen copy. Tested in a real forked child."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable
from typing import Any

from bootstrap_lab import BootstrapLab
from support import sglang_payload, wait_until

from registrar import Registrar, State, StateError
from registrar.surfaces.health import health_app


def get(reg: Registrar, path: str) -> tuple[int, dict[str, Any]]:
    answer: list[str] = []
    app = health_app(reg)
    body = b"".join(
        app({"REQUEST_METHOD": "GET", "PATH_INFO": path}, lambda s, h: answer.append(s))
    )
    return int(answer[0].split()[0]), json.loads(body)


def in_child(body: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """Run `body` in a forked child and return what it returned (or the error it raised)."""
    read, write = os.pipe()
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process with threads: that is the case under test.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        code = 0
        try:
            os.close(read)
            try:
                result = body()
            except BaseException as exc:
                result = {"error": repr(exc)}
                code = 1
            os.write(write, json.dumps(result).encode())
        finally:
            os._exit(code)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    _, status = os.waitpid(pid, 0)
    result: dict[str, Any] = json.loads(b"".join(chunks) or b"{}")
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_a_forked_child_says_it_has_no_registrar_thread(
    server: BootstrapLab, registrars: list[Registrar]
) -> None:
    reg = Registrar(server.url, sglang_payload(), watch_interval=0.2)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert get(reg, "/readyz")[0] == 200

    def child() -> dict[str, Any]:
        livez, live_doc = get(reg, "/livez")
        readyz, ready_doc = get(reg, "/readyz")
        try:
            reg.start()
            started = "no error"
        except StateError as exc:
            started = str(exc)
        stopped = reg.stop(timeout=1)  # no thread here: must not hang or raise
        return {
            "livez": livez,
            "readyz": readyz,
            "live_output": live_doc.get("output", ""),
            "ready_output": ready_doc.get("output", ""),
            "died": reg.thread_died,
            "start": started,
            "stopped": stopped,
            "state": reg.state.value,
            "pid": os.getpid(),
        }

    seen = in_child(child)
    assert (seen["livez"], seen["readyz"]) == (503, 503)
    for output in (seen["live_output"], seen["ready_output"]):
        assert f"pid {seen['pid']}) is a fork of pid {os.getpid()}" in output
    assert seen["died"] is True
    assert "a second thread would register the same route again" in seen["start"]
    assert seen["stopped"] is True
    assert seen["state"] == "stopped"
    # The parent is untouched: still registered, still watching, nothing PUT twice.
    assert reg.state is State.REGISTERED
    assert not reg.thread_died
    assert get(reg, "/livez")[0] == get(reg, "/readyz")[0] == 200
    checks = len(server.records())
    assert wait_until(lambda: len(server.records()) > checks, timeout=10)
    assert server.registered_count == 1


def test_a_registrar_started_after_the_fork_works_in_the_child(
    server: BootstrapLab, registrars: list[Registrar]
) -> None:
    reg = Registrar(server.url, sglang_payload(port=20001), watch_interval=None)
    registrars.append(reg)  # created before the fork, started only in the child

    def child() -> dict[str, Any]:
        before = reg.thread_died
        reg.start()
        registered = reg.wait_for(State.REGISTERED, timeout=10)
        stopped = reg.stop(timeout=5)
        return {"before": before, "registered": registered, "stopped": stopped}

    assert in_child(child) == {"before": False, "registered": True, "stopped": True}
    assert server.registered_count == 1
    assert reg.state is State.UNREGISTERED  # the parent's copy never started
