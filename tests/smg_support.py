"""The real smg gateway for the tests: the binary, and the lab (tests/gateway_lab.py).

`gateway_binary()` is $REGISTRAR_SMG_BINARY (set by .ci/run), else what scripts/smg-venv.sh
builds once per machine outside the repo. A missing gateway fails the gateway tests, never
skips them.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path
from typing import Any

import gateway_lab as lab
from gateway_lab import StandInWorker, workers
from support import process_port

__all__ = ["Gateway", "StandInWorker", "gateway_binary", "workers"]

REPO = Path(__file__).resolve().parent.parent
GATEWAY_ENV = "REGISTRAR_SMG_BINARY"

_binary: str | None = None
_binary_lock = threading.Lock()


def gateway_binary() -> str:
    """The smg executable: $REGISTRAR_SMG_BINARY, else the cached environment's (built by
    scripts/smg-venv.sh on first use; later calls return at once). Raises when neither works."""
    global _binary
    with _binary_lock:
        if _binary is None:
            path = os.environ.get(GATEWAY_ENV)
            if not path:
                done = subprocess.run(
                    [str(REPO / "scripts" / "smg-venv.sh")],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=600,
                )
                if done.returncode != 0:
                    raise RuntimeError(f"scripts/smg-venv.sh failed:\n{done.stderr[-2000:]}")
                path = done.stdout.strip()
            if not (os.path.isfile(path) and os.access(path, os.X_OK)):
                raise RuntimeError(f"no smg executable at {path!r} (scripts/smg-venv.sh)")
            _binary = path
        return _binary


class Gateway(lab.Gateway):
    """The lab's gateway, with the binary found above, on ports from this worker's block."""

    def __init__(self, log_dir: Path, **kw: Any) -> None:
        super().__init__(gateway_binary(), log_dir, ports=process_port, **kw)
