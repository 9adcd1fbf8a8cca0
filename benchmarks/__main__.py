"""`python -m benchmarks [--quick] [--out DIR]`: every scenario, registrar's defaults beside the
upstream loop in the same run, written as JSON, a markdown report and PNG plots."""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Any

from registrar import DEFAULT_BACKOFF, Backoff
from registrar.core.registrar import DEFAULT_WATCH_INTERVAL

from . import real, sim
from .overhead import overhead
from .report import write_report

FULL = {
    "real_startup_n": (1, 100),
    "real_startup_t": (0.5, 3.0, 10.0, 20.0),
    "sim_n": (1, 100, 1000),
    "sim_t": (0.5, 3.0, 10.0, 20.0, 60.0, 600.0),
    "real_restart_n": (1, 100),
    "restart_d": (0.0, 2.0, 10.0),
    "sim_restart_n": (100, 1000),
    "overhead_n": (1, 100),
    "overhead_s": 30.0,
    "idle_s": 10.0,
    "tradeoff_caps": (2.0, 4.0, 5.0, 10.0, 30.0),
}
QUICK = {
    "real_startup_n": (1, 3),
    "real_startup_t": (0.5,),
    "sim_n": (1, 100),
    "sim_t": (0.5, 10.0, 600.0),
    "real_restart_n": (3,),
    "restart_d": (0.0,),
    "sim_restart_n": (100,),
    "overhead_n": (1,),
    "overhead_s": 1.0,
    "idle_s": 1.0,
    "tradeoff_caps": (5.0, 30.0),
}


def _sim_startup(n: int, t: float, backoff: Backoff, seed: int) -> dict[str, Any]:
    fleets = {
        "registrar": sim.startup_registrar(n, t, sim.registrar_strategy(backoff), seed),
        "baseline": sim.startup_baseline(n, t, seed),
    }
    return {name: _figures(fleet, n, t) for name, fleet in fleets.items()}


def _figures(fleet: sim.Fleet, n: int, up: float) -> dict[str, Any]:
    after = [r - up for r in fleet.registered if r is not None]
    down = sum(1 for r in fleet.requests if r < up)
    return {
        "registered_fraction": len(after) / n,
        "p50": real.quantile(after, 0.5),
        "p99": real.quantile(after, 0.99),
        "last": max(after) if len(after) == n else None,
        "requests_while_down_per_client": down / n,
        "rate_while_down_per_client": down / n / up,
        "peak_rate": sim.peak_rate(fleet.requests, up, up + 3600),
    }


def _tradeoff(caps: tuple[float, ...], n: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for cap in caps:
        backoff = Backoff(initial=1.0, multiplier=2.0, maximum=cap, jitter=0.25)
        strategies = {
            "proportional 0.25": sim.registrar_strategy(backoff),
            "full": sim.full_jitter(backoff),
            "decorrelated": sim.decorrelated_jitter(backoff),
        }
        for name, strategy in strategies.items():
            row: dict[str, Any] = {"cap": cap, "jitter": name}
            for t in (10.0, 60.0, 600.0):
                fleet = sim.startup_registrar(n, t, strategy, seed)
                figures = _figures(fleet, n, t)
                row[f"p99_T{t:g}"] = figures["p99"]
                row[f"rate_T{t:g}"] = figures["rate_while_down_per_client"]
                row[f"peak_T{t:g}"] = figures["peak_rate"]
            rows.append(row)
    return rows


def _sim_restart(n: int, d: float, backoff: Backoff, interval: float, seed: int) -> dict[str, Any]:
    down_at = 10.0
    fleet = sim.restart_registrar(n, down_at, d, backoff, interval, seed)
    back = down_at + d
    done = [r - back for r in fleet.registered if r is not None]
    return {
        "recovered_fraction": len(done) / n,
        "time_to_all_back": max(done) if done else None,
        "peak_rate": sim.peak_rate(fleet.requests, back, back + 60),
        "peak_put_rate": sim.peak_rate(fleet.puts, back, back + 60),
        "requests_per_client": fleet.recovery_requests / n,
        "timeline": _timeline(fleet, down_at - 5, back + 2 * interval + 5),
    }


def _timeline(fleet: sim.Fleet, start: float, end: float) -> dict[str, list[float]]:
    seconds = [start + i * 0.5 for i in range(int((end - start) / 0.5))]
    counts = [sum(1 for r in fleet.requests if s <= r < s + 0.5) * 2 for s in seconds]
    puts = [sum(1 for r in fleet.puts if s <= r < s + 0.5) * 2 for s in seconds]
    return {"t": seconds, "rate": counts, "put_rate": puts}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    # The figures are the output; thousands of retry warnings are not.
    logging.getLogger("registrar").setLevel(logging.CRITICAL)
    logging.getLogger("transitions").setLevel(logging.CRITICAL)
    sizes = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    backoff, interval = DEFAULT_BACKOFF, DEFAULT_WATCH_INTERVAL
    started = time.monotonic()
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "processor": platform.processor() or "unknown",
        },
        "quick": args.quick,
        "defaults": {"watch_interval": interval},
        "startup_real": {},
        "startup_sim": {},
        "restart_real": {},
        "restart_sim": {},
    }
    results["defaults"]["backoff"] = {
        "initial": backoff.initial,
        "multiplier": backoff.multiplier,
        "maximum": backoff.maximum,
        "jitter": backoff.jitter,
    }
    for n in sizes["real_startup_n"]:
        for t in sizes["real_startup_t"]:
            print(f"startup race, real: N={n} T={t:g} s", flush=True)
            results["startup_real"][f"{n}/{t:g}"] = real.startup_race(n, t)
    for n in sizes["sim_n"]:
        for t in sizes["sim_t"]:
            results["startup_sim"][f"{n}/{t:g}"] = _sim_startup(n, t, backoff, args.seed)
    for n in sizes["real_restart_n"]:
        for d in sizes["restart_d"]:
            print(f"restart, real: N={n} D={d:g} s", flush=True)
            results["restart_real"][f"{n}/{d:g}"] = real.restart(n, d)
    for n in sizes["sim_restart_n"]:
        for d in sizes["restart_d"]:
            results["restart_sim"][f"{n}/{d:g}"] = _sim_restart(n, d, backoff, interval, args.seed)
    tradeoff_n = 100 if args.quick else 1000
    print(f"trade-off (simulated, N={tradeoff_n})", flush=True)
    results["tradeoff_n"] = tradeoff_n
    results["tradeoff"] = _tradeoff(sizes["tradeoff_caps"], tradeoff_n, args.seed)
    print("overhead", flush=True)
    results["overhead"] = overhead(sizes["overhead_n"], sizes["overhead_s"], sizes["idle_s"])
    results["elapsed_s"] = time.monotonic() - started
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    report = write_report(results, args.out)
    print(f"wrote {args.out / 'results.json'}, {report} in {results['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
