"""The real-SGLang suite: SGLang's own classes on CPU (each release of the CI matrix, 0.5.13 to
0.5.23: sglang_support/release.py holds where they differ), in the environment that
scripts/sglang-venv.sh builds. Where SGLang is not installed (the core suite's environment) every
test here is skipped with the reason; with REGISTRAR_SGLANG_REQUIRED=1 (as .ci/run sets it) a
missing SGLang is an error instead, so CI cannot pass by skipping them.

Every rank runs in a process of its own, as SGLang runs its schedulers, forked from one process
that imported torch and SGLang once (sglang_support/zygote.py); the bootstrap server is SGLang's
`CommonKVBootstrapServer`, in this process, started and closed by the tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registrar.integrations.sglang._reach import REACH

HERE = Path(__file__).resolve().parent
REQUIRED = os.environ.get("REGISTRAR_SGLANG_REQUIRED") == "1"
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
SKIP_REASON = (
    "SGLang is not installed in this environment: run this suite in the one that "
    "scripts/sglang-venv.sh builds (see README, 'The real-SGLang suite')"
)


MATRIX_ENDS = ("0.5.13", "0.5.23")
"""The oldest and newest release of the CI matrix (.ci/run's RELEASES): a test marked
`same_on_every_release` runs there only (docs/testing.md, "The SGLang matrix", says which)."""


def _installed_release() -> str:
    from importlib.metadata import version

    return version("sglang")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [item for item in items if HERE in Path(str(item.fspath)).parents]
    if HAVE_SGLANG:
        release = _installed_release()
        if release in MATRIX_ENDS:
            return
        # Skipped by name, never deselected: the run's summary counts them on every release.
        reason = (
            f"its subject is the same on every SGLang release: it runs on the matrix's ends "
            f"({' and '.join(MATRIX_ENDS)}), not on {release} (docs/testing.md)"
        )
        for item in mine:
            if item.get_closest_marker("same_on_every_release"):
                item.add_marker(pytest.mark.skip(reason=reason))
        return
    if mine and REQUIRED:
        raise pytest.UsageError(f"REGISTRAR_SGLANG_REQUIRED=1 but {SKIP_REASON}")
    for item in mine:
        item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


sys.path.insert(0, str(HERE))
if HAVE_SGLANG:
    from sglang_support.standin import install

    install()

from sglang_support.harness import Rank, Server, child_env  # noqa: E402
from sglang_support.zygote import Zygote  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config-only model folder: all ServerArgs reads of a model on this path."""
    folder = tmp_path_factory.mktemp("model")
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 1000,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "float32",
        "tie_word_embeddings": False,
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="session")
def zygote() -> Iterator[Zygote]:
    """The process ranks are forked from (sglang_support/zygote.py: SGLang imported once a
    session, not once a rank); ended by its PID with the session."""
    made = Zygote(child_env(), HERE)
    try:
        yield made
    finally:
        made.stop()


@pytest.fixture
def spawn_rank(model_dir: Path, tmp_path: Path, zygote: Zygote) -> Iterator[Any]:
    """Start rank processes, forked from the zygote; every one is ended when the test ends (by
    its own PID)."""
    started: list[Rank] = []

    def spawn(
        bootstrap_port: int,
        *,
        rank: int = 0,
        tp_size: int = 1,
        dp_attention: int = 0,
        plugin: bool = True,
        **env: str,
    ) -> Rank:
        """`dp_attention` D > 0: TP rank `rank` of `--tp tp_size --dp D --enable-dp-attention`."""
        extra = {"REGISTRAR_WATCH_INTERVAL": "0.5", **env}
        if not plugin:
            extra["SGLANG_PLUGINS"] = "none-but-registrar-absent"
        log = tmp_path / f"rank{rank}-{len(started)}.log"
        argv = ["-m", "sglang_support.rank", "--bootstrap-port", str(bootstrap_port)]
        argv += ["--tp-size", str(tp_size)]
        argv += ["--rank", str(rank), "--model", str(model_dir)]
        if dp_attention:
            argv += ["--dp-size", str(dp_attention), "--enable-dp-attention"]
        with log.open("w") as err:
            proc = zygote.spawn(argv, child_env(**extra), HERE, err)
        handle = Rank(proc, log)
        started.append(handle)
        return handle

    try:
        yield spawn
    finally:
        for handle in started:
            handle.stop()


@pytest.fixture
def bootstrap() -> Iterator[Any]:
    """Make real bootstrap servers (not started); each is closed when the test ends."""
    made: list[Server] = []

    def make(port: int) -> Server:
        server = Server(port)
        made.append(server)
        return server

    try:
        yield make
    finally:
        for server in made:
            server.close()


@pytest.fixture(autouse=True)
def _reach_stopped() -> Iterator[None]:
    """The plugin's look at node 0's rows (a thread it starts at the first readiness or
    `/server_info` question in a process) ends with the test that started it: else it goes on
    looking at a server the test has closed, through the tests after it."""
    yield
    REACH.stop()
