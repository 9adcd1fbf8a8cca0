"""docs/sglang.md's support tables, drawn from the plugin's target table
(`registrar/integrations/sglang/_targets.py`) so the page cannot drift from what the plugin hooks:

    python docs/hooks/supportdoc.py   # paste between the page's support-table markers

tests/test_sglang_targets.py checks the page carries this output.
"""

from __future__ import annotations

import sys
from itertools import groupby

from registrar.integrations.sglang._targets import (
    FEATURES,
    NEWEST_KNOWN,
    OLDEST_WITH_PLUGINS,
    RUST_MODE,
    RUST_SERVER,
    Target,
    expected,
    release_text,
)

__all__ = ["main", "support_table"]


def _releases(target: Target) -> str:
    start = release_text(target.since)
    if target.until is None:
        return f"{start}+"
    return start if target.until == target.since else f"{start}-{release_text(target.until)}"


def support_table() -> str:
    """One row per run of releases the table treats alike, then one per feature."""
    width = len(FEATURES) + 1  # the features and the Rust-server mode
    lost = ", ".join(f.name for f in FEATURES if f.rust_server)
    lines = [
        "| SGLang | Targets | " + " | ".join(f.name for f in FEATURES) + f" | {RUST_MODE} |",
        "|---|---|" + "---|" * width,
        f"| < {release_text(OLDEST_WITH_PLUGINS)} | 0 | never loaded: no `sglang.srt.plugins` "
        "(`registrar sglang` says so) |" + " |" * (width - 1),
    ]
    patches = range(OLDEST_WITH_PLUGINS[2], NEWEST_KNOWN[2] + 1)
    for (row, mode), run in groupby(
        patches, lambda patch: (expected((0, 5, patch)), (0, 5, patch) >= RUST_SERVER)
    ):
        first, *rest = (release_text((0, 5, patch)) for patch in run)
        name = f"{first}-{rest[-1]}" if rest else first
        cells = [
            "-" if t is None else ("stand-in" if t is not f.candidates[0] else "yes")
            for f, t in zip(FEATURES, row, strict=True)
        ]
        cells.append(f"without {lost}" if mode else "-")
        count = sum(t is not None for t in row)
        lines.append(f"| {name} | {count} | " + " | ".join(cells) + " |")
    lines += [
        f"| > {release_text(NEWEST_KNOWN)} | what it has | the targets found, one WARNING "
        "naming those missing |" + " |" * (width - 1),
        "",
        f"| Feature | What it does | Target (hook) | Releases | Without it | With {RUST_MODE} |",
        "|---|---|---|---|---|---|",
    ]
    for feature in FEATURES:
        targets = "<br>".join(
            f"`{t.path.rsplit('.', 2)[-2]}.{t.path.rsplit('.', 1)[-1]}` ({t.kind})"
            for t in feature.candidates
        )
        releases = "<br>".join(_releases(t) for t in feature.candidates)
        name = f"**{feature.name}**" if feature.required else feature.name
        mode = f"no: {feature.rust_server}" if feature.rust_server else "yes"
        lines.append(
            f"| {name} | {feature.does} | {targets} | {releases} | {feature.without} | {mode} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    sys.stdout.write(support_table())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
