"""What the plugin will do in this environment's SGLang, read without starting any of it, behind
`registrar sglang`: below 0.5.11 SGLang never loads the plugin, so it cannot speak for itself."""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from . import _targets
from ._probe import SourceProbe, sglang_root

_FULL = (0, 5, 22)  # the first release with every target
_NOT_INSTALLED = (
    "SGLang is not installed in this Python environment: install sglang-registrar into "
    "the environment SGLang runs in (the plugin is loaded by SGLang there)"
)


def installed_report(root: Path | None = None, found_version: str | None = None) -> dict[str, Any]:
    """The report as a JSON-able dict (`registrar sglang --json`)."""
    root = root if root is not None else sglang_root()
    found_version = found_version if found_version is not None else _targets.installed_version()
    report: dict[str, Any] = {
        "python": sys.executable,
        "sglang": found_version,
        "path": str(root) if root is not None else None,
        "entry_point": any(
            ep.value == "registrar.integrations.sglang:load"
            for ep in entry_points(group="sglang.srt.plugins")
        ),
    }
    if root is None:
        report.update(installed=False, plugin_system=False, features=[], advice=_NOT_INSTALLED)
        return report
    has_plugins = (root / "srt" / "plugins" / "hook_registry.py").is_file()
    release = _targets.parse_release(found_version)
    mode = _targets.rust_server_mode(os.environ)
    current = _targets.plan(SourceProbe(root), release, mode)
    in_mode = _targets.plan(SourceProbe(root), release, rust_server=True)
    report.update(
        installed=True,
        plugin_system=has_plugins,
        features=[_feature(c) for c in current.choices] if has_plugins else [],
        rust_server={"set": mode, "not_there": [c.feature.name for c in in_mode.choices if c.mode]},
        advice=_advice(current, has_plugins),
    )
    return report


def _feature(choice: _targets.Choice) -> dict[str, Any]:
    target = choice.target
    return {
        "feature": choice.feature.name,
        "does": choice.feature.does,
        "available": target is not None,
        "target": target.path if target is not None else None,
        "hook": target.kind if target is not None else None,
        "why_not": choice.reason or None,
        "expected": choice.expected,
    }


def _advice(current: _targets.Plan, has_plugins: bool) -> str:
    newest = _targets.release_text(_targets.NEWEST_KNOWN)
    full = _targets.release_text(_FULL)
    if not has_plugins:
        return (
            "this SGLang has no plugin system (sglang.srt.plugins, added in "
            f"{_targets.release_text(_targets.OLDEST_WITH_PLUGINS)}): it never loads the plugin, "
            f"and its own registration runs. Upgrade to SGLang {full}-{newest} for every "
            "feature (0.5.13 or later for background registration, /ready and the decode "
            "check), or run `registrar register` as a sidecar (docs/sglang.md)"
        )
    missing = current.unexpected()
    lost = [c.feature.name for c in current.lost()]
    moded = [c.feature.name for c in current.choices if c.mode]
    if any(c.feature.required for c in missing):
        return "no registration hook found in this SGLang: the plugin would change nothing"
    if current.newer():
        return (
            f"newer than {newest}, the newest release the plugin knows: it applies the targets "
            "it finds"
            + (f" (missing: {', '.join(c.feature.name for c in missing)})" if missing else "")
        )
    if current.release is not None and current.release < _FULL and lost:
        return (
            f"the plugin works here without: {', '.join(lost)}; SGLang {full} "
            "or later has every feature"
        )
    if moded:
        return (
            f"with {_targets.RUST_MODE} the ranks register, but the plugin cannot provide "
            f"{', '.join(moded)} there (REGISTRAR_STRICT=1 refuses to start): unset it for them"
        )
    return "every feature the plugin has works on this SGLang"


def describe(report: dict[str, Any]) -> str:
    """The report for a person."""
    if not report["installed"]:
        return f"sglang: not installed ({report['python']})\nadvice: {report['advice']}\n"
    lines = [
        f"sglang {report['sglang'] or '(version unknown)'} at {report['path']}",
        f"plugin system: {'yes' if report['plugin_system'] else 'no (SGLang < 0.5.11)'}; "
        f"registrar's entry point installed: {'yes' if report['entry_point'] else 'no'}",
    ]
    if report["features"]:
        lines.append("what the plugin does there:")
        width = max(len(f["feature"]) for f in report["features"])
        for f in report["features"]:
            where = f"{f['hook']} {f['target']}"
            said = f"yes  {f['does']} ({where})" if f["available"] else f"no   {f['why_not']}"
            lines.append(f"  {f['feature']:<{width}}  {said}")
    lost = report["rust_server"]["not_there"] if report["features"] else []
    if lost and not report["rust_server"]["set"]:
        lines.append(
            f"with {_targets.RUST_MODE} (SGLang's Rust-server mode) the plugin cannot provide: "
            f"{', '.join(lost)} (run this with it set for why)"
        )
    lines.append(f"advice: {report['advice']}")
    return "\n".join(lines) + "\n"
