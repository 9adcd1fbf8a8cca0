"""The scenarios with registrar's plugin in every SGLang process (docs/e2e.md)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.scenarios import bootstrap_restart, cache_moved, prefill_relaunch, race, run
from e2e_support.stack import Stack

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The deployment with registrar, its bootstrap server held; a single reference server
    starts beside it for scenario 5."""
    made = Stack(registrar=True, model=model, logs=tmp_path_factory.mktemp("with-registrar"))
    try:
        made.start(hold=True, single=True)
        yield made
    finally:
        made.stop()


def test_1_the_race_is_served_once_the_bootstrap_server_listens(stack: Stack, results: Any) -> None:
    run(results, "1", True, race, stack)


def test_5_the_cache_really_moved(stack: Stack, results: Any) -> None:
    single = stack.single
    assert single is not None
    try:
        run(results, "5", True, cache_moved, stack, single.url)
    finally:
        single.stop()


def test_2_a_restarted_bootstrap_server_is_registered_with(stack: Stack, results: Any) -> None:
    run(results, "2", True, bootstrap_restart, stack)


def test_3_a_relaunched_prefill_is_served_again(stack: Stack, results: Any) -> None:
    run(results, "3", True, prefill_relaunch, stack)
