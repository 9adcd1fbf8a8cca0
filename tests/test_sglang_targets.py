"""The target table: the release parsing, which target each release gets (from synthetic
descriptions of what each release has, as read from the wheels), a newer release with targets
removed, the source reader the `registrar sglang` command uses, and the generated support table
in docs/sglang.md."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from docs.hooks.supportdoc import support_table
from registrar.integrations.sglang import _plugin as plugin
from registrar.integrations.sglang._probe import SourceProbe
from registrar.integrations.sglang._targets import (
    FEATURES,
    Plan,
    expected,
    parse_release,
    plan,
    rust_server_mode,
)

ROOT = Path(__file__).resolve().parent.parent

CONN = "sglang.srt.disaggregation.common.conn"
MC = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager"
TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
HTTP = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
SCHED = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"
CTRL = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
INFO = "sglang.srt.utils.common.build_server_info"
ROLE = "sglang.srt.disaggregation.role_switch.teardown_disaggregation"
REG = f"{CONN}.CommonKVManager.register_to_bootstrap"
ROW = f"{CONN}.CommonKVManager._register_topology_row"
HB = f"{CONN}.CommonKVManager._on_heartbeat_success"

PUTS = "def register_to_bootstrap(self):\n    requests.put(url, json=payload, timeout=5)\n"
CALLS_ROW = "def register_to_bootstrap(self):\n    self._register_topology_row(url, payload)\n"
OVERRIDE = "def _on_heartbeat_success(self, addr):\n    self.tracker.discard(addr)\n"


class FakeProbe:
    """What one release has: its paths, the methods a class defines itself, their source."""

    def __init__(self, paths: set[str], own: set[str] = frozenset(), src: dict[str, str] = {}):  # noqa: B006
        self.paths, self.owned, self.src = paths, own, src

    def has(self, path: str) -> bool:
        return path in self.paths

    def own(self, path: str) -> bool:
        return path in self.owned

    def source(self, path: str) -> str | None:
        return self.src.get(path)


def release(version: str) -> FakeProbe:
    """A release as read from its wheel (docs/sglang.md; the research notes)."""
    at = parse_release(version)
    assert at is not None
    paths = {HTTP, f"{TM}.sigterm_watchdog", SCHED, REG, f"{CONN}.requests"}
    src = {REG: CALLS_ROW if at >= (0, 5, 20) else PUTS}
    own = set()
    if at >= (0, 5, 13):
        paths |= {HB, f"{MC}._on_heartbeat_success"}  # the subclass inherits it or overrides it
        if at <= (0, 5, 19):
            own.add(f"{MC}._on_heartbeat_success")
            src[f"{MC}._on_heartbeat_success"] = OVERRIDE
    if at >= (0, 5, 20):
        paths |= {ROW, f"{TM}.is_ready"}
    if at >= (0, 5, 21):
        paths.add(ROLE)
    if at >= (0, 5, 22):
        paths |= {CTRL, INFO}
    return FakeProbe(paths, own, src)


def taken(found: Plan) -> dict[str, str]:
    return {c.feature.name: c.target.hook for c in found.choices if c.target is not None}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0.5.13", (0, 5, 13)),
        ("0.5.10.post1", (0, 5, 10)),
        ("0.5.24rc1", (0, 5, 24)),
        ("0.5.23.dev4+gabc123", (0, 5, 23)),
        ("v0.6", (0, 6, 0)),
        ("unknown", None),
        ("", None),
        (None, None),
    ],
)
def test_release_parsing(text: str | None, expected: tuple[int, int, int] | None) -> None:
    assert parse_release(text) == expected


def test_each_release_gets_its_targets_or_their_stand_ins() -> None:
    old = plan(release("0.5.11"), (0, 5, 11))
    assert taken(old) == {
        "registration": "capture_registration",
        "ready": "add_ready_route",
        "rank status": "after_internal_state",
        "gateway": "start_gateway",
        "drain": "around_sigterm_watchdog",
    }
    assert {c.feature.name for c in old.unavailable()} == {
        "role switch",
        "server status",
        "decode check",
        "decode check (Mooncake)",
    }
    assert old.unexpected() == []  # all of them below their release: said, not warned about
    mid = taken(plan(release("0.5.19"), (0, 5, 19)))
    assert mid["registration"] == "capture_registration"
    assert mid["decode check (Mooncake)"] == "after_heartbeat_success"
    assert [t.path for t in plan(release("0.5.13"), (0, 5, 13)).taken()].count(HB) == 1
    new = plan(release("0.5.20"), (0, 5, 20))
    assert taken(new)["registration"] == "register_row"
    assert taken(new)["ready"] == "around_is_ready"
    assert "decode check (Mooncake)" not in taken(new)  # inherits the common hook: not needed
    assert new.unexpected() == []
    newest = plan(release("0.5.23"), (0, 5, 23))
    [mooncake] = newest.unavailable()
    assert (mooncake.feature.name, mooncake.expected) == ("decode check (Mooncake)", True)
    assert [t.path for t in newest.taken() if t.path in (CTRL, SCHED)] == [CTRL]
    assert len(newest.taken()) == 8


def test_a_newer_release_without_some_targets_gets_the_rest() -> None:
    probe = release("0.5.24")
    probe.paths -= {ROLE, HB, f"{MC}._on_heartbeat_success"}
    found = plan(probe, (0, 5, 24))
    assert found.newer()
    assert {c.feature.name for c in found.unexpected()} == {"role switch", "decode check"}
    assert taken(found)["registration"] == "register_row"
    assert len(found.taken()) == 6


def test_the_puts_condition_keeps_the_capture_off_where_sglang_delegates_the_put() -> None:
    probe = release("0.5.23")
    probe.paths.discard(ROW)  # as if a release had dropped it: the capture would catch nothing
    found = plan(probe, (0, 5, 23))
    [missing] = found.unavailable()[:1]
    assert missing.feature.required
    assert not missing.expected
    assert "registration" not in taken(found)


def test_verify_logs_one_warning_naming_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    probe = release("0.5.24")
    probe.paths -= {ROLE}
    monkeypatch.setattr(plugin, "_plan", plan(probe, (0, 5, 24)))
    monkeypatch.setattr(plugin, "_registered", [])
    monkeypatch.setattr(plugin, "installed_version", lambda: "0.5.24")
    with caplog.at_level(logging.INFO, logger="registrar"):
        missing = plugin.verify(strict=True)  # a missing optional target never stops it
    assert missing == [ROLE]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "sglang 0.5.24 (newer than 0.5.23, the newest release the plugin knows)" in warning
    assert "role switch" in warning
    assert ROLE in warning
    [active] = [r.getMessage() for r in caplog.records if plugin.ACTIVE in r.getMessage()]
    assert "0 of 0 targets this sglang has applied" in active


def test_an_old_release_says_what_it_cannot_do_in_the_active_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(plugin, "_plan", plan(release("0.5.11"), (0, 5, 11)))
    monkeypatch.setattr(plugin, "_registered", [])
    monkeypatch.setattr(plugin, "installed_version", lambda: "0.5.11")
    with caplog.at_level(logging.INFO, logger="registrar"):
        assert plugin.verify(strict=True) == []
    [active] = [r.getMessage() for r in caplog.records if plugin.ACTIVE in r.getMessage()]
    assert "(captured from register_to_bootstrap)" in active
    assert "role switch" not in active  # nothing lost: that release has no role switch
    assert "not on this release: server status (no `registrar_bootstrap`" in active
    assert "decode check (no decode-side restart check" in active
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_the_source_reader_finds_methods_inherited_and_own(tmp_path: Path) -> None:
    root = tmp_path / "sglang"
    (root / "srt" / "disaggregation" / "common").mkdir(parents=True)
    (root / "srt" / "disaggregation" / "mooncake").mkdir(parents=True)
    (root / "srt" / "disaggregation" / "common" / "conn.py").write_text(
        "import requests\n\nclass CommonKVManager:\n"
        "    def register_to_bootstrap(self):\n"
        "        requests.put(url, json=payload, timeout=5)\n\n"
        "    def _on_heartbeat_success(self, addr):\n        pass\n"
    )
    (root / "srt" / "disaggregation" / "mooncake" / "conn.py").write_text(
        "from sglang.srt.disaggregation.common.conn import CommonKVManager\n\n"
        "class MooncakeKVManager(CommonKVManager):\n"
        "    def _on_heartbeat_success(self, addr):\n        self.x = 1\n\n"
        "class Other(CommonKVManager):\n    pass\n"
    )
    probe = SourceProbe(root)
    assert probe.has(REG)
    assert probe.has(f"{CONN}.requests")
    assert not probe.has(ROW)
    assert probe.has(f"{MC}._on_heartbeat_success")
    assert probe.own(f"{MC}._on_heartbeat_success")
    other = "sglang.srt.disaggregation.mooncake.conn.Other._on_heartbeat_success"
    assert probe.has(other)
    assert not probe.own(other)
    assert "requests.put(" in (probe.source(REG) or "")
    assert not probe.has("sglang.srt.plugins.hook_registry.HookRegistry")
    found = plan(probe, (0, 5, 13))
    assert taken(found)["registration"] == "capture_registration"
    assert taken(found)["decode check (Mooncake)"] == "after_heartbeat_success"


def test_every_feature_names_its_hooks_and_releases() -> None:
    for feature in FEATURES:
        for target in feature.candidates:
            assert target.hook in plugin.HOOKS, target
            assert plugin.HOOKS[target.hook].__name__ == target.hook, target  # as logs name it
            assert target.until is None or target.since <= target.until
    assert sum(f.required for f in FEATURES) == 1


def test_docs_carry_the_generated_support_table() -> None:
    text = (ROOT / "docs" / "sglang.md").read_text()
    begin, end = "<!-- support-table: begin -->\n", "<!-- support-table: end -->"
    assert begin in text, "docs/sglang.md lacks the support table markers"
    assert end in text, "docs/sglang.md lacks the support table markers"
    written = text.split(begin, 1)[1].split(end, 1)[0]
    assert written == support_table(), (
        "docs/sglang.md's support table differs from the target table: paste "
        "`python docs/hooks/supportdoc.py` between the markers"
    )


@pytest.mark.parametrize("patch", range(11, 24))
def test_the_table_and_the_probe_agree_on_every_known_release(patch: int) -> None:
    # What the table says a release has (its ranges) is what the probe finds in it.
    at = (0, 5, patch)
    assert [c.target for c in plan(release(f"0.5.{patch}"), at).choices] == expected(at)


RUST_LOST = {"ready", "rank status", "server status", "gateway", "drain"}
"""What cannot run in SGLang's Rust-server mode: no Python HTTP server or TokenizerManager."""


def test_the_rust_server_mode_takes_what_runs_there_and_names_the_rest() -> None:
    moded = plan(release("0.5.23"), (0, 5, 23), rust_server=True)
    assert {c.feature.name for c in moded.choices if c.mode} == RUST_LOST
    assert all(
        c in moded.lost() and "SGLANG_RUST_SERVER=1: " in c.reason for c in moded.choices if c.mode
    )
    assert set(taken(moded)) == {"registration", "role switch", "decode check"}
    before = plan(release("0.5.22"), (0, 5, 22), rust_server=True)  # no PD in that mode yet
    assert taken(before) == taken(plan(release("0.5.22"), (0, 5, 22)))


@pytest.mark.parametrize("strict", [False, True])
def test_in_the_rust_server_mode_the_active_line_names_what_does_not_run_strict_refuses(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, strict: bool
) -> None:
    monkeypatch.setattr(plugin, "_plan", plan(release("0.5.23"), (0, 5, 23), rust_server=True))
    monkeypatch.setattr(plugin, "_registered", [])
    monkeypatch.setattr(plugin, "installed_version", lambda: "0.5.23")
    with caplog.at_level(logging.INFO, logger="registrar"):
        if strict:
            with pytest.raises(SystemExit, match="cannot run with SGLANG_RUST_SERVER=1: ready"):
                plugin.verify(strict=True)
            assert not [r for r in caplog.records if plugin.ACTIVE in r.getMessage()]
            return
        plugin.verify(strict=False)
    [active] = [r.getMessage() for r in caplog.records if plugin.ACTIVE in r.getMessage()]
    assert "not on this release" not in active
    assert "; not with SGLANG_RUST_SERVER=1: ready (the Rust server answers /ready" in active
    assert all(f"{name} (" in active.split("not with")[1] for name in RUST_LOST)


def test_the_mode_is_read_as_sglang_reads_it() -> None:
    assert [rust_server_mode({"SGLANG_RUST_SERVER": v}) for v in ("1", "True", "y", "0", "")] == [
        True,
        True,
        True,
        False,
        False,
    ]
    assert not rust_server_mode({})
