"""The pieces that let the plugin work on SGLang releases without its newer hook points, and
never break a server: the capture of SGLang's own PUT in `register_to_bootstrap` (calling thread
only, against the reference server over HTTP for every other thread), the guards around every
hook kind, the readiness computed where SGLang has no `is_ready`, and the `/ready` route added to
a FastAPI app."""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from support import sglang_payload

from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.integrations.sglang import _rows as rows
from registrar.integrations.sglang import _tables as tables
from registrar.integrations.sglang._guard import guarded

# What SGLang 0.5.12-0.5.19's register_to_bootstrap does with the module-level `requests`:
# the inline loop of up to 5 tries, returning at the first 200 (shortened delays here).
SGLANG_LIKE = """
def register_to_bootstrap(self):
    url = self.url + "/route"
    for attempt in range(5):
        try:
            response = requests.put(url, json=self.payload, timeout=5)
            if response.status_code == 200:
                self.tries = attempt + 1
                return
        except Exception:
            pass
        time.sleep(0.01)
    self.tries = 5
"""


def sglang_module() -> dict[str, Any]:
    import time  # noqa: PLC0415

    namespace: dict[str, Any] = {"requests": requests, "time": time}
    exec(compile(SGLANG_LIKE, "conn.py", "exec"), namespace)
    return namespace


def test_sglangs_put_is_captured_on_its_thread_and_answered_as_a_success(
    server: BootstrapServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = sglang_module()
    manager = SimpleNamespace(url=server.url, payload=sglang_payload(tp_rank=1, tp_size=2))
    started: list[tuple[str, dict[str, Any]]] = []
    monkeypatch.setattr(
        rows, "register_row", lambda m, url, payload: started.append((url, payload))
    )
    rows.capture_registration(namespace["register_to_bootstrap"], manager)
    assert manager.tries == 1  # SGLang's loop ended at its first try
    assert started == [(f"{server.url}/route", manager.payload)]  # SGLang's URL and payload
    assert server.registered_count == 0  # nothing reached the server: the registrar will
    assert namespace["requests"] is requests  # put back


def test_other_threads_reach_the_real_requests_meanwhile(
    server: BootstrapServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = sglang_module()
    inside, release = threading.Event(), threading.Event()
    answers: list[int] = []

    # SGLang's function, in its module: it PUTs, then waits while another thread PUTs too.
    exec(
        "def slow(manager):\n"
        "    requests.put(manager.url + '/route', json=manager.payload, timeout=5)\n"
        "    inside.set()\n"
        "    release.wait(10)\n",
        namespace,
    )
    namespace.update(inside=inside, release=release)

    def other() -> None:
        inside.wait(10)
        put = namespace["requests"].put  # the proxy, seen from another thread
        answers.append(put(f"{server.url}/route", json=sglang_payload(), timeout=5).status_code)
        release.set()

    thread = threading.Thread(target=other)
    thread.start()
    manager = SimpleNamespace(url=server.url, payload=sglang_payload(tp_rank=1, tp_size=2))
    captured: list[Any] = []
    monkeypatch.setattr(rows, "register_row", lambda m, url, payload: captured.append(payload))
    rows.capture_registration(namespace["slow"], manager)
    thread.join(10)
    assert answers == [200]
    assert server.registered_count == 1  # the other thread's PUT, sent for real
    assert len(captured) == 1
    assert namespace["requests"] is requests


def test_a_row_whose_registrar_cannot_start_is_sent_as_sglang_would(
    server: BootstrapServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    namespace = sglang_module()
    manager = SimpleNamespace(url=server.url, payload=sglang_payload())

    def broken(*args: Any) -> None:
        raise RuntimeError("cannot start")

    monkeypatch.setattr(rows, "register_row", broken)
    with caplog.at_level(logging.ERROR):
        rows.capture_registration(namespace["register_to_bootstrap"], manager)
    assert server.registered_count == 1  # SGLang's own PUT, once
    assert "sending SGLang's PUT once instead" in caplog.text


def raising(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in a hook")


@pytest.mark.parametrize("kind", ["BEFORE", "AFTER"])
def test_a_failing_before_or_after_hook_leaves_sglangs_call_alone(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    hook = guarded(raising, kind, f"sglang.x.{kind}")
    with caplog.at_level(logging.ERROR):
        assert hook("args") is None  # BEFORE: keep SGLang's arguments; AFTER: its result
        assert hook("args") is None
    assert caplog.text.count(f"the hook on sglang.x.{kind} failed") == 1  # logged once


def test_two_hooks_failing_on_one_target_are_each_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """0.5.11-0.5.19: the stand-in /ready and the gateway both run before SGLang's HTTP start;
    the second to fail was never logged when the guard kept one line per target."""

    def add_ready_route(*args: Any) -> None:
        raise RuntimeError("ready")

    def start_gateway(*args: Any) -> None:
        raise RuntimeError("gateway")

    hooks = [guarded(h, "BEFORE", "sglang.http.start") for h in (add_ready_route, start_gateway)]
    with caplog.at_level(logging.ERROR):
        for _ in range(2):
            for hook in hooks:
                assert hook() is None
    for name in ("add_ready_route", "start_gateway"):
        assert caplog.text.count(f"the hook on sglang.http.start failed ({name})") == 1


def test_a_failing_around_hook_calls_sglang_once() -> None:
    calls: list[int] = []

    def original(x: int) -> int:
        calls.append(x)
        return x * 2

    def before(original: Any, x: int) -> int:
        raise RuntimeError("before the call")

    def after(original: Any, x: int) -> int:
        original(x)
        raise RuntimeError("after the call")

    assert guarded(before, "AROUND", "sglang.a")(original, 3) == 6
    assert guarded(after, "AROUND", "sglang.b")(original, 4) == 8
    assert calls == [3, 4]  # never twice


def test_sglangs_own_exception_passes_through_an_around_hook() -> None:
    def original() -> None:
        raise ValueError("SGLang's own")

    def hook(original: Any) -> Any:
        return original()

    with pytest.raises(ValueError, match="SGLang's own"):
        guarded(hook, "AROUND", "sglang.c")(original)


def test_a_failing_replace_runs_sglangs_original() -> None:
    assert guarded(raising, "REPLACE", "sglang.d", original=lambda x: x + 1)(1) == 2
    with pytest.raises(ValueError, match="needs SGLang's original"):
        guarded(raising, "REPLACE", "sglang.e")


def test_a_failing_async_around_hook_runs_the_coroutine() -> None:
    async def original(x: int) -> int:
        return x

    async def hook(original: Any, x: int) -> int:
        raise RuntimeError("async bug")

    assert asyncio.run(guarded(hook, "AROUND", "sglang.f")(original, 5)) == 5


def test_system_exit_is_a_refusal_on_purpose_and_passes() -> None:
    def refuse(*args: Any) -> None:
        raise SystemExit("REGISTRAR_GATEWAY: bad address")

    with pytest.raises(SystemExit):
        guarded(refuse, "BEFORE", "sglang.g")()


def _manager(**fields: Any) -> SimpleNamespace:
    base = {
        "is_pause": False,
        "gracefully_exit": False,
        "server_status": SimpleNamespace(name="Up"),
    }
    return SimpleNamespace(**{**base, **fields})


def test_readiness_without_is_ready_is_computed_as_sglang_0_5_20_does() -> None:
    assert tables.server_ready(_manager())
    assert not tables.server_ready(_manager(is_pause=True))
    assert not tables.server_ready(_manager(gracefully_exit=True))
    assert not tables.server_ready(_manager(server_status=SimpleNamespace(name="Starting")))
    half = SimpleNamespace(
        dp_size=1,
        attn_cp_size=1,
        attn_tp_size=2,
        pp_size=1,
        prefill_port_table={0: {0: {0: {0: 1}}}},
    )
    assert not tables.server_ready(_manager(bootstrap_server=half))
    half.prefill_port_table[0][0][1] = {0: 1}
    assert tables.server_ready(_manager(bootstrap_server=half))
    own = _manager(is_ready=lambda: False)
    assert tables.readiness(own)() is False  # SGLang's own (0.5.20+, gated by the AROUND)
    assert tables.readiness(_manager())() is True


def test_the_ready_route_is_added_once_to_an_app_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import fastapi  # noqa: PLC0415 - in the test extra, as SGLang has it

    app = fastapi.FastAPI()
    monkeypatch.setitem(sys.modules, tables.HTTP_SERVER, SimpleNamespace(app=app))
    manager = _manager(server_status=SimpleNamespace(name="Starting"))
    tables.add_ready_route(None, manager)
    tables.add_ready_route(None, manager)
    [route] = [r for r in app.routes if getattr(r, "path", None) == "/ready"]
    assert asyncio.run(route.endpoint()).status_code == 503
    manager.server_status = SimpleNamespace(name="Up")
    assert asyncio.run(route.endpoint()).status_code == 200
