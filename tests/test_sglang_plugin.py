"""The SGLang plugin's parts that need no SGLang: loading `registrar` imports none of it, its
configuration is validated with one error naming the variable, every `REGISTRAR_*` variable is
honoured or refused, a patch that cannot apply names its cause, and readiness reads the table
rather than the count. SGLang's real code is exercised in tests/sglang_real."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from bootstrap_lab import BootstrapLab
from support import ScriptedTransport, accepted, sglang_payload

from registrar import ConfigError, Registrar, State, __version__
from registrar.integrations.sglang import _plugin as plugin
from registrar.integrations.sglang import _rows as rows
from registrar.integrations.sglang._plugin import SUPPORTED_VERSIONS, TARGETS
from registrar.integrations.sglang._settings import (
    HONOURED,
    PLUGIN_ENV_VARS,
    REFUSED,
    describe_plugin_env,
    plugin_env_table,
    read_config,
)
from registrar.integrations.sglang._tables import bootstrap_summary, table_complete
from registrar.surfaces._options import OPTIONS as ENV_VARS


def test_importing_registrar_and_the_plugin_imports_no_sglang() -> None:
    code = (
        "import sys, registrar, registrar.integrations.sglang\n"
        "print([m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_entry_point_is_declared() -> None:
    from importlib.metadata import entry_points  # noqa: PLC0415

    found = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "registrar"]
    assert [ep.value for ep in found] == ["registrar.integrations.sglang:load"]


def test_configuration_from_the_environment() -> None:
    config = read_config(
        {
            "REGISTRAR_ON_FAILURE": "exit",
            "REGISTRAR_MAX_ATTEMPTS": "unlimited",
            "REGISTRAR_WATCH_INTERVAL": "2",
            "REGISTRAR_INIT_WAIT": "30",
        }
    )
    assert config.registrar == {"on_failure": "exit", "max_attempts": None, "watch_interval": 2.0}
    assert config.init_wait == 30.0
    assert (config.strict, config.verbose, config.warnings) == (False, False, ())
    assert read_config({}).init_wait == 0.0
    assert "REGISTRAR_INIT_WAIT" in describe_plugin_env()


def test_every_shared_variable_is_honoured_or_refused_by_the_plugin() -> None:
    # A variable added to the shared table must be decided on here, never silently ignored.
    names = {v.name for v in ENV_VARS}
    assert set(HONOURED) | set(REFUSED) == names
    assert not set(HONOURED) & set(REFUSED)
    assert {"TOKEN", "TOKEN_FILE", "VERBOSE", "ON_FAILURE", "TIMEOUT"} <= set(HONOURED)
    # The plugin's own variables are its own: not in the shared table.
    assert not {v.name for v in PLUGIN_ENV_VARS} & names
    described = [line.split(":")[0] for line in describe_plugin_env().splitlines()]
    assert described == ["REGISTRAR_" + v.name for v in plugin_env_table()]
    assert "REGISTRAR_HEALTH_PORT" not in described
    assert {"REGISTRAR_INIT_WAIT", "REGISTRAR_STRICT", "REGISTRAR_TOKEN_FILE"} <= set(described)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_variable_the_plugin_cannot_honour_is_refused_in_one_line(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_config({f"REGISTRAR_{name}": "x"})
    message = str(caught.value)
    assert message.startswith(f"REGISTRAR_{name} is not read by the SGLang plugin: ")
    assert message.endswith("; unset it")
    assert "\n" not in message
    read_config({f"REGISTRAR_{name}": ""})  # set but empty: as unset


def test_the_token_and_its_file_reach_every_registrar(tmp_path) -> None:
    assert read_config({"REGISTRAR_TOKEN": "s3cret"}).registrar["token"] == "s3cret"
    with pytest.raises(ConfigError, match=r"^REGISTRAR_TOKEN must be one line of visible ASCII"):
        read_config({"REGISTRAR_TOKEN": "two words"})
    path = tmp_path / "token"
    path.write_text("first\n")
    env = {"REGISTRAR_TOKEN_FILE": str(path), "REGISTRAR_TOKEN": "ignored"}
    provider = read_config(env).registrar["token"]
    assert provider() == "first"  # the file wins over the fixed token, as for the command
    path.write_text("rotated\n")
    assert provider() == "rotated"  # read before each request
    with pytest.raises(ConfigError, match=r"^cannot read REGISTRAR_TOKEN_FILE '.*missing'"):
        read_config({"REGISTRAR_TOKEN_FILE": str(tmp_path / "missing")})
    path.write_text("")
    with pytest.raises(ConfigError, match=r"^REGISTRAR_TOKEN_FILE '.*token' is empty$"):
        read_config({"REGISTRAR_TOKEN_FILE": str(path)})


def test_verbose_strict_and_a_mistyped_name() -> None:
    config = read_config(
        {
            "REGISTRAR_VERBOSE": "1",
            "REGISTRAR_STRICT": "yes",
            "REGISTRAR_MAX_ATEMPTS": "3",
            "REGISTRAR_SOMETHING_ELSE": "1",  # not close to any variable: another tool's
        }
    )
    assert (config.verbose, config.strict) == (True, True)
    assert config.warnings == (
        "REGISTRAR_MAX_ATEMPTS is not a registrar variable (ignored); "
        "did you mean REGISTRAR_MAX_ATTEMPTS?",
    )


def test_a_bad_variable_stops_the_load_with_one_line_printed_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The line is SystemExit's message, which the interpreter prints; logging it as well
    # printed it twice.
    monkeypatch.setattr(rows, "_config", None)
    monkeypatch.setenv("REGISTRAR_MAX_ATTEMPTS", "many")
    with caplog.at_level("DEBUG"), pytest.raises(SystemExit) as caught:
        plugin.load()
    assert caught.value.code == (
        "sglang-registrar's SGLang plugin: REGISTRAR_MAX_ATTEMPTS='many' must be an integer "
        ">= 1, or unlimited; e.g. REGISTRAR_MAX_ATTEMPTS=5"
    )
    assert caplog.records == []


def test_a_patch_that_cannot_apply_names_its_cause(caplog: pytest.LogCaptureFixture) -> None:
    # No SGLang in this environment: no registration hook, with the ImportError named.
    with caplog.at_level("INFO", logger="registrar"):
        missing = plugin.verify(strict=False)
    assert "sglang.srt.disaggregation.common.conn.CommonKVManager._register_topology_row" in missing
    [record] = [r for r in caplog.records if r.levelname == "ERROR"]
    line = record.getMessage()
    assert line.startswith(f"sglang-registrar {__version__} could not patch ")
    assert "_register_topology_row (ModuleNotFoundError: No module named 'sglang')" in line
    assert "REGISTRAR_STRICT=1 stops the server instead" in line
    assert "\n" not in line
    assert not [r for r in caplog.records if plugin.ACTIVE in r.getMessage()]
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "sglang unknown (a release the plugin cannot read) lacks targets" in warning
    with pytest.raises(SystemExit) as caught:
        plugin.verify(strict=True)
    assert str(caught.value.code).endswith("REGISTRAR_STRICT=1: stopping")
    assert "ModuleNotFoundError" in str(caught.value.code)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("REGISTRAR_ON_FAILURE", "crash"),
        ("REGISTRAR_MAX_ATTEMPTS", "many"),
        ("REGISTRAR_WATCH_INTERVAL", "-1"),
        ("REGISTRAR_INIT_WAIT", "soon"),
    ],
)
def test_a_bad_variable_is_one_error_naming_it(name: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        read_config({name: value})
    message = str(caught.value)
    assert message.startswith(f"{name}={value!r}")
    assert "\n" not in message


def _server(sizes: tuple[object, ...], rows: list[tuple[int, int, int, int]]) -> SimpleNamespace:
    table: dict[int, dict[int, dict[int, dict[int, object]]]] = {}
    for dp, cp, tp, pp in rows:
        table.setdefault(dp, {}).setdefault(cp, {}).setdefault(tp, {})[pp] = object()
    dp_size, cp_size, tp_size, pp_size = sizes
    return SimpleNamespace(
        dp_size=dp_size,
        attn_cp_size=cp_size,
        attn_tp_size=tp_size,
        pp_size=pp_size,
        prefill_port_table=table,
        _registered_count=len(rows),
    )


def test_readiness_needs_every_row_not_a_count() -> None:
    assert not table_complete(_server((None, None, None, None), []))
    assert not table_complete(_server((1, 1, 2, 1), [(0, 0, 0, 0)]))
    doubled = _server((1, 1, 2, 1), [(0, 0, 0, 0)])
    doubled._registered_count = 2  # the real server counts a second PUT of rank 0
    assert not table_complete(doubled)
    assert table_complete(_server((1, 1, 2, 1), [(0, 0, 0, 0), (0, 0, 1, 0)]))
    assert table_complete(_server((2, 1, 1, 2), [(d, 0, 0, p) for d in (0, 1) for p in (0, 1)]))
    assert not table_complete(_server((1, 1, "2", 1), [(0, 0, 0, 0), (0, 0, 1, 0)]))


def test_the_targets_and_versions_are_named() -> None:
    assert SUPPORTED_VERSIONS == ("0.5.13", "0.5.19", "0.5.20", "0.5.21", "0.5.23")
    assert any(t.endswith("CommonKVManager._register_topology_row") for t in TARGETS)
    assert any(t.endswith("TokenizerManager.is_ready") for t in TARGETS)


def test_server_info_gets_the_ranks_registrations(registrars: list) -> None:
    payload = sglang_payload(tp_rank=1, tp_size=2)
    reg = Registrar("http://127.0.0.1:8998", payload, transport=ScriptedTransport([accepted()]))
    registrars.append(reg)
    manager = SimpleNamespace(_registrar_rows={("http://127.0.0.1:8998", (0, 0, 1, 0)): reg})
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    controller = SimpleNamespace(
        scheduler=SimpleNamespace(
            disagg_prefill_bootstrap_queue=SimpleNamespace(kv_manager=manager)
        )
    )
    result = SimpleNamespace(internal_state={"world_size": 2})
    assert plugin.after_internal_state(result, controller, None) is result
    [row] = result.internal_state["registrar"]["rows"]
    assert row["rank"] == {"dp": 0, "cp": 0, "tp": 1, "pp": 0}
    assert (row["state"], row["registrations"], row["running"]) == ("registered", 1, True)
    assert rows.stop_rows(manager, "test") == 1
    assert rows.rank_summary(manager)["rows"][0]["state"] == "stopped"


def test_server_info_lists_the_rows_the_bootstrap_server_misses() -> None:
    assert bootstrap_summary(_server((None, None, None, None), []))["missing_rows"] is None
    half = bootstrap_summary(_server((1, 1, 2, 1), [(0, 0, 0, 0)]))
    assert (half["complete"], half["expected_rows"], half["missing_count"]) == (False, 2, 1)
    assert half["missing_rows"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]
    whole = bootstrap_summary(_server((1, 1, 2, 1), [(0, 0, 0, 0), (0, 0, 1, 0)]))
    assert (whole["complete"], whole["missing_rows"], whole["registered_count"]) == (True, [], 2)


def test_the_token_is_what_sglang_would_send(monkeypatch: pytest.MonkeyPatch) -> None:
    # Upstream PR #39416 (not in 0.5.23): node 0's token, broadcast as the manager's
    # `bootstrap_auth_token`, else SGLang's own precedence: its variable, then --api-key.
    monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", raising=False)
    args = SimpleNamespace(api_key="api-key")
    assert rows.sglang_token(SimpleNamespace()) is None
    assert rows.sglang_token(SimpleNamespace(server_args=args)) == "api-key"
    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "from-env")
    assert rows.sglang_token(SimpleNamespace(server_args=args)) == "from-env"
    both = SimpleNamespace(server_args=args, bootstrap_auth_token="node-0")
    assert rows.sglang_token(both) == "node-0"  # the broadcast wins over this node's own
    assert rows.sglang_token(SimpleNamespace(bootstrap_auth_token=None)) == "from-env"


def test_every_node_registers_with_the_broadcast_token_and_a_missing_one_is_diagnosed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The next release stood in for: the manager's attribute and the server's check (401).
    class Manager(SimpleNamespace):  # weakly referable and hashable, as SGLang's manager is
        __hash__ = object.__hash__

    monkeypatch.setenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN", "node-1-own")
    rows.configure(read_config({}))  # SGLang's environment is not the plugin's configuration
    node0 = Manager(bootstrap_auth_token="shared", server_args=SimpleNamespace())
    node1 = Manager(bootstrap_auth_token="shared", server_args=SimpleNamespace())
    alone = Manager(server_args=SimpleNamespace(api_key=None))
    try:
        with BootstrapLab(token="shared") as server, BootstrapLab(token="shared") as other:
            rows.register_row(node0, f"{server.url}/route", sglang_payload(0, 2, port=21000))
            rows.register_row(node1, f"{server.url}/route", sglang_payload(1, 2, port=21001))
            monkeypatch.delenv("SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN")
            rows.register_row(alone, f"{other.url}/route", sglang_payload(port=21002))
            [ok0] = node0._registrar_rows.values()
            [ok1] = node1._registrar_rows.values()
            [refused] = alone._registrar_rows.values()
            assert ok0.wait_for(State.REGISTERED, 10)
            assert ok1.wait_for(State.REGISTERED, 10)
            assert refused.wait_for(State.FAILED, 10)  # the rank goes on: no exit, no raise
            auth = [r.authorization for r in server.records() if r.method == "PUT"]
            assert auth == ["Bearer shared", "Bearer shared"]
            assert server.ready
            assert server.registered_count == 2
            assert [r.authorization for r in other.records() if r.method == "PUT"] == [None]
        with BootstrapLab(token="override") as server:
            rows.configure(read_config({"REGISTRAR_TOKEN": "override"}))  # still the override
            rows.register_row(node0, f"{server.url}/route", sglang_payload(port=21003))
            [mine] = [r for u, r in node0._registrar_rows.items() if u[0] == server.url]
            assert mine.wait_for(State.REGISTERED, 10)
    finally:
        rows.configure(None)
        for manager in (node0, node1, alone):
            rows.stop_rows(manager, "test")
    diagnosis = refused.status().diagnosis
    assert diagnosis is not None
    assert diagnosis.code == "denied"
    assert diagnosis.sentence.startswith("401 Unauthorized from http://127.0.0.1:")
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN" in diagnosis.sentence  # what to set


@pytest.mark.parametrize(
    ("host", "dist", "rank", "warned"),
    [
        ("127.0.0.1", "10.231.77.1:5000", 0, True),  # node 0 on its loopback only
        ("localhost", "127.0.0.1:5000", 0, False),  # a name for the same address
        ("0.0.0.0", "10.231.77.1:5000", 0, False),  # every address
        ("127.0.0.1", "10.231.77.1:5000", 1, False),  # node 1 holds no bootstrap server
        ("127.0.0.1", None, 0, False),  # one node: the ranks register at --host
        ("a..b", "10.231.77.1:5000", 0, True),  # not a name at all: compared as written
    ],
)
def test_node_0_bound_where_its_ranks_do_not_register_is_said_once(
    caplog: pytest.LogCaptureFixture, host: str, dist: str | None, rank: int, warned: bool
) -> None:
    args = SimpleNamespace(host=host, dist_init_addr=dist, node_rank=rank)
    url = f"http://{(dist or host).partition(':')[0]}:8998"
    rows._said.clear()
    with caplog.at_level("WARNING", logger=rows.logger.name):
        rows._check_bind(args, url)
        rows._check_bind(args, url)
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == warned
    if warned:
        assert said[0].startswith(
            f"sglang-registrar: node 0's bootstrap server listens on {host} only (--host)"
        )
        assert "register at 10.231.77.1 (the --dist-init-addr host)" in said[0]
        assert "--host 0.0.0.0" in said[0]
