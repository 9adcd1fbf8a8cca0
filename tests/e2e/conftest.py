"""The end-to-end suite: real SGLang 0.5.23 prefill and decode servers on CPU, Mooncake moving the
KV cache over TCP, the `smg` router in front, with and without registrar's plugin (marker `e2e`).

It runs in the environment scripts/sglang-venv.sh builds. Where a piece is missing (SGLang,
Mooncake, smg, the system's libibverbs) every test here is skipped with the reason; with
REGISTRAR_E2E_REQUIRED=1 (as .ci/run sets it) a missing piece is an error instead.

Each scenario's measurements go to `$REGISTRAR_E2E_OUT/results-<worker>.json` (default: a
folder in the temporary directory) for tests/e2e/report.py, which draws docs/e2e.md's picture.
"""

from __future__ import annotations

import ctypes.util
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
REQUIRED = os.environ.get("REGISTRAR_E2E_REQUIRED") == "1"
OUT = Path(os.environ.get("REGISTRAR_E2E_OUT") or Path(tempfile.gettempdir()) / "registrar-e2e")


def _missing() -> list[str]:
    missing = [
        f"the Python package {name}"
        for name in ("sglang", "mooncake", "transformers", "matplotlib")
        if importlib.util.find_spec(name) is None
    ]
    if shutil.which("smg", path=str(Path(sys.executable).parent)) is None:
        missing.append("the smg router beside this interpreter")
    if ctypes.util.find_library("ibverbs") is None:
        missing.append("the system library libibverbs1 (apt-get install libibverbs1)")
    return missing


MISSING = _missing()
SKIP_REASON = (
    f"missing {', '.join(MISSING)}: run this suite in the environment that "
    "scripts/sglang-venv.sh builds (see docs/e2e.md)"
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.fspath)).parents]
    for item in mine:
        item.add_marker(pytest.mark.e2e)
    if not MISSING or not mine:
        return
    if REQUIRED:
        raise pytest.UsageError(f"REGISTRAR_E2E_REQUIRED=1 but {SKIP_REASON}")
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The random 2-layer Llama and its tokenizer, made once per session (seconds)."""
    from e2e_support.model import make_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch and transformers warn about CPU-only features
        return make_model(tmp_path_factory.mktemp("model"))


@pytest.fixture
def deploy(model: Path, tmp_path: Path) -> Iterator[Any]:
    """A `Deployment` of servers and routers started one by one; all stopped after the test."""
    from e2e_support.deploy import Deployment

    made = Deployment(model, tmp_path)
    try:
        yield made
    finally:
        made.stop_all()


@pytest.fixture(scope="session")
def results(worker_id: str) -> Iterator[list[dict[str, Any]]]:
    """Scenario records of this worker, written out when the session ends."""
    records: list[dict[str, Any]] = []
    yield records
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"results-{worker_id}.json").write_text(json.dumps(records, indent=1))
