"""`python -m benchmarks.burst [N] [KIND]`: how fast a bootstrap server takes new connections.

N connections (default 1000), each sending one route query and kept open, are opened at
uniform random moments within W seconds, for several W, from one thread of non-blocking
sockets; printed per W: the listen-queue overflows the server's namespace counted and the
answer latencies. This is the measurement behind `registrar.core._backoff.ACCEPT_RATE` and the
simulation's `ACCEPT_RATE_MEASURED` (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import random
import selectors
import socket
import subprocess
import sys
import time

from . import race

QUERY = (
    b"GET /route?prefill_dp_rank=0&prefill_cp_rank=0&target_tp_rank=0&target_pp_rank=0 "
    b"HTTP/1.1\r\nHost: bench\r\n\r\n"
)


def burst(port: int, n: int, within: float, seed: int = 7) -> dict[str, float]:
    rng = random.Random(seed)
    sel = selectors.DefaultSelector()
    start = time.monotonic() + 0.05
    times = sorted(start + rng.random() * within for _ in range(n))
    latencies: list[float] = []
    sockets: list[socket.socket] = []
    opened = pending = 0
    while opened < n or pending:
        now = time.monotonic()
        while opened < n and times[opened] <= now:
            sock = socket.socket()
            sock.setblocking(False)
            sock.connect_ex(("127.0.0.1", port))
            sel.register(sock, selectors.EVENT_WRITE, (times[opened], False))
            sockets.append(sock)
            opened += 1
            pending += 1
        timeout = max(0.0, times[opened] - now) if opened < n else 1.0
        for key, _ in sel.select(timeout):
            began, sent = key.data
            ready = key.fileobj
            assert isinstance(ready, socket.socket)
            if not sent:
                ready.send(QUERY)
                sel.modify(ready, selectors.EVENT_READ, (began, True))
            else:
                ready.recv(4096)
                latencies.append(time.monotonic() - began)
                sel.unregister(ready)
                pending -= 1
        if time.monotonic() > start + within + 15:
            break
    for sock in sockets:
        sock.close()
    latencies.sort()
    return {
        "within": within,
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[int(0.99 * len(latencies))],
        "answered": len(latencies),
    }


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    kind = sys.argv[2] if len(sys.argv) > 2 else "sglang"
    with race.network() as net:
        for within in (0.1, 0.25, 0.5, 1.0, 2.0):
            server = race.ServerProc(kind, 8998, net)
            before = net.overflows()
            # The client must run in the server's namespace: run this module there.
            out = subprocess.run(
                [*net.prefix(), sys.executable, "-c", _CLIENT, str(n), str(within)],
                capture_output=True,
                text=True,
                check=True,
                cwd=race.ROOT,
            ).stdout
            server.stop()
            figures = json.loads(out)
            figures["overflows"] = net.overflows() - before
            print(json.dumps({"n": n, "server": kind, **figures}), flush=True)
    return 0


_CLIENT = (
    "import json, sys; from benchmarks.burst import burst; "
    "print(json.dumps(burst(8998, int(sys.argv[1]), float(sys.argv[2]))))"
)


if __name__ == "__main__":
    raise SystemExit(main())
