from __future__ import annotations

from collections.abc import Iterator

import pytest
from support import FakeClock

from registrar.bootstrap_server import BootstrapServer


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
