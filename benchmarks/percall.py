"""CPU per request on one kept-alive connection, client by client:
`python -m benchmarks.percall [--kind sglang|reference] [--requests N] [--release-python PY]
[--sglang-python PY]`.

One server process (`benchmarks.server`); each client runs in a process of its own and sends
N requests in turn (a PUT of a rank's payload, then a GET of its route, as a registration
does) on one connection, and reports its process CPU time per request: the registrar's
transport (this checkout, and the release's under `--release-python`), a `requests` session,
urllib3's pool, urllib3's bare connection and the standard library's `http.client`. The
client process's CPU includes every thread it runs (the registrar's deadline thread too).
Run as a script (`percall.py --client WHO URL N`) it is one client.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROUTE = {"prefill_dp_rank": 0, "prefill_cp_rank": 0, "target_tp_rank": 0, "target_pp_rank": 0}
CLIENTS = ("transport", "requests", "urllib3-pool", "urllib3-conn", "http.client")


def _client(who: str, url: str, n: int) -> dict[str, Any]:
    """N requests through `who`; CPU seconds per request (process), and the statuses seen."""
    # Run as a script, this folder is on the path: rank 0 of 1, as the fleet sends it.
    from fleet import payload  # noqa: PLC0415

    send = _sender(who, url, payload(0, 1))
    for _ in range(20):  # warm up: imports, the connection, caches
        send(0)
    statuses: dict[str, int] = {}
    started, wall = time.process_time(), time.monotonic()
    for i in range(n):
        code = str(send(i))
        statuses[code] = statuses.get(code, 0) + 1
    cpu = time.process_time() - started
    return {
        "cpu_us": 1e6 * cpu / n,
        "wall_us": 1e6 * (time.monotonic() - wall) / n,
        "statuses": statuses,
    }


def _sender(who: str, url: str, sent: dict[str, Any]) -> Any:
    body = json.dumps(sent).encode()
    query = "&".join(f"{k}={v}" for k, v in ROUTE.items())
    headers = {"Content-Type": "application/json"}
    host, port = url.removeprefix("http://").split(":")
    if who == "transport":
        from registrar import HttpSettings, HttpTransport  # noqa: PLC0415
        from registrar.protocols._httpvalues import with_query  # noqa: PLC0415

        transport = HttpTransport(HttpSettings(url, timeout=5.0))

        def send(i: int) -> int:
            if i % 2:
                return transport.send("GET", with_query("/route", ROUTE)).status_code or 0
            return transport.send("PUT", "/route", json=sent).status_code or 0

        return send
    if who == "requests":
        import requests  # noqa: PLC0415

        session = requests.Session()

        def send_requests(i: int) -> int:
            if i % 2:
                return session.get(f"{url}/route", params=ROUTE, timeout=5).status_code
            return session.put(f"{url}/route", data=body, headers=headers, timeout=5).status_code

        return send_requests
    if who == "urllib3-pool":
        import urllib3  # noqa: PLC0415

        pool = urllib3.HTTPConnectionPool(host, int(port), maxsize=1, timeout=5.0, retries=False)

        def send_pool(i: int) -> int:
            if i % 2:
                return pool.request("GET", f"/route?{query}").status
            return pool.request("PUT", "/route", body=body, headers=headers).status

        return send_pool
    if who == "urllib3-conn":
        from urllib3.connection import HTTPConnection  # noqa: PLC0415

        conn = HTTPConnection(host, int(port), timeout=5.0)

        def send_conn(i: int) -> int:
            if i % 2:
                conn.request("GET", f"/route?{query}", preload_content=False)
            else:
                conn.request("PUT", "/route", body=body, headers=headers, preload_content=False)
            response = conn.getresponse()
            response.read(65536)
            response.close()
            return response.status

        return send_conn
    import http.client  # noqa: PLC0415

    plain = http.client.HTTPConnection(host, int(port), timeout=5.0)

    def send_plain(i: int) -> int:
        if i % 2:
            plain.request("GET", f"/route?{query}")
        else:
            plain.request("PUT", "/route", body=body, headers=headers)
        response = plain.getresponse()
        response.read(65536)
        return response.status

    return send_plain


def _run(python: str, who: str, url: str, n: int) -> dict[str, Any]:
    out = subprocess.run(
        [python, str(Path(__file__).resolve()), "--client", who, url, str(n)],
        capture_output=True,
        text=True,
        check=True,
        cwd=tempfile.gettempdir(),  # import registrar from the interpreter, not this tree
    )
    return dict(json.loads(out.stdout))


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--client":
        who, url, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
        print(json.dumps(_client(who, url, n)))
        return 0
    from . import race  # noqa: PLC0415

    parser = argparse.ArgumentParser(prog="python -m benchmarks.percall")
    parser.add_argument("--kind", choices=("sglang", "reference"), default="sglang")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--release-python")
    parser.add_argument("--sglang-python")
    args = parser.parse_args()
    if args.sglang_python:
        race.SERVER_PYTHON["sglang"] = args.sglang_python
    runs: list[tuple[str, str]] = [(c, sys.executable) for c in CLIENTS]
    if args.release_python:
        runs.insert(1, ("transport (release)", args.release_python))
    figures: dict[str, list[float]] = {label: [] for label, _ in runs}
    with race.network(isolate=False) as net:
        port = race._port()
        server = race.ServerProc(args.kind, port, net)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(args.rounds):  # interleaved, so load drifts hit every client alike
                for label, python in runs:
                    who = label.split(" ")[0]
                    figures[label].append(_run(python, who, url, args.requests)["cpu_us"])
        finally:
            server.stop()
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.kind} server")
    print("| client | CPU per request (µs), median of rounds | rounds |")
    print("|---|---|---|")
    for label, values in figures.items():
        runs_text = ", ".join(f"{v:.0f}" for v in values)
        print(f"| {label} | {sorted(values)[len(values) // 2]:.0f} | {runs_text} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
