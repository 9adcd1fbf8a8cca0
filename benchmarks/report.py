"""The markdown report of a benchmark run (`results.md` beside `results.json`), with the
charts (`plots.py`) above the tables they draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .plots import draw_charts


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, list):
        return ", ".join(_f(v, digits) for v in value) or "—"
    return str(value)


def _failed(r: Any) -> bool:
    return not isinstance(r, dict) or "error" in r


def _limit(results: dict[str, Any], n: int) -> list[str]:
    lines = [
        f"### Physical limit (N = {n}, server already up, each client PUT + one check at once)",
        "",
        "| server | p50 (s) | p99 (s) | last (s) | listen overflows |",
        "|---|---|---|---|---|",
    ]
    for kind, r in results["limit"].items():
        if _failed(r):
            lines.append(f"| {kind} | failed: {r.get('error')} | | | |")
            continue
        lines.append(
            f"| {kind} | {_f(r['p50'])} | {_f(r['p99'])} | {_f(r['max'])} | {r['overflows']} |"
        )
    return [*lines, ""]


def _cost(results: dict[str, Any], n: int) -> list[str]:
    lines = [
        f"### CPU per registration (N = {n} in one process, server already up)",
        "",
        "| server | who | CPU per client (ms) | against the limit | requests / client |",
        "|---|---|---|---|---|",
    ]
    found = results.get("cost", {})
    for key, r in found.items():
        kind, who = key.split("/")
        if _failed(r):
            lines.append(f"| {kind} | {who} | failed: {r.get('error')} | | |")
            continue
        floor = found.get(f"{kind}/limit")
        ratio = (
            r["cpu_ms_per_client"] / floor["cpu_ms_per_client"]
            if not _failed(floor) and floor["cpu_ms_per_client"] > 0
            else None
        )
        lines.append(
            f"| {kind} | {who} | {_f(r['cpu_ms_per_client'])} "
            f"| {_f(ratio, 1) + ' x' if ratio is not None else '—'} "
            f"| {_f(r['requests_per_client'], 1)} |"
        )
    return [*lines, ""]


def _startup(results: dict[str, Any], n: int) -> list[str]:
    lines = [
        f"### Startup race (real, N = {n} in one process; server up T s after the fleet starts)",
        "",
        "| server | T (s) | who | registered | p50 after up (s) | p99 after up (s) | last (s) "
        "| listen overflows | requests / client at the live server | PUTs per rank |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results["startup"].items():
        kind, t, who = key.split("/")
        if _failed(r):
            lines.append(f"| {kind} | {t} | {who} | failed: {r.get('error')} | | | | | | |")
            continue
        lines.append(
            f"| {kind} | {t} | {who} | {r['registered_fraction']:.0%} | {_f(r['p50'])} "
            f"| {_f(r['p99'])} | {_f(r['max'])} | {r['overflows']} "
            f"| {_f(r['requests_per_client'], 1)} | {r['puts_per_rank_max']} |"
        )
    return [*lines, ""]


def _restart(results: dict[str, Any], n: int) -> list[str]:
    lines = [
        f"### Restart (real, N = {n}: the server process killed, a new one up after D s)",
        "",
        "| server | D (s) | who | back | every route back after up (s) | p50 (s) "
        "| PUTs per rank | requests / client at the new server | listen overflows |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in results["restart"].items():
        kind, d, who = key.split("/")
        if _failed(r):
            lines.append(f"| {kind} | {d} | {who} | failed: {r.get('error')} | | | | | |")
            continue
        lines.append(
            f"| {kind} | {d} | {who} | {r['recovered_fraction']:.0%} "
            f"| {_f(r['time_to_all_back'])} | {_f(r['p50_back'])} | {_f(r['puts_per_rank'])} "
            f"| {_f(r['requests_per_client'], 1)} | {r['overflows']} |"
        )
    return [*lines, ""]


def _partition(results: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    if not results["partition"]:
        return ["(partition not measured: it needs root and network namespaces)", ""]
    lines = [
        f"### Partition (real, N = {sizes['partition_n']}: no EOF; the server process replaced "
        f"during a {sizes['partition_d']:g} s partition)",
        "",
        "| who | watch interval (s) | back | every route back after the heal (s) | p50 (s) "
        "| PUTs per rank |",
        "|---|---|---|---|---|---|",
    ]
    for who, r in results["partition"].items():
        if _failed(r):
            lines.append(f"| {who} | | failed: {r.get('error')} | | | |")
            continue
        interval = results["defaults"]["watch_interval"] if who == "registrar" else 5.0
        lines.append(
            f"| {who} | {interval:g} | {r['recovered_fraction']:.0%} "
            f"| {_f(r['time_to_all_back'])} | {_f(r['p50_back'])} | {_f(r['puts_per_rank'])} |"
        )
    return [*lines, ""]


def _idle(results: dict[str, Any], sizes: dict[str, Any]) -> list[str]:
    lines = [
        f"### Idle (real, N = {sizes['idle_n']} registered, for {sizes['idle_s']:g} s, defaults)",
        "",
        "| who | % of one core per registrar | requests / client / minute at the server "
        "| stop() p50 (ms) | stop() max (ms) |",
        "|---|---|---|---|---|",
    ]
    for who, r in results["idle"].items():
        if _failed(r):
            lines.append(f"| {who} | failed: {r.get('error')} | | | |")
            continue
        lines.append(
            f"| {who} | {_f(r['core_percent_per_registrar'], 4)} "
            f"| {_f(r['server_requests_per_client_per_minute'], 1)} "
            f"| {_f(r['stop_p50_ms'])} | {_f(r['stop_max_ms'])} |"
        )
    return [*lines, ""]


def _large(results: dict[str, Any]) -> list[str]:
    large = results.get("large") or {}
    if not large:
        return []
    n = large["n"]
    sim = results["sim"]
    sim_up = sim["startup"].get(f"{n}/3", {}).get("registrar")
    sim_back = sim["restart"].get(f"{n}/0.5", {}).get("registrar")
    lines = [
        f"### A real fleet of N = {n} in one process (SGLang's server), beside the simulation",
        "",
        "| scenario | real p50 (s) | real p99 (s) | real last (s) | simulated p99 (s) "
        "| simulated last (s) | listen overflows | PUTs per rank |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = (
        ("limit (server up, from the start)", large.get("limit"), None),
        ("startup race, T = 3 s (after up)", large.get("startup"), sim_up),
        ("restart, down 0.5 s (every route back after up)", large.get("restart"), sim_back),
    )
    for name, r, simulated in rows:
        if r is None or _failed(r):
            lines.append(f"| {name} | failed: {(r or {}).get('error')} | | | | | | |")
            continue
        p50 = r.get("p50", r.get("p50_back"))
        last = r.get("max", r.get("time_to_all_back"))
        puts = r.get("puts_per_rank_max", r.get("puts_per_rank", "—"))
        lines.append(
            f"| {name} | {_f(p50)} | {_f(r.get('p99'))} | {_f(last)} "
            f"| {_f(simulated['p99']) if simulated else '—'} "
            f"| {_f(simulated['max']) if simulated else '—'} | {r['overflows']} | {_f(puts)} |"
        )
    return [*lines, ""]


def _sim(results: dict[str, Any]) -> list[str]:
    s = results["sim"]
    lines = [
        "### Simulation (listen queue of 128 served at 1400 new connections / s)",
        "",
        "| scenario | N | T or D (s) | who | p50 (s) | p99 (s) | last (s) | listen overflows |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, table in (("startup", s["startup"]), ("restart", s["restart"])):
        for key, rows in table.items():
            n, t = key.split("/")
            for who, r in rows.items():
                lines.append(
                    f"| {name} | {n} | {t} | {who} | {_f(r['p50'])} | {_f(r['p99'])} "
                    f"| {_f(r['max'])} | {r['overflows']} |"
                )
    lines += [
        "",
        f"### Spread: how large a fleet the clients assume (simulated startup, N = "
        f"{s['n_spread']}, T = 30 s)",
        "",
        "| fleet assumed | p50 after up (s) | p99 (s) | last (s) | listen overflows |",
        "|---|---|---|---|---|",
    ]
    for r in s["spread"]:
        lines.append(
            f"| {r['fleet_hint']} | {_f(r['p50'])} | {_f(r['p99'])} | {_f(r['max'])} "
            f"| {r['overflows']} |"
        )
    return [*lines, ""]


def _charts(out: Path, scenario: str, title: str) -> list[str]:
    names = (f"{scenario}-timeline.png", f"{scenario}-distribution.png")
    if not all((out / name).exists() for name in names):
        return []
    return [
        f"![{title}: share of the fleet registered over time]({names[0]})",
        "",
        f"![{title}: each client's time, per contender]({names[1]})",
        "",
    ]


def write_report(results: dict[str, Any], out: Path) -> Path:
    """`results.md` in `out`, and the charts beside it (drawn first, so the report shows them)."""
    draw_charts(results, out)
    m = results["machine"]
    n = results["sizes"]["n"]
    lines = [
        "# Benchmark results",
        "",
        f"Machine: {m['platform']}, Python {m['python']}, {m['cpus']} CPUs; load average "
        f"{m['load_before'][0]:.1f} before, {results['load_after'][0]:.1f} after (the machine "
        "is shared). "
        f"Run took {results['elapsed_s']:.0f} s{' (quick mode)' if results['quick'] else ''}. "
        f"Own network namespace: {_f(results.get('isolated'))}.",
        "",
        f"registrar defaults: watch interval {results['defaults']['watch_interval']:g} s, "
        f"accept rate assumed {results['defaults']['accept_rate']:g} new connections / s.",
        "",
    ]
    lines += [f"Note: {note}." for note in results["notes"]]
    lines += [""] if results["notes"] else []
    lines += _limit(results, n)
    lines += _cost(results, n)
    lines += _charts(out, "startup", "Startup race")
    lines += _startup(results, n)
    lines += _charts(out, "restart", "Restart")
    lines += _restart(results, n)
    lines += _partition(results, results["sizes"])
    lines += _idle(results, results["sizes"])
    lines += _large(results)
    lines += _sim(results)
    path = out / "results.md"
    path.write_text("\n".join(lines))
    return path
