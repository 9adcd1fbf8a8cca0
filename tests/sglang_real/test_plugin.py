"""registrar's plugin inside the real code of the SGLang release this environment has: found by
SGLang's own plugin loader, with the targets that release has (the target table), the rank's
init no longer blocks, a late and a restarted bootstrap server each count every rank exactly
once, and /ready waits for the whole table."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from importlib.metadata import version
from types import SimpleNamespace
from typing import Any

import pytest
from bootstrap_lab import BootstrapLab
from sglang_support.harness import (
    HERE,
    assert_init_left_registration_to_the_background,
    assert_one_put_each,
    checked,
    child_env,
    import_quietly,
    registered,
    wait_for,
)
from sglang_support.zygote import Zygote
from support import process_port

from registrar import __version__
from registrar.integrations.sglang._plugin import ACTIVE
from registrar.integrations.sglang._reach import REACH
from registrar.integrations.sglang._tables import bootstrap_summary, readiness
from registrar.integrations.sglang._targets import (
    FEATURES,
    NEWEST_KNOWN,
    expected,
    installed_version,
    parse_release,
)

RELEASE = parse_release(installed_version()) or NEWEST_KNOWN
"""This environment's SGLang (collected without one, every test here is skipped: conftest.py)."""
TAKEN = sum(target is not None for target in expected(RELEASE))
"""How many targets the table says this release has (8 on 0.5.22+, 5 to 7 before)."""

pytestmark = pytest.mark.timeout(300)


def run_fresh(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter of this environment (the stand-in loads first): for a
    subject that happens at import."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,  # loading SGLang takes 15 s alone; far more on a loaded 2-core machine
        env=child_env(**env),
        cwd=HERE,
        check=False,
    )


@pytest.fixture
def run_python(zygote: Zygote) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run code as `python -c` forked from the zygote (SGLang already imported, no plugin
    loaded yet): for the tests whose subject is what `load_plugins()` does."""

    def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
        return zygote.run(["-c", code], child_env(**env), HERE, timeout=300)

    return run


def test_sglang_own_loader_finds_and_applies_the_plugin(run_python) -> None:
    done = run_python(
        "import json, logging, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
        "import sys\n"
        "print('--- loaded', file=sys.stderr, flush=True)\n"
        "from registrar.integrations.sglang import _plugin as plugin\n"
        "print(json.dumps({'missing': plugin.verify(), 'targets': list(plugin.TARGETS)}))\n"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["missing"] == []
    assert "registrar -> registrar.integrations.sglang:load" in done.stderr
    assert "Loaded plugin registrar from group sglang.srt.plugins" in done.stderr
    assert "Applied 1 hook(s) to " + "sglang.srt.disaggregation.common.conn" in done.stderr
    # The one line an operator greps to know the plugin is active, once in this process.
    loading = done.stderr.split("--- loaded")[0]
    [active] = [line for line in loading.splitlines() if ACTIVE in line]
    assert f"sglang-registrar {__version__} active in sglang {version('sglang')} (pid " in active
    assert f"{TAKEN} of {TAKEN} targets this sglang has applied" in active
    assert "(tested on sglang 0.5.13, 0.5.19, 0.5.20, 0.5.21, 0.5.23)" in active
    if RELEASE < (0, 5, 22):  # what this release cannot do is named, with why
        assert "not on this release: server status (" in active
    assert "WARNING:registrar" not in loading
    assert "ERROR:registrar" not in loading


@pytest.mark.parametrize("level", ["info", "warning"])
def test_the_active_line_reaches_the_log_sglang_configures_after_loading(
    level: str, run_python
) -> None:
    """As in every SGLang process: `load_plugins()` first, SGLang's own `configure_logger` after.
    The line is in the log once, in SGLang's format, at SGLang's level (none at warning)."""
    done = run_python(
        "import warnings\n"
        "warnings.simplefilter('ignore')\n"
        "from types import SimpleNamespace\n"
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang.srt.utils import configure_logger\n"
        "load_plugins()\n"
        f"configure_logger(SimpleNamespace(log_level={level!r}), prefix=' TP0')\n"
        "load_plugins()\n"
        "configure_logger(SimpleNamespace(log_level='info'), prefix=' TP0')\n"
    )
    assert done.returncode == 0, done.stderr
    active = [line for line in done.stderr.splitlines() if ACTIVE in line]
    if level == "warning":
        assert active == [], done.stderr
        return
    assert len(active) == 1, done.stderr
    assert re.fullmatch(rf"\[[-\d]+ [:\d]+ TP0\] {ACTIVE} .*", active[0]), active


@pytest.mark.same_on_every_release
def test_importing_registrar_imports_no_sglang() -> None:
    done = run_fresh(
        "import sys\n"
        "import registrar, registrar.integrations, registrar.integrations.sglang\n"
        "from registrar.integrations.sglang import _plugin as plugin\n"
        "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith('sglang.')))\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# The registration target this release has, deleted as if SGLang had renamed it.
REGISTRATION = "_register_topology_row" if RELEASE >= (0, 5, 20) else "register_to_bootstrap"
CAUSE = "AttributeError: " if RELEASE >= (0, 5, 20) else "present, but not in the form the plugin"
RENAMED_METHOD = (
    "import warnings\n"
    "warnings.simplefilter('ignore')\n"
    "import logging\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "from sglang.srt.disaggregation.common import conn\n"
    f"del conn.CommonKVManager.{REGISTRATION}\n"
    "from sglang.srt.plugins import load_plugins\n"
    "load_plugins()\n"
)


def test_a_patch_that_cannot_apply_is_reported_loudly(run_python) -> None:
    # As if SGLang had renamed the method: the plugin names the missing target, its cause and
    # the versions, once, and does not claim to be active.
    done = run_python(RENAMED_METHOD)
    assert done.returncode == 0, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("ERROR:registrar")]
    assert len(errors) == 1, done.stderr
    # Deleted, the method is missing (0.5.20+) or resolves to the base class's (no PUT in it).
    assert f"CommonKVManager.{REGISTRATION} ({CAUSE}" in errors[0]
    assert "REGISTRAR_STRICT=1 stops the server instead" in errors[0]
    assert "TokenizerManager.is_ready" not in errors[0]  # the others took effect
    assert ACTIVE not in done.stderr


def test_strict_stops_the_process_when_a_patch_cannot_apply(run_python) -> None:
    done = run_python(RENAMED_METHOD + "print('still running')\n", REGISTRAR_STRICT="1")
    assert done.returncode == 1, done.stderr
    assert "still running" not in done.stdout
    [line] = [line for line in done.stderr.splitlines() if "could not patch" in line]
    assert line.startswith(f"sglang-registrar {__version__} could not patch ")
    assert f"{REGISTRATION} ({CAUSE}" in line
    assert line.endswith("REGISTRAR_STRICT=1: stopping")


def test_a_release_without_one_of_its_targets_gets_the_rest_and_one_warning(run_python) -> None:
    # As a newer release that dropped a target would: the decode hook is deleted before the
    # plugin looks. The plugin applies every other target, says so, and warns once naming it.
    done = run_python(
        "import warnings, logging\n"
        "warnings.simplefilter('ignore')\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from sglang.srt.disaggregation.common import conn\n"
        "del conn.CommonKVManager._on_heartbeat_success\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n",
        REGISTRAR_STRICT="1",  # a target this SGLang lacks never stops it
    )
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if line.startswith("WARNING:registrar")]
    assert "lacks targets the plugin looks for: decode check (" in warning
    assert "CommonKVManager._on_heartbeat_success (AttributeError: " in warning
    [active] = [line for line in done.stderr.splitlines() if ACTIVE in line]
    assert f"{TAKEN - 1} of {TAKEN - 1} targets this sglang has applied" in active


# The module of this release's rank-status target (the internal-state controller from 0.5.22).
BROKEN = (
    "sglang.srt.managers.scheduler_components.internal_state"
    if RELEASE >= (0, 5, 22)
    else "sglang.srt.managers.scheduler"
)


def test_a_patch_whose_module_cannot_import_names_the_import_error(run_python) -> None:
    # A module SGLang needs for one target cannot be imported because one of its own imports is
    # missing (as when torchvision is absent): the cause is that ImportError, which
    # pkgutil.resolve_name alone would turn into "has no attribute 'role_switch'".
    done = run_python(
        "import sys, warnings, logging, importlib.abc, importlib.util\n"
        "warnings.simplefilter('ignore')\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):\n"
        "    def find_spec(self, name, path, target=None):\n"
        f"        if name == {BROKEN!r}:\n"
        "            return importlib.util.spec_from_loader(name, self)\n"
        "    def create_module(self, spec):\n"
        "        return None\n"
        "    def exec_module(self, module):\n"
        "        import a_dependency_that_is_not_installed\n"
        "sys.meta_path.insert(0, Broken())\n"
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"
    )
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "lacks targets" in line]
    assert (
        "get_internal_state (ModuleNotFoundError: No module named "
        "'a_dependency_that_is_not_installed')" in line
    )
    assert "CommonKVManager" not in line
    assert ACTIVE in done.stderr  # the rest is applied


@pytest.mark.same_on_every_release
def test_a_bad_variable_stops_the_rank_with_one_line_naming_it(spawn_rank) -> None:
    rank = spawn_rank(process_port(), REGISTRAR_MAX_ATTEMPTS="many")
    assert rank.proc.wait(120) != 0
    text = rank.log.read_text()
    assert text.count("REGISTRAR_MAX_ATTEMPTS='many'") == 1, text  # printed once, not twice
    assert "Traceback" not in text


@pytest.mark.same_on_every_release
def test_a_variable_the_plugin_cannot_honour_stops_the_rank_in_one_line(spawn_rank) -> None:
    rank = spawn_rank(process_port(), REGISTRAR_HEALTH_PORT="8081")
    assert rank.proc.wait(120) != 0
    text = rank.log.read_text()
    [line] = [line for line in text.splitlines() if "REGISTRAR_HEALTH_PORT" in line]
    assert "is not read by the SGLang plugin" in line
    assert "Traceback" not in text


def test_the_token_file_and_verbose_work_inside_sglang(spawn_rank, tmp_path) -> None:
    # SGLang 0.5.23's server has no authentication; the reference server stands for one that
    # requires a bearer token (upstream PR #39416). The rank is SGLang's real CommonKVManager.
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    with BootstrapLab("127.0.0.1", 0, token="s3cret-token") as server:
        rank = spawn_rank(server.port, REGISTRAR_TOKEN_FILE=str(token), REGISTRAR_VERBOSE="1")
        rank.event("init")
        assert wait_for(lambda: server.registered_count == 1, timeout=60)
        assert registered(rank)
        [row] = rank.status()
        assert (row["state"], row["registrations"]) == ("registered", 1)
        puts = [r for r in server.records() if r.method == "PUT"]
        assert [r.authorization for r in puts] == ["Bearer s3cret-token"]
    text = rank.log.read_text()
    assert "registration: accepted (200) in" in text  # REGISTRAR_VERBOSE: each request
    assert text.count(ACTIVE) == 1
    assert "s3cret-token" not in text


def test_the_next_releases_token_registers_every_rank_of_two_nodes(spawn_rank) -> None:
    # The next release stood in for (upstream PR #39416, not in 0.5.23): the server requires the
    # token on PUT /route, and each rank's real CommonKVManager has node 0's token as
    # `bootstrap_auth_token`. Rank 1 stands for a second node, whose environment holds another
    # token: the broadcast one is what SGLang sends, and so does the plugin.
    with BootstrapLab("127.0.0.1", 0, token="node-0-token") as server:
        ranks = [
            spawn_rank(
                server.port,
                rank=rank,
                tp_size=2,
                SGLANG_SUPPORT_BROADCAST_TOKEN="node-0-token",
                SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=own,
            )
            for rank, own in enumerate(["node-0-token", "node-1-own"])
        ]
        for rank in ranks:
            rank.event("init")
        assert wait_for(lambda: server.ready, timeout=60)
        assert checked(ranks[0])
        assert checked(ranks[1])
        puts = [r.authorization for r in server.records() if r.method == "PUT"]
        assert puts == ["Bearer node-0-token"] * 2
        assert server.registered_count == 2
    for rank in ranks:
        assert "node-0-token" not in rank.log.read_text()


@pytest.mark.same_on_every_release
def test_without_the_token_a_rank_says_so_and_goes_on(spawn_rank) -> None:
    # SGLang 0.5.23 as it is (no broadcast attribute) before a server that requires a token:
    # one 401, the denied diagnosis naming the variable, and the rank lives on.
    with BootstrapLab("127.0.0.1", 0, token="the-servers") as server:
        rank = spawn_rank(server.port, SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN="")
        rank.event("init")
        assert wait_for(lambda: rank.status()[0]["diagnosis"] is not None, timeout=60)
        [row] = rank.status()
        assert rank.proc.poll() is None
    assert row["state"] == "failed"
    assert row["diagnosis"]["code"] == "denied"
    assert "401 Unauthorized" in row["diagnosis"]["sentence"]
    assert "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN" in row["diagnosis"]["sentence"]
    assert "[diagnosis denied]" in rank.log.read_text()


def test_init_returns_at_once_and_a_late_server_counts_the_rank_once(spawn_rank, bootstrap) -> None:
    port = process_port()
    rank = spawn_rank(port)
    rank.event("init")
    assert_init_left_registration_to_the_background(rank)  # no blocking retry loop
    server = bootstrap(port)
    time.sleep(3)  # the server starts seconds after the rank, as in the startup race
    server.start()
    assert wait_for(lambda: server.count >= 1)
    assert server.rows() == {(0, 0, 0, 0)}
    assert checked(rank)  # two checks after the PUT found it: no second PUT
    assert server.count == 1
    [row] = rank.status()
    assert (row["state"], row["registrations"]) == ("registered", 1)

    # Closed and started again on the same port: forgotten, registered again, counted once.
    server.close()
    server = bootstrap(port).start()
    assert wait_for(lambda: server.count >= 1)
    assert wait_for(lambda: rank.status()[0]["registrations"] == 2)
    assert checked(rank)
    assert server.count == 1
    assert server.rows() == {(0, 0, 0, 0)}
    [row] = rank.status()
    assert (row["state"], row["registrations"], row["reregistrations"]) == ("registered", 2, 1)


# Four ranks is the same path as two at a larger scale: two runs on every release.
@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.same_on_every_release)])
def test_ranks_in_their_own_processes_put_once_per_server_lifetime(
    spawn_rank, bootstrap, ranks: int
) -> None:
    port = process_port()
    procs = [spawn_rank(port, rank=r, tp_size=ranks) for r in range(ranks)]
    for proc in procs:
        proc.event("init", timeout=240)
        assert_init_left_registration_to_the_background(proc)
    everyone = {(0, 0, tp, 0) for tp in range(ranks)}
    for lifetime in range(2):  # a late start, then a restart on the same port
        server = bootstrap(port).start()
        assert_one_put_each(server, procs, everyone, lifetime)
        server.close()
    for proc in procs:
        [row] = proc.status()
        assert (row["state"], row["registrations"]) == ("registered", 2)


def test_a_role_switch_stops_the_ranks_registrars(spawn_rank, bootstrap) -> None:
    """Where SGLang has a role switch (0.5.21+) its teardown stops the rank's registrars; where
    it has none there is nothing to stop them for, and the table says the feature is absent."""
    port = process_port()
    server = bootstrap(port).start()
    rank = spawn_rank(port)
    rank.event("init")
    assert wait_for(lambda: server.count == 1)
    assert registered(rank)
    answer = rank.command("teardown", "teardown")
    [row] = answer["rows"]
    (switch,) = [
        t for f, t in zip(FEATURES, expected(RELEASE), strict=True) if f.name == "role switch"
    ]
    if answer.get("role_switch", True):
        assert switch is not None, f"the table says {RELEASE} has no role switch"
        assert (row["running"], row["state"]) == (False, "stopped")
    else:
        assert switch is None, f"the table says {RELEASE} has a role switch"
        assert (row["running"], row["state"]) == (True, "registered")


def server_info(manager: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What SGLang's build_server_info (patched) gives /server_info in the node-0 process."""
    http_server = import_quietly("sglang.srt.entrypoints.http_server")
    monkeypatch.setattr(http_server, "_global_state", SimpleNamespace(tokenizer_manager=manager))
    args = SimpleNamespace(
        resolved_dict=dict, launch_command="sglang", kv_events_config=None, page_size=None
    )
    info: dict[str, Any] = http_server.build_server_info(args, {})
    return info


@pytest.fixture
def reach() -> Any:
    """Node 0's look at every row's address (conftest's `_reach_stopped` ends its thread)."""
    return REACH


def test_ready_is_false_until_the_table_is_complete(
    spawn_rank, bootstrap, monkeypatch, reach
) -> None:
    plugins = import_quietly("sglang.srt.plugins")
    with warnings.catch_warnings():  # applying the hooks imports more of SGLang
        warnings.simplefilter("ignore")
        plugins.load_plugins()  # this process: the AROUND hook on TokenizerManager.is_ready
    tokenizer = import_quietly("sglang.srt.managers.tokenizer_manager")
    manager = tokenizer.TokenizerManager.__new__(tokenizer.TokenizerManager)
    manager.is_pause = False
    manager.gracefully_exit = False
    manager.server_status = tokenizer.ServerStatus.Up
    # /ready's answer: SGLang's is_ready (0.5.20+), else the route the plugin adds reads this.
    ready = readiness(manager)
    with_info = RELEASE >= (0, 5, 22)  # build_server_info, which the plugin extends
    port = process_port()
    manager.bootstrap_server = bootstrap(port).start().instance
    assert ready() is False  # nothing registered
    first = spawn_rank(port, rank=0, tp_size=2)
    first.event("init")  # a rank's start, not counted in the waits below (Rank.event says why)
    assert wait_for(lambda: manager.bootstrap_server._registered_count == 1, timeout=120)
    assert ready() is False  # one row of two
    if with_info:
        summary = server_info(manager, monkeypatch)["registrar_bootstrap"]
        assert summary["complete"] is False
        assert summary["missing_rows"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}]
    spawn_rank(port, rank=1, tp_size=2).event("init")
    assert wait_for(ready, timeout=120), (
        bootstrap_summary(manager.bootstrap_server),
        reach.silent(manager.bootstrap_server),
    )
    reach.look()  # both ranks answer at the addresses they registered: still ready
    assert not reach.silent(manager.bootstrap_server)
    assert ready() is True
    if with_info:
        summary = server_info(manager, monkeypatch)["registrar_bootstrap"]
        assert (summary["complete"], summary["missing_rows"], summary["expected_rows"]) == (
            True,
            [],
            2,
        )
    manager.is_pause = True
    assert ready() is False  # SGLang's own answer still counts
    manager.bootstrap_server = None
    manager.is_pause = False
    assert ready() is True  # not the prefill node 0: nothing to wait for
    first.stop()


def test_on_failure_exit_fails_the_rank_as_a_failing_scheduler_does(tmp_path, model_dir) -> None:
    # The rank's parent stands for SGLang's launcher: it records the SIGQUIT a failing
    # scheduler sends it (run_scheduler_process), instead of taking a server down.
    log = tmp_path / "parent.log"
    with log.open("w") as err:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "sglang_support.parent",
                "--bootstrap-port",
                str(process_port()),
                "--model",
                str(model_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            timeout=240,
            env=child_env(
                REGISTRAR_ON_FAILURE="exit",
                REGISTRAR_MAX_ATTEMPTS="2",
                REGISTRAR_BACKOFF_INITIAL="0.1",
                REGISTRAR_BACKOFF_MAX="0.2",
            ),
            cwd=HERE,
            check=False,
        )
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert {"event": "sigquit"} in events, log.read_text()[-3000:]
    assert {"event": "child_exit", "code": 3} in events
    text = log.read_text()
    assert "REGISTRAR_ON_FAILURE=exit" in text
    assert "SIGQUIT to the parent process" in text
