"""The plugin's gateway part without SGLang: what the worker is from SGLang's arguments, which
variables it honours or refuses, that the registrations start gated on the server's readiness,
and that at SIGTERM the drain runs before SGLang's own shutdown goes on. The real servers and
router are exercised in tests/e2e (test_gateway.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from registrar import ConfigError, _assembly
from registrar.integrations.sglang import _gateway as gateway
from registrar.integrations.sglang import _plugin as plugin
from registrar.integrations.sglang import _rows as rows
from registrar.integrations.sglang._settings import PluginConfig, read_config
from registrar.protocols._smg.settings import SmgSettings


def _args(mode: str = "null", host: str = "127.0.0.1", port: int = 30001, **kw: Any) -> Any:
    return SimpleNamespace(
        disaggregation_mode=mode,
        host=host,
        port=port,
        disaggregation_bootstrap_port=8998,
        ssl_certfile=None,
        **kw,
    )


def _gateway_at(url: str) -> gateway.GatewayConfig:
    return gateway.GatewayConfig(smg={"gateways": (url,)}, loop={})


def _configure(monkeypatch: pytest.MonkeyPatch, config: gateway.GatewayConfig) -> None:
    """The plugin's configuration as `load()` leaves it, with this gateway."""
    monkeypatch.setattr(rows, "_config", PluginConfig(registrar={}, gateway=config))


class FakeGroup:
    """Stands for the `RegistrarGroup` of smg registrars: records what is asked of it."""

    def __init__(self, calls: list[str], settings: SmgSettings, spec: Any, loop: Any):
        self.calls, self.settings, self.loop = calls, settings, loop
        self.gateways = list(settings.gateways)

    def start(self) -> FakeGroup:
        self.calls.append("start")
        return self

    def stop(self, timeout: float | None = None) -> bool:
        self.calls.append("drain")
        return True

    def statuses(self) -> tuple[Any, ...]:
        return ()

    def __iter__(self) -> Any:
        return iter(())

    def __len__(self) -> int:
        return len(self.gateways)


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Any:
    """What is asked of the group `gateway.start` builds, a `FakeGroup` from the builder it uses."""
    made: list[str] = []
    monkeypatch.setattr(_assembly, "smg_group", lambda *a: FakeGroup(made, *a))
    yield made
    gateway.drain("test end")


def _start(calls: list[str], config: gateway.GatewayConfig, args: Any) -> FakeGroup:
    group = gateway.start(config, args, lambda: True)
    assert isinstance(group, FakeGroup)
    assert group.calls is calls
    return group


@pytest.mark.parametrize(
    ("mode", "kind", "port"),
    [("prefill", "prefill", 8998), ("decode", "decode", None), ("null", "regular", None)],
)
def test_the_worker_is_what_sglang_s_arguments_say(mode: str, kind: str, port: int | None) -> None:
    worker = gateway.worker_of(_args(mode))
    assert (worker["worker_url"], worker["worker_type"], worker.get("bootstrap_port")) == (
        "http://127.0.0.1:30001",
        kind,
        port,
    )


def test_an_ipv6_host_is_bracketed_and_an_override_wins() -> None:
    assert gateway.worker_of(_args(host="::1"))["worker_url"] == "http://[::1]:30001"
    assert gateway.worker_of(_args(host="0.0.0.0"), "http://127.0.0.2:9")["worker_url"] == (
        "http://127.0.0.2:9"
    )


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_a_wildcard_host_needs_the_worker_url(host: str) -> None:
    with pytest.raises(ConfigError, match="REGISTRAR_WORKER_URL"):
        gateway.worker_of(_args(host=host))


def test_a_wildcard_host_stops_the_server_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    _configure(monkeypatch, _gateway_at("http://127.0.0.1:1"))
    manager = SimpleNamespace(is_ready=lambda: True)
    with pytest.raises(SystemExit, match=r"REGISTRAR_GATEWAY: --host 0\.0\.0\.0 is no address"):
        gateway.start_gateway(_args(host="0.0.0.0"), manager)


def test_the_gateway_variables_are_read(tmp_path: Any) -> None:
    key = tmp_path / "key"
    key.write_text("k\n")
    config = read_config(
        {
            "REGISTRAR_GATEWAY": "http://127.0.0.1:30000, http://127.0.0.1:30002",
            "REGISTRAR_WORKER_URL": "http://127.0.0.1:30001",
            "REGISTRAR_READY_GRACE": "3",
            "REGISTRAR_DRAIN_TIMEOUT": "7",
            "REGISTRAR_GATEWAY_KEY_FILE": str(key),
            "REGISTRAR_WATCH_INTERVAL": "2",
        }
    )
    assert config.gateway == gateway.GatewayConfig(
        smg={
            "gateways": ("http://127.0.0.1:30000", "http://127.0.0.1:30002"),
            "worker_url": "http://127.0.0.1:30001",
            "key_file": str(key),
            "grace": 3.0,
            "drain_timeout": 7.0,
        },
        loop={"watch_interval": 2.0},
    )
    assert read_config({}).gateway is None


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"REGISTRAR_DRAIN_TIMEOUT": "5"}, "REGISTRAR_DRAIN_TIMEOUT go with REGISTRAR_GATEWAY"),
        ({"REGISTRAR_WORKER_TYPE": "decode"}, "--disaggregation-mode"),
        ({"REGISTRAR_BOOTSTRAP_PORT": "8998"}, "--disaggregation-bootstrap-port"),
        ({"REGISTRAR_READY_URL": "http://127.0.0.1:1/ready"}, "own /ready"),
        (
            {"REGISTRAR_GATEWAY": "http://127.0.0.1:1", "REGISTRAR_GATEWAY_KEY_FILE": "/nope"},
            "REGISTRAR_GATEWAY_KEY_FILE",
        ),
    ],
)
def test_what_the_plugin_cannot_honour_is_one_line(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read_config(env)


def test_registrations_start_gated_on_readiness_with_the_server_s_worker(calls: list[str]) -> None:
    config = read_config(
        {
            "REGISTRAR_GATEWAY": "http://127.0.0.1:30000",
            "REGISTRAR_READY_GRACE": "3",
            "REGISTRAR_DRAIN_TIMEOUT": "7",
            "REGISTRAR_WATCH_INTERVAL": "2",
            "REGISTRAR_ON_FAILURE": "exit",
            "REGISTRAR_TOKEN": "bootstrap",
        }
    ).gateway
    assert config is not None
    group = _start(calls, config, _args("prefill"))
    assert calls == ["start"]
    settings = group.settings
    assert (group.gateways, settings.worker_url, settings.worker_type) == (
        ["http://127.0.0.1:30000"],
        "http://127.0.0.1:30001",
        "prefill",
    )
    assert callable(settings.ready)
    assert settings.ready() is True
    # The rank's failure policy and the bootstrap token are not the gateway's.
    assert (settings.grace, settings.drain_timeout, settings.bootstrap_port) == (3.0, 7.0, 8998)
    assert settings.key is None
    assert group.loop == {"watch_interval": 2.0, "max_attempts": None}
    assert gateway.drain("test") is not None
    assert calls == ["start", "drain"]
    assert gateway.drain("again") is None  # once


def test_the_drain_runs_at_sigterm_before_sglang_s_shutdown(calls: list[str]) -> None:
    _start(calls, _gateway_at("http://127.0.0.1:30000"), _args("decode"))

    class Manager:
        """SGLang's TokenizerManager as the wrapper sees it: a flag it polls (counted)."""

        exiting = False
        looks = 0

        @property
        def gracefully_exit(self) -> bool:
            self.looks += 1
            return self.exiting

    manager = Manager()

    async def watchdog(m: Any) -> str:
        calls.append("sglang shuts down")
        return "done"

    async def scenario() -> Any:
        task = asyncio.ensure_future(gateway.around_sigterm_watchdog(watchdog, manager))
        # The wrapper has looked at the flag three times and found no SIGTERM: by then it has
        # had every chance to act, and must not have.
        while manager.looks < 3 and not task.done():
            await asyncio.sleep(0.01)
        assert calls == ["start"], "nothing happens before SIGTERM"
        manager.exiting = True  # what SGLang's SIGTERM handler does
        return await asyncio.wait_for(task, 30)

    assert asyncio.run(scenario()) == "done"
    assert calls == ["start", "drain", "sglang shuts down"]


def test_without_a_gateway_sglang_s_watchdog_runs_unchanged() -> None:
    seen: list[str] = []

    async def watchdog(m: Any) -> None:
        seen.append("sglang")

    asyncio.run(gateway.around_sigterm_watchdog(watchdog, SimpleNamespace(gracefully_exit=False)))
    assert seen == ["sglang"]


def test_server_info_shows_the_gateway_beside_the_bootstrap(calls: list[str]) -> None:
    assert plugin.after_server_info({}) == {}
    _start(calls, _gateway_at("http://127.0.0.1:30000"), _args())
    assert plugin.after_server_info({}) == {"registrar_gateway": []}


def test_the_new_targets_are_hooked() -> None:
    assert "sglang.srt.entrypoints.http_server._setup_and_run_http_server" in plugin.TARGETS
    assert (
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog" in plugin.TARGETS
    )


def test_before_0_5_20_the_gateway_reads_the_plugins_readiness(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # SGLang 0.5.11-0.5.19's TokenizerManager has no is_ready: reading it killed node 0's HTTP
    # process. The gateway now gets the readiness 0.5.20 computes, with the table check.
    given: list[Any] = []
    monkeypatch.setattr(gateway, "start", lambda config, args, ready: given.append(ready))
    manager = SimpleNamespace(
        is_pause=False, gracefully_exit=False, server_status=SimpleNamespace(name="Starting")
    )
    _configure(monkeypatch, _gateway_at("http://127.0.0.1:30000"))
    gateway.start_gateway(_args("decode"), manager)
    [ready] = given
    assert ready() is False
    manager.server_status = SimpleNamespace(name="Up")
    assert ready() is True
