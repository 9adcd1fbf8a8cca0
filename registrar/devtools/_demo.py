"""`registrar demo`: a bootstrap server that starts late, `/readyz` turning 200, a restart that
forgets every route and the route registered again, narrated as it happens on 127.0.0.1."""

from __future__ import annotations

import logging
import threading
import time
from typing import TextIO

import requests

from ..core._backoff import Backoff
from ..core._board import State, Status
from ..core._registrar import Registrar
from ..protocols._sglang import make_payload
from ..surfaces.health import start_health_server
from .bootstrap_server import BootstrapServer


class _Say(logging.Handler):
    """Prints the demo's lines and registrar's INFO log, timed from the start; keeps problems."""

    def __init__(self, out: TextIO) -> None:
        super().__init__(logging.INFO)
        self._out = out
        self._start = time.monotonic()
        self._print = threading.Lock()
        self.problems: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self._start

    def __call__(self, message: str) -> None:
        with self._print:
            print(f"[{self.elapsed():5.2f}s] {message}", file=self._out, flush=True)

    def emit(self, record: logging.LogRecord) -> None:
        self(record.getMessage())

    def expect_readyz(self, url: str, expected: int, when: str) -> None:
        try:
            code: int | None = requests.get(f"{url}/readyz", timeout=2).status_code
        except requests.RequestException:
            code = None
        self(f"GET /readyz -> {code}")
        if code != expected:
            self.problems.append(f"/readyz answered {code} {when}, not {expected}")

    def finish(self, problem: str | None = None) -> int:
        """The exit status, after the verdict, with `problem` that ends the demo early."""
        self.problems += [problem] if problem else []
        for seen in self.problems:
            self(f"demo FAILED: {seen}")
        if not self.problems:
            self("demo passed: registered late, kept registered through a restart")
        return 1 if self.problems else 0


def run_demo(out: TextIO) -> int:
    """Run the demo; 0 when every step happened, 1 otherwise."""
    say = _Say(out)
    # registrar's log told through `say`, the rest quieted; their levels restored at the end
    log = logging.getLogger("registrar")
    quiet = ("transitions", "registrar.devtools.bootstrap_server", "registrar.surfaces.health")
    saved = [(lg, lg.level) for lg in [log, *map(logging.getLogger, quiet)]]
    log.addHandler(say)
    log.setLevel(logging.INFO)
    for lg, _ in saved[1:]:
        lg.setLevel(logging.WARNING)

    server = BootstrapServer("127.0.0.1", 0).start()
    server.stop()  # keep the port, refuse connections: the startup race
    reg = Registrar(
        server.url,
        make_payload("127.0.0.1", 20000),
        backoff=Backoff(initial=0.5, multiplier=2.0, maximum=2.0, jitter=0.25),
        max_attempts=None,
        watch_interval=1.0,
        timeout=(1.0, 2.0),
    )

    again = threading.Event()  # registered anew: the restart was recovered from

    def told(old: State, new: State, status: Status) -> None:
        say(f"state {old.value} -> {new.value}")
        if new is State.REGISTERED and status.registrations >= 2:
            again.set()

    reg.add_listener(told)
    health = start_health_server(reg, "127.0.0.1", 0)
    try:
        say(f"bootstrap server {server.url} is not up yet; health on {health.url}")
        say.expect_readyz(health.url, 503, "before registration")
        reg.start()
        time.sleep(2.5)  # the startup race: the server comes up after the registrar
        server.start()
        up_at = say.elapsed()
        say("bootstrap server is up (empty)")
        if not reg.wait_for(State.REGISTERED, timeout=15):
            return say.finish("never registered after the server came up")
        registered_in = say.elapsed() - up_at
        say.expect_readyz(health.url, 200, "once registered")
        time.sleep(1.5)
        say(
            f"the route is {reg.status().route or 'not checked yet'}; restarting the bootstrap "
            "server, down for 1.0 s: it forgets every route"
        )
        first_lifetime = server.registered_count
        server.restart(down_for=1.0)
        back_at = say.elapsed()
        say("bootstrap server is back (empty)")
        if not again.wait(15):
            return say.finish("the route was not registered again after the restart")
        recovered_in = say.elapsed() - back_at
        say.expect_readyz(health.url, 200, "after recovery")
        status = reg.status()
        puts = first_lifetime + server.registered_count
        say(
            f"summary: {status.attempts_total} registration attempts, "
            f"registered {registered_in:.2f} s after the server came up, "
            f"recovered {recovered_in:.2f} s after it came back, "
            f"{status.reregistrations} re-registration, {puts} accepted PUTs "
            f"(one per server lifetime)"
        )
        return say.finish(f"{puts} accepted PUTs, expected exactly 2" if puts != 2 else None)
    finally:
        reg.stop()
        health.stop()
        server.close()
        log.removeHandler(say)
        for lg, level in saved:
            lg.setLevel(level)
