"""Overhead of registered, watching registrars, measured in a child process so that the
reference server's own work is not counted: CPU per minute, idle CPU between checks, `stop()`
latency, and the import time."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from typing import Any

from registrar.devtools.bootstrap_server import BootstrapServer

CHILD = """
import json, os, sys, time
from registrar import Registrar, State
from benchmarks.real import payload
url, n, watch, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
rss_before = rss()
regs = [Registrar(url, payload(r, n), watch_interval=watch) for r in range(n)]
for reg in regs:
    reg.start()
assert all(reg.wait_for(State.REGISTERED, timeout=30) for reg in regs)
time.sleep(1.0)
cpu, wall = time.process_time(), time.monotonic()
time.sleep(seconds)
cpu, wall = time.process_time() - cpu, time.monotonic() - wall
rss_after = rss()
stops = []
for reg in regs:
    t = time.perf_counter()
    reg.stop()
    stops.append(time.perf_counter() - t)
print(json.dumps({"cpu": cpu, "wall": wall, "stops": stops, "rss_before": rss_before,
                  "rss_after": rss_after}))
"""


def _child(url: str, n: int, watch: float, seconds: float) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, url, str(n), str(watch), str(seconds)],
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def import_time(module: str, runs: int = 5) -> float:
    code = f"import time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    times = [
        float(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
            ).stdout
        )
        for _ in range(runs)
    ]
    return statistics.median(times)


def overhead(sizes: tuple[int, ...], seconds: float, idle_seconds: float) -> dict[str, Any]:
    results: dict[str, Any] = {"watching": {}, "idle": {}}
    with BootstrapServer("127.0.0.1", 0) as server:
        for n in sizes:
            run = _child(server.url, n, 5.0, seconds)
            core_fraction = run["cpu"] / run["wall"]
            results["watching"][n] = {
                "cpu_seconds_per_minute": run["cpu"] / run["wall"] * 60,
                "core_percent_per_registrar": 100 * core_fraction / n,
                "stop_p50_ms": 1000 * statistics.median(run["stops"]),
                "stop_max_ms": 1000 * max(run["stops"]),
                "memory_kib_per_registrar": (run["rss_after"] - run["rss_before"]) / 1024 / n,
                "process_rss_mib": run["rss_after"] / 2**20,
            }
        idle = _child(server.url, 1, 3600.0, idle_seconds)
        results["idle"] = {"seconds": idle["wall"], "cpu_seconds": idle["cpu"]}
    started = time.perf_counter()
    results["import_registrar_s"] = import_time("registrar")
    results["import_requests_s"] = import_time("requests")
    results["import_measured_in_s"] = time.perf_counter() - started
    return results
