from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _pytest.terminal import TerminalReporter
from bootstrap_lab import BootstrapLab
from support import CLI_ENV, FakeClock, Ports

from registrar.core import _registry as registry
from registrar.core._runner import UNEXPECTED


class _Unexpected(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, UNEXPECTED, False):
            self.records.append(record)


@pytest.fixture(autouse=True)
def _no_unexpected_transport_errors(request: pytest.FixtureRequest) -> Iterator[None]:
    """The loop turns an exception a transport raises into a failed attempt, so production
    keeps running; a test must not keep running past one: it fails here unless it is marked
    `unexpected_errors` (it makes a transport raise on purpose)."""
    handler = _Unexpected()
    logger = logging.getLogger("registrar")
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    if handler.records and request.node.get_closest_marker("unexpected_errors") is None:
        first = handler.records[0]
        pytest.fail(f"a transport raised: {first.getMessage()}\n{first.exc_text or ''}")


@pytest.fixture(autouse=True)
def _protocols_registered_by_a_test_end_with_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`register_protocol` fills a process-wide table: a protocol one test registers must not
    show in the next test's "protocol must be one of ..." (xdist runs tests in any order)."""
    monkeypatch.setattr(registry, "_factories", dict(registry._factories))


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def ports() -> Iterator[Ports]:
    """Ports for this test: reserved sockets (refused connects, a server's later port) and
    numbers for other processes; the reservations end with the test."""
    held = Ports()
    try:
        yield held
    finally:
        held.close()


@pytest.fixture
def server() -> Iterator[BootstrapLab]:
    """A running reference bootstrap server on an ephemeral loopback port."""
    srv = BootstrapLab("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.close()


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[BootstrapLab]:
    """A reference bootstrap server speaking TLS (a self-signed certificate for 127.0.0.1)."""
    from test_security import _self_signed  # noqa: PLC0415 - the project's one certificate maker

    assert shutil.which("openssl"), "the TLS tests need the openssl command"
    cert, key = _self_signed(tmp_path)
    with BootstrapLab(certfile=cert, keyfile=key) as srv:
        yield srv


@pytest.fixture
def spawn() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start `registrar ...` in the background (`env=` adds variables); every process is ended
    by its PID."""
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            [sys.executable, "-m", "registrar", *args],
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**CLI_ENV, **(env or {})},
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


@pytest.fixture
def registrars() -> Iterator[list]:
    """Registrars a test adds here are stopped at its end, whatever happens."""
    made: list = []
    yield made
    for reg in made:
        reg.stop(timeout=5)


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """Print the figures tests recorded (e.g. the chaos soak's), also from xdist workers."""
    for report in terminalreporter.stats.get("passed", []):
        for name, value in getattr(report, "user_properties", []):
            if name == "figures":
                terminalreporter.write_line(str(value))
