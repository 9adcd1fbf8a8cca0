"""The same scenarios in stock SGLang: registrar's plugin filtered out by `SGLANG_PLUGINS`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.scenarios import bootstrap_restart, prefill_relaunch, race, run
from e2e_support.stack import Stack

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    made = Stack(registrar=False, model=model, logs=tmp_path_factory.mktemp("without-registrar"))
    try:
        made.start(hold=True)
        yield made
    finally:
        made.stop()


def test_1_the_race_leaves_every_request_failing(stack: Stack, results: Any) -> None:
    run(results, "1", False, race, stack)


def test_2_a_restarted_bootstrap_server_stays_empty(stack: Stack, results: Any) -> None:
    run(results, "2", False, bootstrap_restart, stack)


def test_3_a_relaunched_prefill(stack: Stack, results: Any) -> None:
    run(results, "3", False, prefill_relaunch, stack)
