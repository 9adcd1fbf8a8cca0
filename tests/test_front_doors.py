"""Every front door is typed and checked the same way: its keywords are the settings' fields
(mypy reports a misspelt one at the caller), a caller without a type checker gets one
`ConfigError` line naming it, and `registrar register --protocol NAME` works for every protocol
in the registry, refusing in one line each flag that protocol does not take."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Mapping
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from support import CLI_ENV, ScriptedTransport, accepted

from registrar import ConfigError, Registrar, register_protocol, smg_registrar
from registrar._assembly import EtcdRegistrarOptions, SmgRegistrarOptions
from registrar.core import _registry as registry
from registrar.core._backoff import Backoff
from registrar.core._registry import protocol_factory, protocol_names
from registrar.core._settings import (
    Hooks,
    HttpOptions,
    HttpSettings,
    LoopOptions,
    LoopSettings,
    Options,
)
from registrar.protocols._etcd.settings import EtcdOptions, EtcdSettings
from registrar.protocols._smg.settings import SmgOptions, SmgSettings
from registrar.protocols._smg.transport import DEFAULT_WATCH_INTERVAL
from registrar.surfaces._options import OPTIONS
from registrar.surfaces.cli import EXIT_USAGE, UsageError, build_parser, main
from registrar.surfaces.cli._register import _registrars, resolve


def _names(settings: type[Any], skip: int = 0) -> set[str]:
    return {f.name for f in dataclasses.fields(settings)[skip:] if f.init}


def test_each_typed_dict_is_its_settings_fields() -> None:
    """The keywords mypy checks are exactly the fields the values take: none missing, none extra."""
    assert set(LoopOptions.__annotations__) == _names(LoopSettings) | _names(Hooks)
    assert set(HttpOptions.__annotations__) == _names(HttpSettings, skip=1)
    assert set(Options.__annotations__) == set(LoopOptions.__annotations__) | _names(
        HttpSettings, skip=1
    )
    assert set(EtcdOptions.__annotations__) == _names(EtcdSettings, skip=2)
    assert set(SmgOptions.__annotations__) == _names(SmgSettings, skip=3)
    assert set(EtcdRegistrarOptions.__annotations__) == set(LoopOptions.__annotations__) | set(
        EtcdOptions.__annotations__
    )
    assert set(SmgRegistrarOptions.__annotations__) == set(LoopOptions.__annotations__) | set(
        SmgOptions.__annotations__
    ) | {"spec"}


_SNIPPET = """\
from registrar import HttpSettings, HttpTransport, Registrar, etcd_registrar, smg_registrar
from registrar import smg_registrars
from registrar.protocols._etcd.settings import EtcdSettings
from registrar.protocols._etcd.transport import EtcdTransport
from registrar.protocols._sglang import SGLangTransport
from registrar.protocols._smg.settings import SmgSettings
from registrar.protocols._smg.transport import SmgTransport

Registrar("http://127.0.0.1:1", {}, max_atempts=3)
etcd_registrar("http://127.0.0.1:2379", "/k", {}, tll=9)
smg_registrar("http://127.0.0.1:30000", "http://127.0.0.1:1", grase=5.0)
smg_registrars(["http://127.0.0.1:30000"], "http://127.0.0.1:1", drain_timout=5.0)
HttpTransport(HttpSettings("http://127.0.0.1:1", timout=1.0))
SGLangTransport(HttpSettings("http://127.0.0.1:1"), tiemout=1.0)
EtcdTransport(EtcdSettings("http://127.0.0.1:2379", "/k", keepalive=0.3))
SmgTransport(SmgSettings("http://127.0.0.1:30000", gracee=1.0))
"""


def test_mypy_reports_a_misspelt_option_at_every_front_door(tmp_path: Path) -> None:
    snippet = tmp_path / "callers.py"
    snippet.write_text(_SNIPPET)
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(snippet)],
        capture_output=True,
        text=True,
        check=False,
        cwd=root,
        env={**os.environ, "MYPYPATH": str(root)},
        timeout=300,
    )
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    reported = {int(line.split(":")[1]) for line in errors}
    calls = [
        number
        for number, line in enumerate(_SNIPPET.splitlines(), 1)
        if line and not line.startswith("from ")
    ]
    assert reported == set(calls), result.stdout
    assert all('Unexpected keyword argument "' in line for line in errors), result.stdout


def test_an_unknown_option_is_one_config_error_naming_it_and_the_fix() -> None:
    options: dict[str, Any] = {"max_atempts": 3}
    with pytest.raises(ConfigError, match=r"^Registrar got unexpected options max_atempts: .*"):
        Registrar("http://127.0.0.1:1", {}, **options)
    with pytest.raises(ConfigError, match=r"^protocol 'etcd' needs key \(fields of EtcdSettings\)"):
        Registrar("http://127.0.0.1:2379", {}, protocol="etcd")
    given = EtcdSettings("http://127.0.0.1:2379", "/k")
    with pytest.raises(ConfigError, match=r"settings of protocol 'sglang' must be a HttpSettings"):
        Registrar(payload={}, settings=given)
    with pytest.raises(ConfigError, match=r"^Registrar got unexpected options timeout, url: "):
        Registrar("http://127.0.0.1:2379", {}, protocol="etcd", settings=given, timeout=1.0)


def test_the_smg_watch_default_is_the_same_at_every_front_door(
    registrars: list[Registrar],
) -> None:
    spec = {"url": "http://127.0.0.1:30001", "worker_type": "decode"}
    by_name = Registrar("http://127.0.0.1:30000", spec, protocol="smg")
    by_door = smg_registrar("http://127.0.0.1:30000", "http://127.0.0.1:30001", "decode")
    chosen = Registrar("http://127.0.0.1:30000", spec, protocol="smg", watch_interval=None)
    registrars.extend([by_name, by_door, chosen])
    assert by_name.settings.watch_interval == by_door.settings.watch_interval
    assert by_name.settings.watch_interval == DEFAULT_WATCH_INTERVAL
    assert chosen.settings.watch_interval is None  # the caller's choice stands


def _value(example: str, tmp_path: Path) -> str:
    """The row's example, a real file where the row checks that one exists."""
    if not example.startswith("/"):
        return example
    path = tmp_path / Path(example).name
    path.write_text("x\n")
    return str(path)


def _refused_rows(protocol: str) -> list[Any]:
    """The flags of settings fields that `protocol`'s settings do not take."""
    names = _names(protocol_factory(protocol).settings, skip=1)
    return [
        o
        for o in OPTIONS
        if o.flag
        and (o.field is not None or o.key == "token_file")
        and o.settings not in (LoopSettings, Backoff)
        and o.key not in ("url", "etcd", "gateway")
        and ("token" if o.key == "token_file" else o.field) not in names
    ]


def _register(protocol: str, *more: str) -> list[str]:
    return ["register", "--url", "http://127.0.0.1:1", "--protocol", protocol, *more]


@pytest.fixture
def entry_point_protocol(monkeypatch: pytest.MonkeyPatch) -> str:
    """A protocol of another distribution's, with options of its own (its settings class)."""

    @dataclasses.dataclass(frozen=True)
    class QueueSettings:
        broker: str
        queue: str = "q"

    def build(
        payload: Mapping[str, Any], settings: QueueSettings
    ) -> tuple[ScriptedTransport, dict[str, Any]]:
        return ScriptedTransport([accepted()]), dict(payload)

    register_protocol("test-queue-cli", build, QueueSettings)
    # And one declared by another distribution's entry point (settings: `HttpSettings`).
    point = EntryPoint("test-entry", "support:scripted_protocol", registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(registry, "entry_points", lambda group: [point])
    for name in list(os.environ):
        if name.startswith("REGISTRAR_") or name == "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN":
            monkeypatch.delenv(name)
    return "test-queue-cli"


def test_register_refuses_each_flag_a_protocol_does_not_take_in_one_line(
    entry_point_protocol: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = protocol_names()
    assert {"etcd", "http", "sglang", "smg", "test-entry", entry_point_protocol} <= set(names)
    refused = 0
    for protocol in names:
        for row in _refused_rows(protocol):
            value = [] if row.parse.__name__ == "parse_flag" else [_value(row.example, tmp_path)]
            argv = _register(protocol, "--payload", '{"a": 1}', str(row.flag_name), *value)
            assert main(argv) == EXIT_USAGE, argv
            lines = capsys.readouterr().err.splitlines()
            assert len(lines) == 1, (argv, lines)
            assert row.flag_name in lines[0], lines
            assert f"protocol {protocol!r}" in lines[0], lines
            refused += 1
    assert refused > 20  # every protocol refuses some: the loop above did run
    said: list[str] = []
    for protocol in names:  # and the plain command makes its registration, or says why in a line
        args = build_parser().parse_args(_register(protocol, "--payload", '{"a": 1}'))
        try:
            group = _registrars(*resolve(args))
        except (UsageError, ConfigError) as exc:
            said.append(str(exc))
            continue
        assert len(group) == 1, protocol
    assert all("\n" not in line for line in said), said


@pytest.mark.parametrize("protocol", ["sglang", "http", "etcd", "smg"])
def test_register_runs_every_builtin_protocol_without_a_traceback(protocol: str) -> None:
    """As a new user would try it: a protocol it needs more for says so in one line (exit 2);
    one that can start does, fails against a closed port and exits by --on-failure exit (3)."""
    argv = [sys.executable, "-m", "registrar"]
    argv += _register(protocol, "--payload", '{"a":1}', "--max-attempts", "1")
    argv += ["--on-failure", "exit", "--diagnose-after", "off"]
    result = subprocess.run(
        argv, capture_output=True, text=True, check=False, timeout=60, env=CLI_ENV
    )
    assert "Traceback" not in result.stderr
    assert result.returncode in (EXIT_USAGE, 3), result.stderr
    if result.returncode == EXIT_USAGE:
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_register_asks_for_a_protocols_required_field(capsys: pytest.CaptureFixture[str]) -> None:
    # etcd by name takes --key (and says so when it is missing), as --etcd does.
    assert main(_register("etcd", "--payload", "{}", "--ttl", "9")) == EXIT_USAGE
    assert capsys.readouterr().err == "registrar: error: protocol 'etcd' needs --key\n"
