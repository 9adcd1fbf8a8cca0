"""`python -m benchmarks.gateway [--quick] [--out DIR] [--smg PATH] [--sizes 20,200]`: the smg
gateway protocol against the real gateway on 127.0.0.1 (docs/gateway.md has the figures).

For each fleet size N: N stand-in workers (in a child process, so their CPU is not counted),
the real gateway (its own defaults), and N registrars in this process with `smg_registrar`'s
defaults. The gateway is killed with SIGKILL and started again on the same port R times; for
each restart: the time from the gateway answering again to each worker listed ready (and to
all of them), the duplicate entries (URLs listed more than once), and the requests each
registrar sent during the gateway's lifetime. Then the idle CPU of the registrars over a quiet
window, and the drain: one registrar stopped alone, then the rest together. Not a test: it
asserts nothing, it reports.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from registrar import Registrar, State, smg_registrar
from registrar.protocols._smg.transport import SmgTransport
from tests.gateway_lab import Gateway, StandInWorker

REPO = Path(__file__).resolve().parent.parent


def _binary(given: str | None) -> str:
    if given:
        return given
    if os.environ.get("REGISTRAR_SMG_BINARY"):
        return os.environ["REGISTRAR_SMG_BINARY"]
    done = subprocess.run(
        [str(REPO / "scripts" / "smg-venv.sh")], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def serve_workers(count: int) -> None:
    """The child: `count` stand-in workers; prints their URLs, serves until stdin closes."""
    made = [StandInWorker("decode").start() for _ in range(count)]
    print(json.dumps([w.url for w in made]), flush=True)
    sys.stdin.read()
    for worker in made:
        worker.close()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _listed(gateway: Gateway) -> list[dict[str, Any]]:
    answer = requests.get(f"{gateway.url}/workers", timeout=10)
    workers: list[dict[str, Any]] = answer.json()["workers"]
    return workers


def _watch_listing(gateway: Gateway, urls: list[str], since: float, limit: float) -> dict[str, Any]:
    """Poll the list until every URL is listed ready: when each first was, and duplicates."""
    first: dict[str, float] = {}
    duplicates = 0
    deadline = time.monotonic() + limit
    wanted = set(urls)
    while time.monotonic() < deadline and len(first) < len(wanted):
        listed = _listed(gateway)
        now = time.monotonic()
        counts = collections.Counter(w["url"] for w in listed)
        duplicates = max(duplicates, sum(n - 1 for n in counts.values() if n > 1))
        for worker in listed:
            if worker.get("status") == "ready" and worker["url"] in wanted:
                first.setdefault(worker["url"], now - since)
        time.sleep(0.02)
    times = list(first.values())
    return {
        "listed": len(first),
        "all_listed_s": max(times) if len(first) == len(wanted) else None,
        "p50_s": _percentile(times, 0.5) if times else None,
        "p99_s": _percentile(times, 0.99) if times else None,
        "duplicates": duplicates,
    }


def _stop_all(regs: list[Registrar], timeout: float) -> None:
    """Ask all to stop at once (their drains overlap), then wait for them."""
    for reg in regs:
        reg.stop(timeout=0)
    deadline = time.monotonic() + timeout
    for reg in regs:
        reg.stop(timeout=max(0.0, deadline - time.monotonic()))


def _all_registered(regs: list[Registrar], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    return all(r.wait_for(State.REGISTERED, max(0.0, deadline - time.monotonic())) for r in regs)


def _requests(group: list[Registrar]) -> list[int]:
    counts = []
    for reg in group:
        transport = reg._transport  # the benchmark reads the transport's own counter
        assert isinstance(transport, SmgTransport)
        counts.append(transport.requests_sent)
    return counts


def _baseline(gateway: Gateway, urls: list[str]) -> dict[str, Any]:
    """The gateway's own pace: every worker POSTed at once by threads of one client (no
    registrar), to an empty gateway; the time until all are listed ready."""

    def post(url: str) -> None:
        requests.post(
            f"{gateway.url}/workers", json={"url": url, "worker_type": "decode"}, timeout=30
        )

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(post, urls))
    figures = _watch_listing(gateway, urls, started, 120)
    return figures


def run_size(binary: str, n: int, restarts: int, lifetime: float, idle: float) -> dict[str, Any]:
    logs = Path(tempfile.mkdtemp(prefix="smg-bench-"))
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gateway", "--serve-workers", str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert child.stdout is not None
    assert child.stdin is not None
    urls: list[str] = json.loads(child.stdout.readline())
    gateway = Gateway(binary, logs, health_interval=None)
    gateway.poll = 0.005
    group = [smg_registrar(gateway.url, url, "decode") for url in urls]
    out: dict[str, Any] = {"n": n, "restarts": []}
    try:
        gateway.start()
        out["baseline"] = _baseline(gateway, urls)
        gateway.kill()
        gateway.start()  # empty again
        for reg in group:
            reg.start()
        started = time.monotonic()
        out["first"] = _watch_listing(gateway, urls, started, 120)
        _all_registered(group, 60)
        for _ in range(restarts):
            time.sleep(lifetime)
            before = _requests(group)
            gateway.kill()  # SIGKILL
            time.sleep(0.5)  # down for half a second
            gateway.start()
            listening = time.monotonic()
            figures = _watch_listing(gateway, urls, listening, 120)
            _all_registered(group, 60)
            time.sleep(lifetime)
            after = _requests(group)
            sent = [b - a for a, b in zip(before, after, strict=True)]
            figures["requests_per_worker_lifetime"] = statistics.mean(sent)
            figures["requests_per_worker_max"] = max(sent)
            figures["lifetime_s"] = 2 * lifetime + 0.5
            out["restarts"].append(figures)
        cpu0, t0 = time.process_time(), time.monotonic()
        time.sleep(idle)
        cpu = time.process_time() - cpu0
        out["idle_cpu_percent_per_registration"] = 100 * cpu / (time.monotonic() - t0) / n
        t0 = time.monotonic()
        group[0].stop(timeout=60)
        out["drain_one_s"] = time.monotonic() - t0
        t0 = time.monotonic()
        _stop_all(group[1:], 60)
        out["drain_rest_s"] = time.monotonic() - t0
        out["listed_after_drain"] = len(_listed(gateway))
    finally:
        _stop_all(group, 30)
        gateway.kill()
        child.stdin.close()
        child.wait(timeout=30)
    return out


def _summary(results: list[dict[str, Any]]) -> str:
    lines = [
        "| N | restarts | all listed after (max) | gateway's own pace | per-worker p99 (worst) | "
        "duplicates | requests/worker/lifetime | idle CPU/registration | drain 1 | "
        "drain N-1 together |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        restarts = r["restarts"]
        all_listed = [x["all_listed_s"] for x in restarts if x["all_listed_s"] is not None]
        lines.append(
            f"| {r['n']} | {len(restarts)} | {max(all_listed):.2f} s | "
            f"{r['baseline']['all_listed_s']:.2f} s | "
            f"{max(x['p99_s'] for x in restarts):.2f} s | "
            f"{max(x['duplicates'] for x in restarts)} | "
            f"{statistics.mean(x['requests_per_worker_lifetime'] for x in restarts):.1f} "
            f"(max {max(x['requests_per_worker_max'] for x in restarts)}) | "
            f"{r['idle_cpu_percent_per_registration']:.4f} % | "
            f"{r['drain_one_s']:.2f} s | {r['drain_rest_s']:.2f} s |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gateway")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smg", help="the smg executable (default: scripts/smg-venv.sh)")
    parser.add_argument("--sizes", default=None, help="fleet sizes, e.g. 20,200")
    parser.add_argument("--serve-workers", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_workers:
        serve_workers(args.serve_workers)
        return 0
    logging.getLogger("registrar").setLevel(logging.ERROR)  # the figures, not the story
    binary = _binary(args.smg)
    sizes = [int(s) for s in (args.sizes or ("20" if args.quick else "20,200")).split(",")]
    restarts, lifetime, idle = (1, 2.0, 3.0) if args.quick else (5, 10.0, 30.0)
    results = [run_size(binary, n, restarts, lifetime, idle) for n in sizes]
    table = _summary(results)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gateway.json").write_text(json.dumps(results, indent=2) + "\n")
        (args.out / "gateway.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
