"""`registrar sglang`: what the plugin does in the installed SGLang, read from its source; here
with no SGLang installed, and on a synthetic SGLang tree of an old and a current release."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from registrar.integrations.sglang._report import describe, installed_report


def test_without_sglang_it_says_so_clearly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "registrar", "sglang"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sglang: not installed (")
    assert "install sglang-registrar into the environment SGLang runs in" in done.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "registrar", "sglang", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    report = json.loads(as_json.stdout)
    assert (report["installed"], report["sglang"], report["features"]) == (False, None, [])


def _tree(tmp_path: Path, plugins: bool, topology_row: bool) -> Path:
    root = tmp_path / "sglang"
    conn = root / "srt" / "disaggregation" / "common"
    conn.mkdir(parents=True)
    put = "        requests.put(url, json=payload, timeout=5)\n"
    body = "        self._register_topology_row(url, payload)\n" if topology_row else put
    extra = "    def _register_topology_row(self, url, payload):\n" + put if topology_row else ""
    (conn / "conn.py").write_text(
        "import requests\n\nclass CommonKVManager:\n"
        "    def register_to_bootstrap(self):\n" + body + extra
    )
    if plugins:
        (root / "srt" / "plugins").mkdir(parents=True)
        (root / "srt" / "plugins" / "hook_registry.py").write_text("class HookRegistry: ...\n")
    return root


def test_below_the_plugin_system_it_gives_the_upgrade_advice(tmp_path: Path) -> None:
    report = installed_report(_tree(tmp_path, plugins=False, topology_row=False), "0.5.10")
    assert (report["installed"], report["plugin_system"], report["features"]) == (True, False, [])
    text = describe(report)
    assert "plugin system: no (SGLang < 0.5.11)" in text
    assert "never loads the plugin" in text
    assert "Upgrade to SGLang 0.5.22-0.5.23 for every feature" in text


def test_an_old_release_with_plugins_names_what_it_gets(tmp_path: Path) -> None:
    report = installed_report(_tree(tmp_path, plugins=True, topology_row=False), "0.5.12")
    features = {f["feature"]: f for f in report["features"]}
    assert features["registration"]["available"]
    assert features["registration"]["target"].endswith("register_to_bootstrap")
    assert not features["decode check"]["available"]
    assert "no heartbeat hook" in features["decode check"]["why_not"]
    assert "the plugin works here without: " in report["advice"]
    newer = installed_report(_tree(tmp_path / "n", plugins=True, topology_row=True), "0.5.30")
    found = {f["feature"]: f for f in newer["features"]}
    assert found["registration"]["target"].endswith("_register_topology_row")
    assert "newer than 0.5.23" in newer["advice"]


def test_the_rust_server_mode_is_named_with_or_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = _tree(tmp_path, plugins=True, topology_row=True)
    lost = ["ready", "rank status", "server status", "gateway", "drain"]
    monkeypatch.delenv("SGLANG_RUST_SERVER", raising=False)
    report = installed_report(root, "0.5.23")
    assert report["rust_server"] == {"set": False, "not_there": lost}
    assert (
        "with SGLANG_RUST_SERVER=1 (SGLang's Rust-server mode) the plugin cannot provide: "
        "ready, rank status, server status, gateway, drain" in describe(report)
    )
    monkeypatch.setenv("SGLANG_RUST_SERVER", "1")
    moded = installed_report(root, "0.5.23")
    features = {f["feature"]: f for f in moded["features"]}
    assert features["registration"]["available"]
    assert all(features[name]["why_not"].startswith("SGLANG_RUST_SERVER=1: ") for name in lost)
    assert "(REGISTRAR_STRICT=1 refuses to start)" in moded["advice"]
    assert installed_report(root, "0.5.22")["rust_server"]["not_there"] == []  # no PD there
