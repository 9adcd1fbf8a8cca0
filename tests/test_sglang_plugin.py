"""The SGLang plugin's parts that need no SGLang: loading `registrar` imports none of it, its
configuration is validated with one error naming the variable, and readiness reads the table
rather than the count. SGLang's real code is exercised in tests/sglang_real."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
from support import ScriptedTransport, accepted, sglang_payload

from registrar import ConfigError, Registrar, State
from registrar.integrations.sglang import (
    SUPPORTED_VERSIONS,
    TARGETS,
    bootstrap_summary,
    plugin,
    read_config,
    table_complete,
)
from registrar.surfaces.env import SGLANG_PLUGIN_ENV_VARS, describe_env


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
    assert read_config({}).init_wait == 0.0
    assert "REGISTRAR_INIT_WAIT" in describe_env(table=SGLANG_PLUGIN_ENV_VARS)


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
    assert SUPPORTED_VERSIONS == ("0.5.23",)
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
    assert plugin.stop_rows(manager, "test") == 1
    assert plugin.rank_summary(manager)["rows"][0]["state"] == "stopped"


def test_server_info_lists_the_rows_the_bootstrap_server_misses() -> None:
    assert bootstrap_summary(_server((None, None, None, None), []))["missing_rows"] is None
    half = bootstrap_summary(_server((1, 1, 2, 1), [(0, 0, 0, 0)]))
    assert (half["complete"], half["expected_rows"], half["missing_count"]) == (False, 2, 1)
    assert half["missing_rows"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]
    whole = bootstrap_summary(_server((1, 1, 2, 1), [(0, 0, 0, 0), (0, 0, 1, 0)]))
    assert (whole["complete"], whole["missing_rows"], whole["registered_count"]) == (True, [], 2)
