"""The same scenarios in stock SGLang: registrar's plugin filtered out by `SGLANG_PLUGINS`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.scenarios import bootstrap_restart, prefill_relaunch, race
from e2e_support.stack import Record, Stack, record_dict

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def stack(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    made = Stack(registrar=False, model=model, logs=tmp_path_factory.mktemp("without-registrar"))
    try:
        made.start(hold=True)
        yield made
    finally:
        made.stop()


def run(results: list[dict[str, Any]], name: str, step: Any, *args: Any) -> None:
    record = Record(name, registrar=False)
    try:
        step(*args, record)
    finally:
        results.append(record_dict(record))


def test_1_the_race_leaves_every_request_failing(stack: Stack, results: Any) -> None:
    run(results, "1", race, stack)


def test_2_a_restarted_bootstrap_server_stays_empty(stack: Stack, results: Any) -> None:
    run(results, "2", bootstrap_restart, stack)


def test_3_a_relaunched_prefill(stack: Stack, results: Any) -> None:
    run(results, "3", prefill_relaunch, stack)
