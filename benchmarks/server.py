"""A bootstrap server in a process of its own, for the benchmarks: SGLang's real one or the
project's reference server (in the tests' lab, tests/bootstrap_lab.py), recording every request.

`python -m benchmarks.server KIND HOST PORT RECORDS` (KIND: `sglang` or `reference`) prints
`{"up": monotonic, "pid": pid}` once it listens; on SIGTERM it writes the requests it served to
RECORDS as JSON ([monotonic time, method, rank, status], rank = attn_tp_rank) and exits, which
closes every connection as a crash or restart of the real process does.

SGLang's server (sglang 0.5.23, `CommonKVBootstrapServer` in
`sglang/srt/disaggregation/common/conn.py`) needs only aiohttp and the standard library, but its
module imports torch.distributed, zmq, numpy and most of SGLang at the top, and importing the
`sglang` package runs patches that pull torch. `load_sglang_server()` therefore finds conn.py
without importing the package, parses it, and executes only the three class definitions the
server uses (`PrefillServerInfo`, `PrefillRankInfo`, `CommonKVBootstrapServer`), unchanged, in a
module that supplies their imports (aiohttp's `web`, asyncio, dataclasses, ...; the abstract
base class becomes `object`, `envs` one setting with SGLang's default). Install it with
`pip install --no-deps sglang==0.5.23 aiohttp`, or pass the environment that
scripts/sglang-venv.sh builds (`--sglang-python`).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import types
import typing
from pathlib import Path
from typing import Any

SGLANG_CLASSES = ("PrefillServerInfo", "PrefillRankInfo", "CommonKVBootstrapServer")


def sglang_conn_path() -> Path | None:
    """Where SGLang's conn.py is, without importing sglang; None when it is not installed."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "srt" / "disaggregation" / "common" / "conn.py"
    return path if path.is_file() else None


def sglang_available(python: str = sys.executable) -> str | None:
    """None when SGLang's server can run under `python`, else why not."""
    probe = (
        "import importlib.util as u, sys; sys.path.insert(0, sys.argv[1]); "
        "from benchmarks.server import sglang_conn_path as p; "
        "print('' if p() and u.find_spec('aiohttp') else 'missing')"
    )
    root = str(Path(__file__).resolve().parent.parent)
    try:
        found = subprocess.run(
            [python, "-c", probe, root], capture_output=True, text=True, timeout=60, check=False
        ).stdout.strip()
    except OSError as exc:
        return f"{python} cannot run: {exc}"
    if found:
        return (
            f"sglang 0.5.23 and aiohttp are not both installed for {python} "
            "(pass --sglang-python, e.g. the environment scripts/sglang-venv.sh builds)"
        )
    return None


class _Setting:
    def __init__(self, value: int) -> None:
        self.value = value

    def get(self) -> int:
        return self.value


class _Envs:
    SGLANG_DISAGGREGATION_BOOTSTRAP_ENTRY_CLEANUP_INTERVAL = _Setting(120)


def load_sglang_server() -> type:
    """SGLang's `CommonKVBootstrapServer` class, executed from its own source without torch."""
    from aiohttp import web  # noqa: PLC0415 - optional: only this server needs it

    path = sglang_conn_path()
    if path is None:
        raise ImportError("sglang is not installed: pip install --no-deps sglang==0.5.23")
    tree = ast.parse(path.read_text(), str(path))
    body: list[ast.stmt] = [
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name in SGLANG_CLASSES
    ]
    missing = set(SGLANG_CLASSES) - {node.name for node in body if isinstance(node, ast.ClassDef)}
    if missing:
        raise ImportError(f"{path} has no {sorted(missing)}: not the sglang 0.5.23 layout")
    future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
    module = types.ModuleType("sglang_bootstrap_server", f"SGLang's server classes from {path}")
    module.__file__ = str(path)
    sys.modules[module.__name__] = module  # dataclasses look their module up
    namespace = module.__dict__
    namespace.update(
        {
            "asyncio": asyncio,
            "dataclasses": dataclasses,
            "logging": logging,
            "threading": threading,
            "time": time,
            "web": web,
            "logger": logging.getLogger(module.__name__),
            "BaseKVBootstrapServer": object,
            "KVPoll": object,
            "envs": _Envs(),
        }
    )
    for name in ("Dict", "List", "Literal", "NamedTuple", "Optional", "Set", "Tuple", "Union"):
        namespace[name] = getattr(typing, name)
    code = compile(ast.Module(body=[*future, *body], type_ignores=[]), str(path), "exec")
    exec(code, namespace)
    server: type = namespace["CommonKVBootstrapServer"]
    return server


Record = tuple[float, str, Any, int]


def _run_sglang(host: str, port: int, records: list[Record]) -> None:
    from aiohttp import web  # noqa: PLC0415

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        rank = None
        if request.method == "PUT":
            with contextlib.suppress(ValueError):
                rank = (await request.json()).get("attn_tp_rank")
        else:
            rank = request.query.get("target_tp_rank")
        response: web.StreamResponse = await handler(request)
        records.append((time.monotonic(), request.method, rank, response.status))
        return response

    base = load_sglang_server()

    class Recorded(base):  # type: ignore[valid-type, misc]
        def _setup_routes(self) -> None:
            self.app.middlewares.append(record)
            super()._setup_routes()

    server = Recorded(host, port)
    # SGLang's server thread logs a failed bind (logging is off here) and ends: exit then, so
    # the benchmark reads "did not start" instead of waiting for a server that never listens.
    deadline = time.monotonic() + 60
    while not getattr(server, "_runner", None) or not server._runner.addresses:
        if not server.thread.is_alive() or time.monotonic() > deadline:
            sys.exit(f"SGLang's bootstrap server did not listen on {host}:{port}")
        time.sleep(0.0005)


def _run_reference(host: str, port: int, records: list[Record]) -> Any:
    from tests.bootstrap_lab import BootstrapLab  # noqa: PLC0415

    server = BootstrapLab(host, port).start()
    offset = time.time() - time.monotonic()

    def collect() -> None:
        for r in server.records():
            rank: Any = r.query.get("target_tp_rank")
            if r.method == "PUT":
                try:
                    rank = json.loads(r.body).get("attn_tp_rank")
                except ValueError:
                    rank = None
            records.append((r.at - offset, r.method, rank, r.status or 0))

    return collect


def main() -> int:
    kind, host, port, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    logging.disable(logging.CRITICAL)
    records: list[Record] = []
    collect = None

    def dump(*_: object) -> None:
        if collect is not None:
            collect()
        Path(out).write_text(json.dumps(records))
        os._exit(0)

    signal.signal(signal.SIGTERM, dump)
    if kind == "sglang":
        _run_sglang(host, port, records)
    else:
        collect = _run_reference(host, port, records)
    print(json.dumps({"up": time.monotonic(), "pid": os.getpid()}), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    raise SystemExit(main())
