"""A stand-in for SGLang's launcher as a scheduler's parent: it starts one rank process
(sglang_support.rank) and records the SIGQUIT a failing scheduler sends its parent
(`run_scheduler_process`), where SGLang's handler would take the whole server down.

    python -m sglang_support.parent --bootstrap-port P --model DIR

Prints `{"event": "sigquit"}` when signalled and `{"event": "child_exit", "code": N}` at the end.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from types import FrameType


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-port", required=True)
    parser.add_argument("--model", required=True)
    opts = parser.parse_args()

    def on_sigquit(signum: int, frame: FrameType | None) -> None:
        print(json.dumps({"event": "sigquit"}), flush=True)

    signal.signal(signal.SIGQUIT, on_sigquit)
    cmd = [sys.executable, "-m", "sglang_support.rank", "--bootstrap-port", opts.bootstrap_port]
    child = subprocess.Popen(
        [*cmd, "--model", opts.model], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL
    )
    try:
        code = child.wait(180)
    except subprocess.TimeoutExpired:
        child.kill()
        code = child.wait()
    print(json.dumps({"event": "child_exit", "code": code}), flush=True)


if __name__ == "__main__":
    main()
