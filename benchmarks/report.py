"""The markdown report and PNG plots of a benchmark run (plots need the `bench` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _startup_table(rows: dict[str, Any], title: str) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| N | T (s) | who | registered | p50 after up (s) | p99 after up (s) | last (s) "
        "| requests while down / client | rate while down / client (1/s) "
        "| peak rate at server (1/s) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, result in rows.items():
        n, t = key.split("/")
        for who in ("registrar", "baseline"):
            r = result[who]
            lines.append(
                f"| {n} | {t} | {who} | {r['registered_fraction']:.0%} | {_f(r['p50'])} "
                f"| {_f(r['p99'])} | {_f(r['last'])} "
                f"| {_f(r['requests_while_down_per_client'], 1)} "
                f"| {_f(r['rate_while_down_per_client'], 3)} | {_f(r['peak_rate'], 0)} |"
            )
    return [*lines, ""]


def _restart_table(rows: dict[str, Any], title: str, with_baseline: bool) -> list[str]:
    lines = [
        f"### {title}",
        "",
        "| N | down (s) | who | back | time to all back (s) | peak rate (1/s) "
        "| peak PUT rate (1/s) | requests / client |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, result in rows.items():
        n, d = key.split("/")
        pairs = (
            [("registrar", result["registrar"]), ("baseline", result["baseline"])]
            if (with_baseline)
            else [("registrar", result)]
        )
        for who, r in pairs:
            lines.append(
                f"| {n} | {d} | {who} | {r['recovered_fraction']:.0%} "
                f"| {_f(r['time_to_all_back'])} | {_f(r['peak_rate'], 0)} "
                f"| {_f(r.get('peak_put_rate'), 0)} | {_f(r['requests_per_client'], 1)} |"
            )
    return [*lines, ""]


def _tradeoff_table(rows: list[dict[str, Any]], n: int) -> list[str]:
    lines = [
        f"### Trade-off: backoff cap and jitter strategy (simulated, N = {n})",
        "",
        "| cap (s) | jitter | p99 after up, T=10 / 60 / 600 (s) "
        "| rate while down / client, T=10 / 60 / 600 (1/s) | peak at server, T=10 / 600 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['cap']:g} | {r['jitter']} | {_f(r['p99_T10'])} / {_f(r['p99_T60'])} / "
            f"{_f(r['p99_T600'])} | {_f(r['rate_T10'], 3)} / {_f(r['rate_T60'], 3)} / "
            f"{_f(r['rate_T600'], 3)} | {_f(r['peak_T10'], 0)} / {_f(r['peak_T600'], 0)} |"
        )
    return [*lines, ""]


def _overhead_table(o: dict[str, Any]) -> list[str]:
    lines = [
        "### Overhead (real, in a child process)",
        "",
        "| registrars | CPU s / minute | % of one core per registrar | stop() p50 (ms) "
        "| stop() max (ms) | memory per registrar (KiB) | process RSS (MiB) |",
        "|---|---|---|---|---|---|---|",
    ]
    for n, r in o["watching"].items():
        lines.append(
            f"| {n} | {_f(r['cpu_seconds_per_minute'], 3)} "
            f"| {_f(r['core_percent_per_registrar'], 4)} | {_f(r['stop_p50_ms'], 3)} "
            f"| {_f(r['stop_max_ms'], 3)} | {_f(r['memory_kib_per_registrar'], 0)} "
            f"| {_f(r['process_rss_mib'], 1)} |"
        )
    idle = o["idle"]
    lines += [
        "",
        f"Idle between checks (one registrar, watch interval 3600 s): "
        f"{idle['cpu_seconds'] * 1000:.2f} ms of CPU in {idle['seconds']:.1f} s.",
        f"`import registrar`: {o['import_registrar_s'] * 1000:.0f} ms "
        f"(`import requests` alone: {o['import_requests_s'] * 1000:.0f} ms), "
        "median of 5 fresh interpreters.",
        "",
    ]
    return lines


def _plots(results: dict[str, Any], out: Path) -> list[str]:
    try:
        import matplotlib  # noqa: PLC0415 - the bench extra is optional

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return ["(plots skipped: install the bench extra, `pip install -e '.[bench]'`)", ""]
    made = []
    sims = results["startup_sim"]
    n_max = max(int(k.split("/")[0]) for k in sims)
    ts = sorted({float(k.split("/")[1]) for k in sims})
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for who, style in (("registrar", "o-"), ("baseline", "s--")):
        p99 = [sims[f"{n_max}/{t:g}"][who]["p99"] for t in ts]
        frac = [sims[f"{n_max}/{t:g}"][who]["registered_fraction"] for t in ts]
        left.plot(ts, [p if p is not None else float("nan") for p in p99], style, label=who)
        right.plot(ts, frac, style, label=who)
    left.set(
        xscale="log",
        xlabel="server up at T (s)",
        ylabel="p99 after up (s)",
        title=f"Startup race, N={n_max} (simulated)",
    )
    right.set(
        xscale="log",
        xlabel="server up at T (s)",
        ylabel="fraction registered",
        title="Registered in the end",
    )
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "startup.png", dpi=100)
    plt.close(fig)
    made.append("startup.png")

    fig, ax = plt.subplots(figsize=(10, 4))
    n_big = max(int(k.split("/")[0]) for k in results["restart_sim"])
    for key, result in results["restart_sim"].items():
        if int(key.split("/")[0]) != n_big:
            continue
        line = result["timeline"]
        ax.plot(line["t"], line["rate"], label=f"all requests, down {key.split('/')[1]} s")
        ax.plot(line["t"], line["put_rate"], ":", label=f"PUTs, down {key.split('/')[1]} s")
    ax.axvline(10.0, color="grey", linewidth=0.8)
    ax.set(
        xlabel="time (s); the server restarts at 10 s",
        ylabel="requests / s",
        title=f"Restart (simulated, N={n_big}): request rate at the server",
    )
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "restart.png", dpi=100)
    plt.close(fig)
    made.append("restart.png")

    fig, ax = plt.subplots(figsize=(6, 4))
    for jitter in sorted({r["jitter"] for r in results["tradeoff"]}):
        rows = [r for r in results["tradeoff"] if r["jitter"] == jitter]
        ax.plot([r["rate_T600"] for r in rows], [r["p99_T600"] for r in rows], "o-", label=jitter)
        for r in rows:
            ax.annotate(f"cap {r['cap']:g}", (r["rate_T600"], r["p99_T600"]), fontsize=7)
    ax.set(
        xlabel="requests / s / client while down (T = 600 s)",
        ylabel="p99 after up (s)",
        title="Trade-off (simulated)",
    )
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "tradeoff.png", dpi=100)
    plt.close(fig)
    made.append("tradeoff.png")
    return [f"![{name}]({name})" for name in made] + [""]


def write_report(results: dict[str, Any], out: Path) -> Path:
    m = results["machine"]
    b = results["defaults"]["backoff"]
    lines = [
        "# Benchmark results",
        "",
        f"Machine: {m['platform']}, Python {m['python']}, {m['cpus']} CPUs. "
        f"Run took {results['elapsed_s']:.0f} s{' (quick mode)' if results['quick'] else ''}.",
        "",
        f"registrar defaults: Backoff(initial={b['initial']:g}, multiplier={b['multiplier']:g}, "
        f"maximum={b['maximum']:g}, jitter={b['jitter']:g}), "
        f"watch interval {results['defaults']['watch_interval']:g} s.",
        "",
    ]
    lines += _startup_table(results["startup_real"], "Startup race (real threads and HTTP)")
    lines += _startup_table(results["startup_sim"], "Startup race (simulated)")
    lines += _restart_table(results["restart_real"], "Restart (real threads and HTTP)", True)
    lines += _restart_table(results["restart_sim"], "Restart (simulated)", False)
    lines += _tradeoff_table(results["tradeoff"], results.get("tradeoff_n", 1000))
    lines += _overhead_table(results["overhead"])
    lines += _plots(results, out)
    path = out / "results.md"
    path.write_text("\n".join(lines))
    return path
