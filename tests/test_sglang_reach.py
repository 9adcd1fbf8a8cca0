"""Node 0's readiness also asks whether every row still answers at its registered address
(`registrar/integrations/sglang/_reach.py`): real sockets on 127.0.0.1, one listening and one
that nothing listens on, and the table as SGLang's bootstrap server holds it."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from registrar.integrations.sglang._reach import INTERVAL, REACH, Reach
from registrar.integrations.sglang._tables import _table_ready, bootstrap_summary

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as sock:
        yield sock


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on (bound once, then closed: a connect is refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.fixture(autouse=True)
def _stop_reach() -> Iterator[None]:
    yield
    REACH.stop()


def _server(rows: dict[int, int]) -> SimpleNamespace:
    """A TP `len(rows)` table, tp -> the port its rank registered (SGLang keeps an object with
    `rank_ip` and `rank_port` per row)."""
    rank = {tp: {0: SimpleNamespace(rank_ip="127.0.0.1", rank_port=p)} for tp, p in rows.items()}
    table = {0: {0: rank}}
    return SimpleNamespace(
        dp_size=1,
        attn_cp_size=1,
        attn_tp_size=len(rows),
        pp_size=1,
        prefill_port_table=table,
        _registered_count=len(rows),
    )


def test_a_row_that_does_not_answer_is_named_and_logged_once(
    listening: socket.socket, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = _server({0: listening.getsockname()[1], 1: closed_port})
    reach = Reach(patience=1.0)
    assert reach.silent(server) == {}  # nothing looked at yet
    reach.stop()
    reach._server = server
    with caplog.at_level(logging.INFO, "registrar.integrations.sglang.reach"):
        reach.look()
        reach.look()
    assert list(reach._silent) == [(0, 0, 1, 0)]
    assert "refused" in reach._silent[(0, 0, 1, 0)].lower()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"sglang-registrar: rank dp 0 cp 0 tp 1 pp 0 at 127.0.0.1:{closed_port} does not answer "
        f"({reach._silent[(0, 0, 1, 0)]}); /ready is false until it does"
    ]


def test_a_row_that_answers_again_is_logged_and_cleared(
    listening: socket.socket, closed_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    server = _server({0: closed_port})
    reach = Reach()
    reach._server = server
    reach.look()
    assert list(reach._silent) == [(0, 0, 0, 0)]
    server.prefill_port_table[0][0][0][0].rank_port = listening.getsockname()[1]
    caplog.clear()
    with caplog.at_level(logging.INFO, "registrar.integrations.sglang.reach"):
        reach.look()
    assert reach._silent == {}
    port = listening.getsockname()[1]
    assert caplog.messages == [
        f"sglang-registrar: rank dp 0 cp 0 tp 0 pp 0 at 127.0.0.1:{port} answers again"
    ]


def test_ready_waits_for_every_row_to_answer_and_the_summary_names_it(
    listening: socket.socket, closed_port: int
) -> None:
    server = _server({0: listening.getsockname()[1], 1: closed_port})
    manager = SimpleNamespace(bootstrap_server=server)
    assert _table_ready(manager)  # complete, and no look yet: nothing known to be silent
    REACH.interval = 0.05
    try:
        deadline = time.monotonic() + 10
        while _table_ready(manager) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _table_ready(manager)
        silent = bootstrap_summary(server)["silent_rows"]
        assert [(r["tp"], "refused" in r["error"].lower()) for r in silent] == [(1, True)]
        assert bootstrap_summary(server)["complete"]  # every row is in: it does not answer
        server.prefill_port_table[0][0][1][0].rank_port = listening.getsockname()[1]
        while not _table_ready(manager) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _table_ready(manager)
    finally:
        REACH.interval = INTERVAL


def test_a_new_bootstrap_server_starts_with_nothing_silent(closed_port: int) -> None:
    old, new = _server({0: closed_port}), _server({0: closed_port})
    reach = Reach()
    reach._server = old
    reach.look()
    assert reach.silent(old)
    assert reach.silent(new) == {}  # the restarted server's rows are looked at anew
    reach.stop()


def test_not_node_0_is_ready_without_a_look() -> None:
    assert _table_ready(SimpleNamespace(bootstrap_server=None))
    assert REACH._thread is None


def test_a_look_that_raises_is_logged_once_and_the_looks_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reach = Reach(interval=0.01)
    looks: list[int] = []

    def broken() -> None:
        looks.append(1)
        raise RuntimeError("a bug in a look")

    reach.look = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.ERROR, "registrar.integrations.sglang.reach"):
        reach.silent(SimpleNamespace())
        deadline = time.monotonic() + 10
        while len(looks) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        reach.stop()
    assert len(looks) >= 3  # the thread lived on after the first failure
    assert caplog.messages == ["sglang-registrar: a look at the rows failed"]
