"""The end-to-end suite's report: from the records a run left in a folder (results-*.json), a
picture of requests served and failed over time (one row per scenario, without and with
registrar) and the side-by-side health tables.

    python tests/e2e/report.py RESULTS_DIR [--out DIR] [--docs]

`--out` writes timeline.png and report.md there (default: RESULTS_DIR); `--docs` also puts the
picture in docs/e2e-timeline.png and the tables in docs/e2e.md between its report markers.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
START, END = "<!-- report:start -->", "<!-- report:end -->"
TITLES = {
    "1": "1. The bootstrap server listens after the upstream retry budget",
    "2": "2. The bootstrap server restarted, empty, in the live prefill",
    "3": "3. The prefill killed and relaunched",
    "5": "5. Greedy outputs, prefill/decode pair against a single server",
    "6": "6. The router knows no worker but what the plugin tells it: killed, restarted, drained",
    "t1": "t1. TP 2 prefill: the bootstrap server listens after both ranks' upstream retry budget",
    "t2": "t2. TP 2 prefill killed and relaunched under a TP 2 decode",
    "n1": "n1. Two prefill nodes: node 1's rank and a bootstrap server on node 0 that starts late",
    "n2": "n2. Two prefill nodes relaunched as a group under a live decode",
    "n3": "n3. The link between the two prefill nodes cut, then healed",
    "n4": "n4. Node 1 of two dies, node 0 is left running",
    "r1": "r1. Rolling restart behind smg: two TP 2 prefills and two decodes, SIGTERM in turn",
    "m1": "m1. Two prefill nodes, node 0 started with --host 127.0.0.1",
    "m2": "m2. Two prefill nodes, node 1 given another --dist-init-addr host (an alias of node 0)",
    "m3": "m3. Two prefill nodes, node 1 publishing 127.0.0.1 as its rank address",
}
EVENT_ZERO = {
    "1": "bootstrap server listening",
    "2": "bootstrap server listening again",
    "3": "prefill killed",
    "t1": "bootstrap server listening",
    "t2": "prefill killed",
    "n1": "bootstrap server listening",
    "n2": "prefill killed",
    "n3": "link cut",
    "n4": "node 1 killed",
    "r1": "prefill-1 SIGTERM",
}
PAIRED = ("1", "2", "3")
"""Scenarios run without and with registrar, drawn and tabled side by side."""
TOPOLOGY = ("t1", "t2", "n1", "n2", "n3", "n4", "r1")
"""The same for the topology scenarios (tests/e2e/test_topology.py, test_two_nodes.py,
test_rolling.py), tabled after the rest."""
MISCONFIG = ("m1", "m2", "m3")
"""The misconfigured groups (tests/e2e/test_misconfig.py): nothing in front, so no timeline."""
ENDPOINTS = (
    "prefill /health",
    "prefill /ready",
    "decode /health",
    "router /readiness",
    "registrar in /server_info",
)


def load(folder: Path) -> dict[tuple[str, bool], dict[str, Any]]:
    records: dict[tuple[str, bool], dict[str, Any]] = {}
    for path in sorted(folder.glob("results-*.json")):
        for record in json.loads(path.read_text()):
            records[(record["scenario"], record["registrar"])] = record
    if not records:
        raise SystemExit(f"no results-*.json in {folder}: run the suite with REGISTRAR_E2E_OUT")
    return records


def draw(records: dict[tuple[str, bool], dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    scenarios = [s for s in (*PAIRED, *TOPOLOGY) if any((s, r) in records for r in (False, True))]
    fig, axes = plt.subplots(len(scenarios), 1, figsize=(11, 2.3 * len(scenarios)), squeeze=False)
    for ax, scenario in zip(axes[:, 0], scenarios, strict=True):
        for lane, registrar in enumerate((False, True)):
            record = records.get((scenario, registrar))
            if record is None:
                continue
            for sample in record["samples"]:
                colour = "#2a9d4b" if sample["ok"] else "#d1453b"
                width = max(sample["done"] - sample["t"], 0.15)
                ax.barh(lane, width, left=sample["t"], height=0.6, color=colour, edgecolor="none")
            events = [(name, t) for name, t in record["events"].items() if t != 0]
            for i, (name, t) in enumerate(events):
                ax.axvline(t, ymin=lane / 2.5 + 0.1, ymax=lane / 2.5 + 0.45, color="#888", ls=":")
                y = lane + 0.32 + 0.16 * (i % 2)
                ax.text(t, y, f" {name}", fontsize=7, color="#555", va="bottom")
        ax.axvline(0, color="black", lw=1)
        ax.set_yticks([0, 1], ["without registrar", "with registrar"])
        ax.set_ylim(-0.6, 1.9)
        ax.set_title(f"{TITLES[scenario]}  (0 s: {EVENT_ZERO[scenario]})", fontsize=9, loc="left")
        ax.set_xlabel("seconds; green: request served, red: request failed", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _paired(records: dict[tuple[str, bool], dict[str, Any]], scenario: str) -> list[str]:
    without, with_ = records.get((scenario, False)), records.get((scenario, True))
    if without is None and with_ is None:
        return []
    out = [f"#### {TITLES[scenario]}", ""]
    steps = [h["step"] for h in (with_ or without or {}).get("health", [])]
    steps += [h["step"] for h in (without or {}).get("health", []) if h["step"] not in steps]
    if steps:  # r1 asks no health endpoint at steps
        out += ["| step | endpoint | without registrar | with registrar |", "|---|---|---|---|"]
    for step in steps:
        rows = [_health(r, step) for r in (without, with_)]
        for endpoint in ENDPOINTS:
            values = [row.get(endpoint, "-") for row in rows]
            out.append(f"| {step} | {endpoint} | {values[0]} | {values[1]} |")
    if steps:
        out.append("")
    return out + _figures(without, with_)


def tables(records: dict[tuple[str, bool], dict[str, Any]]) -> str:
    out = []
    for scenario in PAIRED:
        out += _paired(records, scenario)
    five = records.get(("5", True))
    if five is not None:
        out += [f"#### {TITLES['5']}", "", "| prompt | prefill/decode | single server |"]
        out.append("|---|---|---|")
        for row in five["figures"].get("outputs", []):
            out.append(f"| `{row['prompt']}` | `{row['pd'].strip()}` | `{row['single'].strip()}` |")
        out.append("")
    six = records.get(("6", True))
    if six is not None:
        out += [f"#### {TITLES['6']}", "", *_figures(None, six)]
    for scenario in (*TOPOLOGY, *MISCONFIG):
        out += _paired(records, scenario)
    return "\n".join(out)


def _health(record: dict[str, Any] | None, step: str) -> dict[str, Any]:
    if record is None:
        return {}
    return next((h for h in record["health"] if h["step"] == step), {})


def _figures(without: dict[str, Any] | None, with_: dict[str, Any] | None) -> list[str]:
    keys: list[str] = []
    for record in (without, with_):
        keys += [k for k in (record or {}).get("figures", {}) if k not in keys]
    lines = ["| measured | without registrar | with registrar |", "|---|---|---|"]
    for key in keys:
        values = [_show((r or {}).get("figures", {}).get(key, "-")) for r in (without, with_)]
        lines.append(f"| {key} | {values[0]} | {values[1]} |")
    for record, who in ((without, "without"), (with_, "with")):
        for note in (record or {}).get("notes", []):
            lines.append(f"\n_{who} registrar: {note}._")
    return [*lines, ""]


def _show(value: Any) -> str:
    if isinstance(value, dict) and all(isinstance(n, int) for n in value.values()):
        if not value:
            return "none"
        return "<br>".join(f"{n} x `{k[:90]}`" for k, n in value.items())  # counts of texts
    if isinstance(value, dict):
        return f"`{json.dumps(value)}`"
    return str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", type=Path)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--docs", action="store_true")
    opts = parser.parse_args()
    records = load(opts.results)
    out = opts.out or opts.results
    out.mkdir(parents=True, exist_ok=True)
    draw(records, out / "timeline.png")
    text = tables(records)
    (out / "report.md").write_text(text + "\n")
    print(f"report: {out / 'timeline.png'}, {out / 'report.md'}")
    if opts.docs:
        draw(records, DOCS / "e2e-timeline.png")
        doc = (DOCS / "e2e.md").read_text()
        head, _, rest = doc.partition(START)
        _, _, tail = rest.partition(END)
        (DOCS / "e2e.md").write_text(f"{head}{START}\n{text}\n{END}{tail}")
        print("docs: docs/e2e-timeline.png, docs/e2e.md")


if __name__ == "__main__":
    main()
