"""The report's charts (PNG, matplotlib from the `bench` extra): for the startup race and the
restart, a timeline (the share of the fleet registered against the seconds since the server
came up) and a distribution (each client's time, per contender), drawn from the per-client
times a run records (`after`, `back` in results.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["CHARTS", "draw_charts"]

CHARTS = (
    "startup-timeline.png",
    "startup-distribution.png",
    "restart-timeline.png",
    "restart-distribution.png",
)

_COLOURS = {"limit": "#7f7f7f", "registrar": "#1f77b4", "release": "#ff7f0e", "upstream": "#d62728"}
_ORDER = ("limit", "registrar", "release", "upstream")


def _series(results: dict[str, Any], scenario: str, field: str) -> dict[str, dict[str, Any]]:
    """{panel title: {contender: (times, fleet size)}} for one scenario, SGLang's server first."""
    n = results["sizes"]["n"]
    unit = "T" if scenario == "startup" else "down"
    panels: dict[str, dict[str, Any]] = {}
    for key, r in results.get(scenario, {}).items():
        if not isinstance(r, dict) or field not in r:
            continue
        kind, value, who = key.split("/")
        server = "SGLang's server" if kind == "sglang" else "reference server"
        title = f"{server}, {unit} = {value} s"
        panels.setdefault(title, {})[who] = (r[field], n)
    limit = results.get("limit", {})
    for title, contenders in panels.items():
        kind = "sglang" if title.startswith("SGLang") else "reference"
        found = limit.get(kind)
        if scenario == "startup" and isinstance(found, dict) and "after" in found:
            contenders["limit"] = (found["after"], n)
    return dict(sorted(panels.items(), key=lambda item: not item[0].startswith("SGLang")))


def _timeline(ax: Any, contenders: dict[str, Any], horizon: float) -> None:
    for who in _ORDER:
        if who not in contenders:
            continue
        times, n = contenders[who]
        xs = [0.0, *times]
        ys = [0.0, *(100.0 * (i + 1) / n for i in range(len(times)))]
        if xs[-1] < horizon:
            xs.append(horizon)
            ys.append(ys[-1])
        label = f"{who} ({len(times)}/{n})"
        ax.step(xs, ys, where="post", color=_COLOURS[who], label=label, linewidth=1.6)
    ax.set_ylim(-2, 102)
    ax.set_xlim(0, horizon)
    ax.set_ylabel("% of the fleet registered")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)


def _distribution(ax: Any, contenders: dict[str, Any]) -> None:
    names = [who for who in _ORDER if who in contenders]
    for row, who in enumerate(names, start=1):
        values = contenders[who][0]
        if not values:  # e.g. the upstream loop after a restart: it never registers again
            ax.text(0.0, row, "  never registered", va="center", color=_COLOURS[who])
            continue
        parts = ax.boxplot(
            [values], positions=[row], vert=False, whis=(0, 100), patch_artist=True, widths=0.6
        )
        parts["boxes"][0].set_facecolor(_COLOURS[who])
        parts["boxes"][0].set_alpha(0.5)
        ax.scatter(values, [row] * len(values), s=4, color="black", alpha=0.3, zorder=3)
    ax.set_yticks(range(1, len(names) + 1), names)
    ax.set_ylim(0.4, len(names) + 0.6)
    ax.set_xscale("symlog", linthresh=0.1)
    ax.set_xlim(left=0)
    ax.grid(alpha=0.3, axis="x")


def _figure(panels: dict[str, dict[str, Any]], draw: Any, xlabel: str, title: str) -> Any:
    import matplotlib  # noqa: PLC0415 - the bench extra, only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    count = max(1, len(panels))
    cols = 2 if count > 1 else 1
    rows = (count + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(6.4 * cols, 3.4 * rows), squeeze=False)
    for ax, (name, contenders) in zip(axes.flat, panels.items(), strict=False):
        draw(ax, contenders)
        ax.set_title(name, fontsize=10)
        ax.set_xlabel(xlabel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    return fig


def draw_charts(results: dict[str, Any], out: Path) -> list[Path]:
    """Write the charts into `out`; the paths written."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    n = results["sizes"]["n"]
    quick = " (quick mode)" if results.get("quick") else ""
    written = []
    for scenario, field, what in (
        ("startup", "after", "registered after the server came up"),
        ("restart", "back", "registered again after the new server came up"),
    ):
        panels = _series(results, scenario, field)
        longest = max(
            (max(times) for p in panels.values() for times, _ in p.values() if times),
            default=1.0,
        )
        horizon = max(1.0, longest * 1.1)
        charts = (
            (
                f"{scenario}-timeline.png",
                lambda ax, c, h=horizon: _timeline(ax, c, h),
                "seconds since the server came up",
                f"Share of {n} clients {what}{quick}",
            ),
            (
                f"{scenario}-distribution.png",
                _distribution,
                "seconds since the server came up (symlog)",
                f"Each client's time, {what}: box = quartiles, whiskers = min/max{quick}",
            ),
        )
        for name, draw, xlabel, title in charts:
            fig = _figure(panels, draw, xlabel, title)
            path = out / name
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
