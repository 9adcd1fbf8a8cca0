"""The topology scenarios (issue 36, docs/e2e.md "Topologies"): a TP 2 prefill and a TP 2
decode behind the router, stock SGLang and with registrar's plugin, one deployment each (the
stock one first, stopped before the other starts: one deployment at a time on two cores).

    -k stock        the scenarios on stock SGLang only
    -k registrar    with registrar only
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.scenarios import run
from e2e_support.stack import Stack
from e2e_support.topology import REFUSED_TP, tp_race, tp_relaunch

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", params=[False, True], ids=["stock", "registrar"])
def stack(
    request: pytest.FixtureRequest, model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The TP 2 prefill (its bootstrap server held, rank 1's PUTs refused until admitted) and
    the TP 2 decode, with or without registrar."""
    registrar: bool = request.param
    logs = tmp_path_factory.mktemp("tp2-registrar" if registrar else "tp2-stock")
    made = Stack(registrar=registrar, model=model, logs=logs, tp=2, decode_tp=2)
    try:
        made.start(hold=True, refuse_tp=REFUSED_TP)
        yield made
    finally:
        made.stop()


def test_t1_the_race_at_tp_2(stack: Stack, results: Any) -> None:
    run(results, "t1", stack.registrar, tp_race, stack)


def test_t2_a_tp_2_prefill_relaunched_under_a_tp_2_decode(stack: Stack, results: Any) -> None:
    run(results, "t2", stack.registrar, tp_relaunch, stack)
