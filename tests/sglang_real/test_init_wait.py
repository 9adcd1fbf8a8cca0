"""REGISTRAR_INIT_WAIT: upstream's blocking first registration, for those who want it, bounded."""

from __future__ import annotations

import pytest
from sglang_support.harness import wait_for
from support import process_port

pytestmark = pytest.mark.timeout(300)


def test_init_waits_for_the_first_registration_when_asked(spawn_rank, bootstrap) -> None:
    port = process_port()
    server = bootstrap(port).start()
    rank = spawn_rank(port, REGISTRAR_INIT_WAIT="60")
    rank.event("init")
    [row] = rank.status()
    assert row["state"] == "registered"  # already when init returned
    assert server.count == 1


def test_the_wait_is_bounded_and_registration_goes_on(spawn_rank, bootstrap) -> None:
    port = process_port()
    rank = spawn_rank(port, REGISTRAR_INIT_WAIT="1")
    init = rank.event("init")
    assert init["seconds"] >= 1.0
    assert "not registered within REGISTRAR_INIT_WAIT=1 s" in rank.log.read_text()
    server = bootstrap(port).start()
    assert wait_for(lambda: server.count == 1)
