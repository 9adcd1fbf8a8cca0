from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pytest.terminal import TerminalReporter
from support import FakeClock

from registrar.devtools.bootstrap_server import BootstrapServer


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def server() -> Iterator[BootstrapServer]:
    """A running reference bootstrap server on an ephemeral loopback port."""
    srv = BootstrapServer("127.0.0.1", 0).start()
    try:
        yield srv
    finally:
        srv.close()


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
