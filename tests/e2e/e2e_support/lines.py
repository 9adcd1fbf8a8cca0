"""What docs/sglang.md tells an operator to find in a server's own log ("Is it active?"), read
from the log file the suite captures for each launch: one active line per process that loaded
the plugin (the main process and each `sglang::` child whose function loads plugins: the
schedulers, and from 0.5.22 the detokenizer and DP controller), none in stock SGLang, and a
prefill's "registering rank" line per row."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from registrar.integrations.sglang._probe import SourceProbe, sglang_root

from .deploy import Process

__all__ = ["assert_plugin_lines"]

ACTIVE = re.compile(r"sglang-registrar \S+ active in sglang \S+ \(pid (\d+)\)")
REGISTERING = re.compile(r"registering rank \{[^}]*\} with http://\S+ in the background")


_MANAGERS = "sglang.srt.managers"
_RUNS = {  # what SGLang runs in a child of that title
    "sglang::scheduler": f"{_MANAGERS}.scheduler.run_scheduler_process",
    "sglang::detokenizer": f"{_MANAGERS}.detokenizer_manager.run_detokenizer_process",
    "sglang::data_parallel_controller": (
        f"{_MANAGERS}.data_parallel_controller.run_data_parallel_controller_process"
    ),
}


def plugin_processes(server: Process) -> set[int]:
    """The server's processes that load plugins: its main process and each SGLang child whose
    function calls `load_plugins()` in this release, read from its source (the detokenizer does
    from 0.5.22); not, say, multiprocessing's resource tracker."""
    import psutil  # SGLang's environment has it, the core one need not

    main = psutil.Process(server.proc.pid)
    return {main.pid} | {c.pid for c in main.children(recursive=True) if _loads(_title(c))}


def _title(child: Any) -> str:
    try:
        return " ".join(child.cmdline())
    except Exception:  # psutil.Error: gone meanwhile, or not ours to read
        return ""


def _loads(title: str) -> bool:
    run = next((f for t, f in _RUNS.items() if title.startswith(t)), None)
    if run is None:
        return title.startswith("sglang::")  # a child not in the table: taken to load them
    root = sglang_root()
    source = SourceProbe(root).source(run) if root is not None else None
    return source is not None and "load_plugins()" in source


def assert_plugin_lines(server: Process, *, plugin: bool, rows: int = 0) -> None:
    """Exactly one active line per process that loaded the plugin (none without it); a prefill
    with the plugin: `rows` "registering rank" lines. Call once the server answers /health."""
    text = server.text()
    seen = Counter(int(pid) for pid in ACTIVE.findall(text))
    expected = plugin_processes(server) if plugin else set()
    assert seen == Counter(expected), (
        f"{server.name}: active lines per pid {dict(seen)}, processes {sorted(expected)}:\n"
        + "\n".join(line for line in text.splitlines() if "sglang-registrar" in line)
    )
    if plugin:
        assert len(REGISTERING.findall(text)) == rows, f"{server.name}:\n{server.tail()}"
