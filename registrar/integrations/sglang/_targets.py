"""Per feature, the SGLang targets the plugin can hook, best first, with the releases that have
each (read from the wheels), so that an older release is not "missing" targets it never had.
Imports no SGLang: a `Probe` answers what is installed. docs/sglang.md "Supported releases"."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Literal, Protocol

Release = tuple[int, int, int]  # `.postN`, `rcN` and local parts are ignored

OLDEST_WITH_PLUGINS: Release = (0, 5, 11)  # the first with `sglang.srt.plugins`
NEWEST_KNOWN: Release = (0, 5, 23)  # the newest whose targets were read from its wheel
RUST_SERVER: Release = (0, 5, 23)  # PD in SGLang's Rust-server mode (upstream PR #33125)
RUST_MODE = "SGLANG_RUST_SERVER=1"

_RELEASE = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?")


def parse_release(text: str | None) -> Release | None:
    """`0.5.13.post1` -> (0, 5, 13), `0.5.24rc1` -> (0, 5, 24); None: no version."""
    found = _RELEASE.match(text or "")
    if found is None:
        return None
    major, minor, patch = found.groups()
    return int(major), int(minor), int(patch or 0)


def installed_version() -> str | None:
    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def rust_server_mode(environ: Mapping[str, str]) -> bool:
    """`SGLANG_RUST_SERVER` as SGLang's `EnvBool` reads it."""
    return environ.get("SGLANG_RUST_SERVER", "").lower() in ("true", "1", "yes", "y")


def release_text(release: Release) -> str:
    return ".".join(str(part) for part in release)


Condition = Literal["exists", "own", "puts"]
"""How a target is found: `exists` (the attribute resolves); `own` (the class defines the method
itself and does not call `super()`: an override that hides the common method); `puts` (the
function sends SGLang's PUT itself with the module-level `requests`)."""


class Probe(Protocol):
    """What the installed SGLang has: by importing it (the plugin) or reading its source."""

    def has(self, path: str) -> bool: ...
    def own(self, path: str) -> bool: ...  # the class defines the method itself
    def source(self, path: str) -> str | None: ...


@dataclass(frozen=True)
class Target:
    """`since`..`until` (None: open): the releases that have `path`."""

    path: str
    kind: Literal["REPLACE", "BEFORE", "AROUND", "AFTER"]
    hook: str
    since: Release
    until: Release | None = None
    condition: Condition = "exists"

    def found(self, probe: Probe) -> bool:
        has = probe.has(self.path)
        if not has or self.condition == "exists":
            return has
        text = probe.source(self.path)
        if self.condition == "own":
            return probe.own(self.path) and text is not None and "super()" not in text
        module = self.path.rsplit(".", 2)[0]  # "puts"
        return probe.has(f"{module}.requests") and text is not None and "requests.put(" in text


@dataclass(frozen=True)
class Feature:
    """`required`: without it the plugin has no reason to be there (an ERROR, and
    `REGISTRAR_STRICT=1` stops the process); `loss` False: a release without it needs nothing;
    `rust_server`: why it cannot run in SGLang's Rust-server mode (empty: it runs there)."""

    name: str
    does: str
    candidates: tuple[Target, ...]
    without: str
    required: bool = False
    loss: bool = True
    rust_server: str = ""

    def covering(self, release: Release | None) -> list[Target]:
        """The candidates `release` has; None: an unknown release, taken as the newest."""
        at = release or (999, 0, 0)
        return [t for t in self.candidates if t.since <= at and (t.until is None or at <= t.until)]


_KV = "sglang.srt.disaggregation.common.conn.CommonKVManager"
_REGISTER = f"{_KV}.register_to_bootstrap"
_MOONCAKE_HB = "sglang.srt.disaggregation.mooncake.conn.MooncakeKVManager._on_heartbeat_success"
_TM = "sglang.srt.managers.tokenizer_manager.TokenizerManager"
_HTTP_START = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
_ROLE_SWITCH = "sglang.srt.disaggregation.role_switch.teardown_disaggregation"
_SERVER_INFO = "sglang.srt.utils.common.build_server_info"
_CTRL = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
_SCHED = "sglang.srt.managers.scheduler.Scheduler.get_internal_state"

FEATURES: tuple[Feature, ...] = (
    Feature(
        "registration",
        "prefill ranks register in the background, looked-first and counted once",
        (
            Target(f"{_KV}._register_topology_row", "REPLACE", "register_row", (0, 5, 20)),
            Target(_REGISTER, "AROUND", "capture_registration", (0, 5, 11), (0, 5, 19), "puts"),
        ),
        "SGLang's own blocking registration stands (no hook point)",
        required=True,
    ),
    Feature(
        "ready",
        "/ready is false until the node-0 bootstrap server holds every row",
        (
            Target(f"{_TM}.is_ready", "AROUND", "around_is_ready", (0, 5, 20)),
            Target(_HTTP_START, "BEFORE", "add_ready_route", (0, 5, 11), (0, 5, 19)),
        ),
        "no /ready gated on the table",
        rust_server="the Rust server answers /ready (404) and holds the bootstrap table, "
        "neither reachable from Python",
    ),
    Feature(
        "role switch",
        "a PD role switch stops the rank's registrars first",
        (Target(_ROLE_SWITCH, "BEFORE", "before_teardown", (0, 5, 21)),),
        "nothing to do: this release has no PD role switch",
        loss=False,
    ),
    Feature(
        "rank status",
        "/server_info's internal_states[i] carry each rank's registrations (`registrar`)",
        (
            Target(f"{_CTRL}.get_internal_state", "AFTER", "after_internal_state", (0, 5, 22)),
            Target(_SCHED, "AFTER", "after_internal_state", (0, 5, 11), (0, 5, 21)),
        ),
        "no `registrar` field in /server_info's internal states",
        rust_server="the Rust server's /server_info shows no rank's `registrar` rows",
    ),
    Feature(
        "server status",
        "/server_info carries `registrar_bootstrap` (missing rows) and `registrar_gateway`",
        (Target(_SERVER_INFO, "AFTER", "after_server_info", (0, 5, 22)),),
        "no `registrar_bootstrap`/`registrar_gateway` in /server_info: before 0.5.22 SGLang "
        "builds it inside its route, which no hook reaches (/ready and the ranks' internal "
        "states still tell)",
        rust_server="the Rust server answers /server_info and holds the bootstrap table",
    ),
    Feature(
        "decode check",
        "a decode drops a restarted prefill's stale cached addresses",
        (Target(f"{_KV}._on_heartbeat_success", "AFTER", "after_heartbeat_success", (0, 5, 13)),),
        "no decode-side restart check: this release has no heartbeat hook",
    ),
    Feature(
        "decode check (Mooncake)",
        "the same check where Mooncake overrides the heartbeat hook without super()",
        (Target(_MOONCAKE_HB, "AFTER", "after_heartbeat_success", (0, 5, 13), (0, 5, 19), "own"),),
        "nothing to do: Mooncake uses the common heartbeat hook",
        loss=False,
    ),
    Feature(
        "gateway",
        "with REGISTRAR_GATEWAY, node 0 keeps the server listed by smg once /ready holds",
        (Target(_HTTP_START, "BEFORE", "start_gateway", (0, 5, 10)),),
        "REGISTRAR_GATEWAY has no effect",
        rust_server="no Python HTTP server starts, so its hook never runs: run "
        "`registrar register --gateway` beside the server",
    ),
    Feature(
        "drain",
        "with REGISTRAR_GATEWAY, SIGTERM drains from the gateway before SGLang stops serving",
        (Target(f"{_TM}.sigterm_watchdog", "AROUND", "around_sigterm_watchdog", (0, 4, 0)),),
        "no drain at SIGTERM (only at process exit)",
        rust_server="no TokenizerManager runs its SIGTERM watchdog",
    ),
)


@dataclass(frozen=True)
class Choice:
    """`expected` False: the release should have had a target (a WARNING); `mode`: lost to the
    Rust-server mode, not to the release."""

    feature: Feature
    target: Target | None
    reason: str = ""
    expected: bool = True
    mode: bool = False


@dataclass(frozen=True)
class Plan:
    release: Release | None
    choices: tuple[Choice, ...]

    def taken(self) -> list[Target]:
        return [c.target for c in self.choices if c.target is not None]

    def unavailable(self) -> list[Choice]:
        return [c for c in self.choices if c.target is None]

    def unexpected(self) -> list[Choice]:
        return [c for c in self.unavailable() if not c.expected]

    def lost(self) -> list[Choice]:
        """What this release cannot do and a newer one can (or this one outside the mode)."""
        return [c for c in self.unavailable() if c.expected and c.feature.loss]

    def newer(self) -> bool:
        return self.release is not None and self.release > NEWEST_KNOWN


def plan(probe: Probe, release: Release | None, rust_server: bool = False) -> Plan:
    """Per feature, the first candidate `probe` finds. A feature with none is `expected` when no
    candidate's releases cover `release` (below its range, or a stand-in whose range ended).
    `rust_server` (SGLANG_RUST_SERVER on a release with PD there): what cannot run is not taken."""
    choices = []
    mode = rust_server and (release is None or release >= RUST_SERVER)
    for feature in FEATURES:
        if mode and feature.rust_server:
            choices.append(Choice(feature, None, f"{RUST_MODE}: {feature.rust_server}", mode=True))
            continue
        found = next((t for t in feature.candidates if t.found(probe)), None)
        if found is not None:
            choices.append(Choice(feature, found))
            continue
        covering = feature.covering(release)
        names = ", ".join(t.path for t in covering)
        reason = f"{feature.without}: {names} not found" if covering else feature.without
        choices.append(Choice(feature, None, reason, expected=not covering))
    return Plan(release, tuple(choices))


def expected(release: Release) -> list[Target | None]:
    return [next(iter(f.covering(release)), None) for f in FEATURES]
