"""`python -m benchmarks [--quick] [--out DIR] [--release-python PATH]`: startup races,
restarts, a partition and idle cost against SGLang's real bootstrap server and the reference
server, each with this registrar, the release before it (`--release-python`: an interpreter
where that release is installed) and the upstream SGLang loop, plus the simulation for fleets
too large to run; written as JSON, a markdown report and PNG plots."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from registrar.core._backoff import ACCEPT_RATE
from registrar.core._settings import DEFAULT_BACKOFF, DEFAULT_WATCH_INTERVAL

from . import race, sim
from .report import write_report
from .server import sglang_available

FULL: dict[str, Any] = {
    "n": 200,
    "n_large": 1000,
    "startup_t": (3.0, 30.0),
    "restart_d": (0.5, 5.0),
    "partition_n": 200,
    "partition_d": 5.0,
    "idle_n": 100,
    "idle_s": 60.0,
    "sim_n": (200, 1000),
    "sim_t": (3.0, 30.0, 600.0),
    "sim_d": (0.5, 5.0),
}
QUICK: dict[str, Any] = {
    "n": 20,
    "n_large": 0,
    "startup_t": (1.0,),
    "restart_d": (0.5,),
    "partition_n": 0,
    "partition_d": 1.0,
    "idle_n": 10,
    "idle_s": 3.0,
    "sim_n": (200,),
    "sim_t": (3.0,),
    "sim_d": (0.5,),
}


def _contenders(release_python: str | None) -> tuple[list[race.Contender], list[str]]:
    notes = []
    found = [race.Contender("registrar", "registrar", sys.executable)]
    if release_python:
        found.append(race.Contender("release", "registrar", release_python))
    else:
        notes.append("the release before this one was not measured (no --release-python)")
    found.append(race.Contender("upstream", "upstream", sys.executable))
    return found, notes


def _sim(sizes: dict[str, Any], seed: int) -> dict[str, Any]:
    backoff, interval = DEFAULT_BACKOFF, DEFAULT_WATCH_INTERVAL
    out: dict[str, Any] = {"startup": {}, "restart": {}, "spread": []}
    for n in sizes["sim_n"]:
        for t in sizes["sim_t"]:
            fleets = {
                "registrar": sim.startup_registrar(n, t, backoff, seed),
                "release": sim.startup_registrar(n, t, backoff, seed, probing=False),
                "upstream": sim.startup_upstream(n, t, seed),
            }
            out["startup"][f"{n}/{t:g}"] = {k: _sim_figures(f, n, t) for k, f in fleets.items()}
        for d in sizes["sim_d"]:
            down_at = 10.0
            fleets = {
                "registrar": sim.restart_registrar(n, down_at, d, backoff, interval, seed),
                "release": sim.restart_registrar(n, down_at, d, backoff, 5.0, seed, eof=False),
            }
            out["restart"][f"{n}/{d:g}"] = {
                k: _sim_figures(f, n, down_at + d) for k, f in fleets.items()
            }
    n = max(sizes["sim_n"])
    for hint in (1, n // 2, n, 2 * n):
        fleet = sim.startup_registrar(n, 30.0, backoff, seed, fleet_hint=hint)
        row = _sim_figures(fleet, n, 30.0)
        row["fleet_hint"] = hint
        out["spread"].append(row)
    out["n_spread"] = n
    return out


def _sim_figures(fleet: sim.Fleet, n: int, up: float) -> dict[str, Any]:
    after = [r - up for r in fleet.registered if r is not None]
    return {
        "registered_fraction": len(after) / n,
        "p50": race.quantile(after, 0.5),
        "p99": race.quantile(after, 0.99),
        "max": max(after) if len(after) == n else None,
        "overflows": fleet.overflows,
    }


def _guard(name: str, run: Any) -> Any:
    """One scenario; a failure is recorded instead of ending the whole run."""
    print(name, flush=True)
    try:
        return run()
    except Exception as exc:  # a benchmark run reports what it could measure
        print(f"  failed: {exc!r}", flush=True)
        return {"error": repr(exc)}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for CI")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--release-python", help="an interpreter with the previous registrar release installed"
    )
    parser.add_argument(
        "--sglang-python",
        default=sys.executable,
        help="an interpreter with sglang 0.5.23 and aiohttp (scripts/sglang-venv.sh builds one)",
    )
    parser.add_argument(
        "--no-netns", action="store_true", help="run on this namespace's loopback (no isolation)"
    )
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    contenders, notes = _contenders(args.release_python)
    kinds = ["sglang", "reference"]
    race.SERVER_PYTHON["sglang"] = args.sglang_python
    missing = sglang_available(args.sglang_python)
    if missing is not None:
        kinds = ["reference"]
        notes.append(f"SGLang's real server was not measured: {missing}")
    load = os.getloadavg()
    results: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_before": load,
        },
        "quick": args.quick,
        "defaults": {
            "watch_interval": DEFAULT_WATCH_INTERVAL,
            "accept_rate": ACCEPT_RATE,
            "backoff": dataclasses.asdict(DEFAULT_BACKOFF),
        },
        "notes": notes,
        "sizes": {k: v for k, v in sizes.items()},
        "limit": {},
        "cost": {},
        "large": {},
        "startup": {},
        "restart": {},
        "partition": {},
        "idle": {},
    }
    n = sizes["n"]
    limit = race.Contender("limit", "limit", sys.executable)
    with race.network(isolate=not args.no_netns) as net:
        results["isolated"] = net.isolated
        if not net.isolated:
            notes.append("no network namespace: overflow counts are the whole machine's")
        for kind in kinds:
            results["limit"][kind] = _guard(
                f"limit, {kind}: N={n}", lambda kind=kind: race.limit(kind, limit, n, net)
            )
            for c in [limit, *contenders]:
                if c.who == "upstream":
                    continue
                results["cost"][f"{kind}/{c.name}"] = _guard(
                    f"cost, {kind}: N={n}, {c.name}",
                    lambda kind=kind, c=c: race.cost(kind, c, n, net),
                )
            for t in sizes["startup_t"]:
                for c in contenders:
                    key = f"{kind}/{t:g}/{c.name}"
                    results["startup"][key] = _guard(
                        f"startup race, {kind}: N={n} T={t:g} s, {c.name}",
                        lambda kind=kind, c=c, t=t: race.startup_race(kind, c, n, t, net),
                    )
            for d in sizes["restart_d"]:
                for c in contenders:
                    key = f"{kind}/{d:g}/{c.name}"
                    results["restart"][key] = _guard(
                        f"restart, {kind}: N={n} down {d:g} s, {c.name}",
                        lambda kind=kind, c=c, d=d: race.restart(kind, c, n, d, net),
                    )
        kind = kinds[0]
        big = sizes["n_large"]
        if big:
            # A fleet the size the simulation extrapolates to, real, in one process: the
            # check that the simulation's figures hold where both exist.
            results["large"] = {
                "n": big,
                "limit": _guard(
                    f"limit, {kind}: N={big}", lambda: race.limit(kind, limit, big, net)
                ),
                "startup": _guard(
                    f"startup race, {kind}: N={big} T=3 s, registrar",
                    lambda: race.startup_race(kind, contenders[0], big, 3.0, net),
                ),
                "restart": _guard(
                    f"restart, {kind}: N={big} down 0.5 s, registrar",
                    lambda: race.restart(kind, contenders[0], big, 0.5, net),
                ),
            }
        for c in contenders:
            if c.who == "upstream":
                continue
            results["idle"][c.name] = _guard(
                f"idle, {kind}: N={sizes['idle_n']} for {sizes['idle_s']:g} s, {c.name}",
                lambda c=c: race.idle(kind, c, sizes["idle_n"], sizes["idle_s"], net),
            )
    if sizes["partition_n"] and results["isolated"]:
        for c in contenders:
            if c.who == "upstream":
                continue
            results["partition"][c.name] = _guard(
                f"partition, {kinds[0]}: N={sizes['partition_n']}, {c.name}",
                lambda c=c: race.partition(kinds[0], c, sizes["partition_n"], sizes["partition_d"]),
            )
    results["load_after"] = os.getloadavg()
    print("simulation", flush=True)
    results["sim"] = _sim(sizes, args.seed)
    results["elapsed_s"] = time.monotonic() - started
    (args.out / "results.json").write_text(json.dumps(results, indent=2, default=str))
    report = write_report(results, args.out)
    for note in notes:
        print(f"note: {note}")
    print(f"wrote {args.out / 'results.json'}, {report} in {results['elapsed_s']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
