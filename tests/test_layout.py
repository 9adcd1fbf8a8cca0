"""The architecture the package layout promises: the core knows no protocol or surface,
protocols are resolved by name, transports may wait idle on a selectable waker, and the
environment is read through one table."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import select
import subprocess
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from support import FakeClock, ScriptedTransport, accepted, route, sglang_payload, wait_until

import registrar
from registrar import (
    ConfigError,
    HttpSettings,
    Registrar,
    Route,
    State,
    Transport,
    register_protocol,
)
from registrar.core import _registry as registry
from registrar.core._backoff import contact_delay
from registrar.core._clock import Waker
from registrar.core._registry import protocol_names
from registrar.core._settings import DEFAULT_BACKOFF
from registrar.surfaces._options import OPTIONS as ENV_VARS
from registrar.surfaces.env import describe_env, options_from_env

CORE = Path(registrar.__file__).parent / "core"


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", sorted(CORE.glob("*.py")), ids=lambda p: p.name)
def test_core_imports_no_protocol_surface_or_optional_dependency(module: Path) -> None:
    for name in _imports(module):
        assert not name.startswith(("..", "registrar.")), f"{module.name} imports {name}"
        assert name.split(".")[0] not in ("prometheus_client", "requests", "urllib3"), name


def test_builtin_protocols_are_registered() -> None:
    assert {"http", "sglang"} <= set(protocol_names())


def test_a_registered_protocol_is_used_by_name(registrars: list[Registrar]) -> None:
    made: list[HttpSettings] = []

    def factory(
        payload: Mapping[str, Any], options: HttpSettings
    ) -> tuple[Transport, dict[str, Any]]:
        made.append(options)
        return ScriptedTransport([accepted()]), {"normalised": True, **payload}

    register_protocol("test-scripted", factory)
    reg = Registrar("http://127.0.0.1:1", {"a": 1}, protocol="test-scripted", token="t")
    registrars.append(reg)
    assert made == [HttpSettings("http://127.0.0.1:1", token="t")]
    assert reg.payload == {"normalised": True, "a": 1}
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)


@dataclass(frozen=True)
class _QueueSettings:
    """A protocol's own settings value: its first field takes the URL."""

    broker: str
    queue: str
    depth: int = 1

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ConfigError(f"depth must be at least 1, got {self.depth}")


def test_a_protocol_with_options_of_its_own_is_one_factory_and_its_settings(
    registrars: list[Registrar],
) -> None:
    made: list[_QueueSettings] = []

    def factory(
        payload: Mapping[str, Any], settings: _QueueSettings
    ) -> tuple[Transport, dict[str, Any]]:
        made.append(settings)
        return ScriptedTransport([accepted()]), dict(payload)

    register_protocol("test-queue", factory, _QueueSettings)
    # Chosen by name; its options are split from the loop's by the settings' fields.
    reg = Registrar(
        "http://127.0.0.1:1", {"a": 1}, protocol="test-queue", queue="q", depth=3, max_attempts=2
    )
    registrars.append(reg)
    assert made == [_QueueSettings("http://127.0.0.1:1", "q", 3)]
    assert reg.settings.max_attempts == 2
    with pytest.raises(ConfigError, match="depth must be at least 1"):
        Registrar("http://127.0.0.1:1", {}, protocol="test-queue", queue="q", depth=0)
    with pytest.raises(ConfigError, match=r"unexpected options token: .*queue, depth"):
        Registrar("http://127.0.0.1:1", {}, protocol="test-queue", queue="q", token="t")
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)


def test_etcd_and_smg_are_chosen_by_name(registrars: list[Registrar]) -> None:
    reg = Registrar("http://127.0.0.1:2379", {"a": 1}, protocol="etcd", key="/k", ttl=9)
    registrars.append(reg)
    assert reg.settings.watch_interval == pytest.approx(2.0)  # derived from the TTL
    assert reg.status().url == "http://127.0.0.1:2379 key /k"
    spec = {"url": "http://127.0.0.1:30001", "worker_type": "decode"}
    smg = Registrar("http://127.0.0.1:30000", spec, protocol="smg", grace=5.0)
    registrars.append(smg)
    assert smg.payload == spec
    assert {"etcd", "smg"} <= set(protocol_names())


def test_unknown_protocol_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"protocol must be one of .*'http'.*'sglang'.*'nope'"):
        Registrar("http://127.0.0.1:1", sglang_payload(), protocol="nope")
    with pytest.raises(ConfigError, match="non-empty string"):
        register_protocol("", lambda p, o: (ScriptedTransport([accepted()]), dict(p)))


def test_waker_is_selectable_and_clears() -> None:
    waker = Waker()
    try:
        fd = waker.fileno()
        assert select.select([fd], [], [], 0)[0] == []
        waker.set()
        assert waker.is_set()
        assert select.select([fd], [], [], 1)[0] == [fd]
        waker.clear()
        assert not waker.is_set()
        assert select.select([fd], [], [], 0)[0] == []
    finally:
        waker.close()
    waker.set()  # still a flag after close
    assert waker.wait(0)


def test_waker_set_before_fileno_is_readable_at_once() -> None:
    waker = Waker()
    waker.set()
    try:
        assert select.select([waker.fileno()], [], [], 1)[0]
    finally:
        waker.close()


class IdleScripted(ScriptedTransport):
    """A scripted transport that waits idle: each call answers from `signals` (True: a sign
    the route is gone), then parks on the waker like a real idle wait."""

    def __init__(self, signals: list[bool], **kwargs: Any) -> None:
        super().__init__([accepted()], checks=[route(Route.PRESENT)], **kwargs)
        self.signals = list(signals)
        self.idle_calls: list[float] = []
        self.woken = threading.Event()

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        self.idle_calls.append(timeout)
        if self.signals:
            return self.signals.pop(0)
        if select.select([waker.fileno()], [], [], timeout)[0]:
            self.woken.set()
        return False


def test_an_idle_watcher_sign_makes_the_loop_check_at_once(
    clock: FakeClock, registrars: list[Registrar]
) -> None:
    transport = IdleScripted([True, True])
    reg = Registrar("http://127.0.0.1:1", {}, transport=transport, clock=clock, watch_interval=60)
    registrars.append(reg)
    reg.start()
    # One check right after the PUT, then one per sign, before any interval passed.
    assert wait_until(lambda: transport.checked == 3 and len(transport.idle_calls) >= 3)
    # Only the fleet's contact spread went by (a fleet of one: under 1 ms per sign), not the
    # 60 s timer: the signs triggered the checks.
    assert clock.now - clock.start < 2 * contact_delay(1, 0.999999)
    assert all(t > 0 for t in transport.idle_calls)
    assert len(transport.registered) == 1


def test_stop_wakes_an_idle_watcher_promptly(registrars: list[Registrar]) -> None:
    transport = IdleScripted([])
    reg = Registrar("http://127.0.0.1:1", {}, transport=transport, watch_interval=3600)
    registrars.append(reg)
    reg.start()
    assert wait_until(lambda: len(transport.idle_calls) == 1)
    assert reg.stop(timeout=5)
    assert transport.woken.is_set()


def test_env_table_reads_every_variable(tmp_path: Path) -> None:
    env = {
        "REGISTRAR_ON_FAILURE": "exit",
        "REGISTRAR_MAX_ATTEMPTS": "unlimited",
        "REGISTRAR_MAX_ELAPSED": "60",
        "REGISTRAR_WATCH_INTERVAL": "off",
        "REGISTRAR_TIMEOUT": "1,4",
        "REGISTRAR_MAX_RETRY_AFTER": "0",
        "REGISTRAR_DIAGNOSE_AFTER": "off",
        "REGISTRAR_VERIFY": "false",
        "REGISTRAR_CA_BUNDLE": str(tmp_path),  # a CA directory: checked when read
        "REGISTRAR_BACKOFF_INITIAL": "0.5",
        "REGISTRAR_BACKOFF_MAX": "10",
        "REGISTRAR_BACKOFF_MULTIPLIER": "3",
        "REGISTRAR_BACKOFF_JITTER": "0",
        "UNRELATED": "x",
    }
    library = {f"REGISTRAR_{v.name}" for v in ENV_VARS if v.kwarg is not None}
    assert library == set(env) - {"UNRELATED"}
    options = options_from_env(env)
    assert options == {
        "on_failure": "exit",
        "max_attempts": None,
        "max_elapsed": 60.0,
        "watch_interval": None,
        "timeout": (1.0, 4.0),
        "max_retry_after": 0.0,
        "diagnose_after": None,
        "verify": str(tmp_path),  # a CA bundle verifies, whatever REGISTRAR_VERIFY says
        "backoff": DEFAULT_BACKOFF.__class__(initial=0.5, maximum=10, multiplier=3, jitter=0),
    }
    assert options_from_env({"REGISTRAR_MAX_ATTEMPTS": " "}) == {}
    assert options_from_env(env, names=["ON_FAILURE"]) == {"on_failure": "exit"}
    assert "REGISTRAR_ON_FAILURE" in describe_env()


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("ON_FAILURE", "crash", "REGISTRAR_ON_FAILURE='crash' must be retry, stop or exit"),
        ("MAX_ATTEMPTS", "0", "REGISTRAR_MAX_ATTEMPTS='0' must be an integer >= 1"),
        ("MAX_ATTEMPTS", "five", "e.g. REGISTRAR_MAX_ATTEMPTS=5"),
        ("WATCH_INTERVAL", "-1", "REGISTRAR_WATCH_INTERVAL='-1' must be a positive number"),
        ("TIMEOUT", "1,2,3", "REGISTRAR_TIMEOUT='1,2,3' must be seconds, or connect,read"),
        ("TIMEOUT", "nan", "REGISTRAR_TIMEOUT='nan' must be a positive number"),
        ("VERIFY", "maybe", "REGISTRAR_VERIFY='maybe' must be true or false"),
        ("BACKOFF_JITTER", "2", "REGISTRAR_BACKOFF_JITTER='2' must be a number within [0, 1]"),
        ("BACKOFF_MULTIPLIER", "0.5", "REGISTRAR_BACKOFF_MULTIPLIER='0.5' must be a number >= 1"),
        ("TIMEOUT", "-1", "REGISTRAR_TIMEOUT='-1' must be a positive number of seconds"),
        ("CA_BUNDLE", "/nonexistent", "REGISTRAR_CA_BUNDLE='/nonexistent' is not a readable"),
    ],
)
def test_env_errors_name_the_variable_and_a_good_value(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        options_from_env({f"REGISTRAR_{name}": value})
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_no_function_of_the_package_is_above_mccabe_10() -> None:
    """The limits the package holds itself to, with no per-function exception (pyproject)."""
    root = Path(__file__).resolve().parent.parent
    found = subprocess.run(
        [
            sys.executable,
            "-m",
            "ruff",
            "check",
            "--isolated",
            "--select",
            "C901,PLR0911,PLR0912,PLR0915",
            "--config",
            "lint.mccabe.max-complexity = 10",
            "--output-format",
            "concise",
            str(root / "registrar"),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert found.returncode == 0, found.stdout + found.stderr
    assert "noqa: C901" not in "".join(p.read_text() for p in (root / "registrar").rglob("*.py"))


PACKAGE = Path(registrar.__file__).parent
MAX_MODULE_LINES = 500


def test_no_module_of_the_package_is_over_500_lines() -> None:
    """Small modules named after what they hold: a module that grows past the limit is split
    along its seams (as `protocols/etcd/` was)."""
    sizes = {
        str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    over = {name: size for name, size in sizes.items() if size > MAX_MODULE_LINES}
    assert not over, f"over {MAX_MODULE_LINES} lines: {over}"


PROTOCOLS = PACKAGE / "protocols"
ENGINE = ("core.registrar", "core.runner", "core.decide", "core.board", "core.actions")


def _resolved_imports(path: Path) -> list[tuple[str, str]]:
    """Each import of `path` as written and as the absolute module it names (a relative one
    resolved against the package `path` is in, however deep)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    package = ".".join(parts[:-1])
    return [
        (name, importlib.util.resolve_name(name, package) if name.startswith(".") else name)
        for name in _imports(path)
    ]


@pytest.mark.parametrize(
    "module", sorted(PROTOCOLS.rglob("*.py")), ids=lambda p: str(p.relative_to(PROTOCOLS))
)
def test_protocols_import_neither_surfaces_devtools_the_root_nor_the_engine(module: Path) -> None:
    """A protocol is a leaf beside the engine: it speaks the transport contract (core's values,
    errors, redaction) and nothing above it; the version comes from its own module. The same
    holds in a protocol's own folder (`protocols/etcd/`), at any depth."""
    for written, name in _resolved_imports(module):
        if not written.startswith("."):
            assert not name.startswith("registrar"), f"{module.name} imports {name}"
            continue
        assert name != "registrar", f"{module.name} imports the package root"
        inside = name.removeprefix("registrar.")
        assert not inside.startswith(("surfaces", "devtools", "integrations")), name
        assert not inside.startswith(ENGINE), f"{module.name} imports the engine: {name}"


def test_the_import_resolution_reaches_into_folders() -> None:
    """The rule above would pass vacuously if relative imports in a folder were misread."""
    found = dict(_resolved_imports(PROTOCOLS / "_etcd" / "client.py"))
    assert found["...core._redact"] == "registrar.core._redact"
    assert found[".._http"] == "registrar.protocols._http"
    assert dict(_resolved_imports(PROTOCOLS / "_etcd" / "transport.py"))[".client"] == (
        "registrar.protocols._etcd.client"
    )


HEALTH = PACKAGE / "surfaces" / "health"
HEALTH_READS = (
    "registrar._version",
    "registrar.core.",
    "registrar.surfaces.health.",
    "registrar.surfaces._httpserver",
    "registrar.surfaces.metrics",
)


@pytest.mark.parametrize(
    "module", sorted(HEALTH.rglob("*.py")), ids=lambda p: str(p.relative_to(HEALTH))
)
def test_health_reads_snapshots_only(module: Path) -> None:
    """Health turns status snapshots into answers: it imports the core's values, its own parts
    and the two sibling surfaces it serves with (metrics, the small HTTP server), never a
    protocol, the assembly, the devtools or another surface."""
    found = _resolved_imports(module)
    assert found, module
    for _, name in found:
        if name.startswith("registrar"):
            assert name.startswith(HEALTH_READS), f"{module.name} imports {name}"


def test_importing_the_protocols_registers_nothing() -> None:
    before = dict(registry._factories)
    importlib.reload(importlib.import_module("registrar.protocols"))
    assert registry._factories == before


def test_a_protocol_is_found_through_the_entry_point_group(
    monkeypatch: pytest.MonkeyPatch, registrars: list[Registrar]
) -> None:
    point = EntryPoint("test-entry", "support:scripted_protocol", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point])
    assert {"test-entry", "http", "sglang"} <= set(protocol_names())
    reg = Registrar("http://127.0.0.1:1", {"a": 1}, protocol="test-entry")
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)


SURFACES = Path(registrar.__file__).parent / "surfaces"


def _top_level_imports(path: Path) -> list[str]:
    """The imports a module runs when it is imported (not those inside a function)."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            found.append("." * node.level + (node.module or ""))
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize(
    "module", sorted(SURFACES.rglob("*.py")), ids=lambda p: str(p.relative_to(SURFACES))
)
def test_surfaces_import_devtools_only_inside_the_commands_that_need_them(module: Path) -> None:
    for name in _top_level_imports(module):
        assert "devtools" not in name, f"{module.name} imports {name} when imported"
        assert "integrations" not in name, f"{module.name} imports {name}"


def test_registrar_register_loads_neither_devtools_nor_the_status_client() -> None:
    code = (
        "import sys\nimport registrar.surfaces.cli, registrar.surfaces.cli._register\n"
        "loaded = [m for m in sys.modules if m.startswith('registrar.devtools')]\n"
        "assert not loaded, loaded\n"
        "assert 'registrar.surfaces.cli._status' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_settings_live_with_their_layer() -> None:
    """Loop and HTTP settings in the engine's package; a protocol's next to it (no engine)."""
    from registrar.core import _settings as settings  # noqa: PLC0415
    from registrar.protocols._etcd import settings as etcd_settings  # noqa: PLC0415
    from registrar.protocols._smg import settings as smg_settings  # noqa: PLC0415

    assert settings.LoopSettings.__module__ == "registrar.core._settings"
    for module in (etcd_settings, smg_settings):
        for name in _imports(Path(str(module.__file__))):
            assert not name.startswith(("...surfaces", "...devtools", "...core._registrar")), name
