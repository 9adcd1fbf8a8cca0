"""The plugin on the release this environment has, through SGLang's own
`CommonKVManager.register_to_bootstrap` (the real function, its real loop and `requests.put`):
init returns at once with the bootstrap server down and the row is registered in the
background, counted once, on 0.5.11-0.5.19 by the capture shim as on 0.5.20+ by the REPLACE;
and with every hook forced to raise, SGLang's own registration still runs and the server gets
its row. The manager is built with `__new__` and the attributes `register_to_bootstrap` reads
(the rank harness builds a whole one; this needs none of its per-release setup)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any

import pytest
from sglang_support.harness import HERE, child_env, import_quietly, wait_for
from support import process_port

from registrar.integrations.sglang._targets import (
    NEWEST_KNOWN,
    installed_version,
    parse_release,
)

pytestmark = pytest.mark.timeout(400)

RELEASE = parse_release(installed_version()) or NEWEST_KNOWN
"""This environment's SGLang (collected without one, every test here is skipped: conftest.py)."""

# A prefill manager as register_to_bootstrap reads it, then the call; the runtime-context
# getters the payload reads on 0.5.17+ answer from plain values. Prints one JSON line per event.
RANK = """
import json, logging, sys, time, warnings
from types import SimpleNamespace
warnings.simplefilter("ignore")
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
RAISE = {raise_hooks!r}
if RAISE:
    from registrar.integrations.sglang import _plugin as plugin
    def broken(*args, **kwargs):
        raise RuntimeError("forced by the test")
    async def broken_async(*args, **kwargs):
        raise RuntimeError("forced by the test")
    for name in plugin.HOOKS:
        plugin.HOOKS[name] = broken_async if name == "around_sigterm_watchdog" else broken
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.disaggregation.common import conn
values = SimpleNamespace(load_balance_method="round_robin", enable_dsa_cache_layer_split=False,
                         port=30000, enable_cp_tp_group_sharing=False,
                         enable_kv_cache_sharding=False,
                         disaggregation_decode_allocation_policy="early")
for name in ("get_parallel", "get_serving", "get_disagg"):
    if name in vars(conn):
        setattr(conn, name, lambda: values)
manager = conn.CommonKVManager.__new__(conn.CommonKVManager)
manager.__dict__.update(
    dist_init_addr=None, bootstrap_host="127.0.0.1", bootstrap_port={port},
    attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0, attn_dp_size=1,
    attn_dp_rank=0, pp_size=1, pp_rank=0, system_dp_size=1, system_dp_rank=0,
    local_ip="127.0.0.1", rank_port=17001, kv_cache_dtype_str="auto", kv_layout=None,
    dsv41_spec_layout=None,
    kv_args=SimpleNamespace(page_size=1, rust_http_port=None),
    server_args=SimpleNamespace(kv_cache_dtype="auto", load_balance_method="round_robin"),
)
started = time.monotonic()
manager.register_to_bootstrap()
print(json.dumps({{"event": "init", "seconds": time.monotonic() - started}}), flush=True)
from registrar.integrations.sglang import rank_summary
rows = rank_summary(manager)["rows"]
# With the hooks raising there is no registrar (and no row) to wait for: SGLang's own loop
# registered before init returned. Else a generous bound: the server starts after init.
for _ in range(0 if RAISE else 3000):
    rows = rank_summary(manager)["rows"]
    if rows and rows[0]["state"] == "registered":
        break
    time.sleep(0.1)
print(json.dumps({{"event": "rows", "rows": rows}}), flush=True)
sys.stdin.readline()  # the test says when to end (after counting the server's PUTs)
"""


def start_rank(port: int, raise_hooks: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", RANK.format(port=port, raise_hooks=raise_hooks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=HERE,
    )


def line(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    text = proc.stdout.readline()
    if not text:
        proc.wait(30)
        raise AssertionError(f"the rank ended ({proc.returncode}): {proc.stderr.read()[-4000:]}")
    found: dict[str, Any] = json.loads(text)
    return found


def end(proc: subprocess.Popen[str]) -> str:
    _, err = proc.communicate("\n", timeout=60)
    return err


def test_sglangs_own_registration_returns_at_once_and_registers_in_the_background(
    bootstrap,
) -> None:
    import_quietly("sglang.srt.disaggregation.common.conn")  # the server then starts at once
    port = process_port()
    proc = start_rank(port)
    try:
        init = line(proc)
        assert init["event"] == "init"
        server = bootstrap(port)
        time.sleep(2)  # the server starts after the rank, as in the startup race
        server.start()
        rows = line(proc)["rows"]
        assert wait_for(lambda: server.count >= 1)
        time.sleep(3)  # a look or two more: the route is held, so no second PUT
        assert server.count == 1
        assert server.rows() == {(0, 0, 0, 0)}
    finally:
        err = end(proc)
    [row] = rows
    assert (row["state"], row["registrations"]) == ("registered", 1), err
    assert "Prefill register attempt" not in err  # SGLang's blocking loop never ran
    assert "in the background (registrar" in err
    how = "captured from register_to_bootstrap" if RELEASE < (0, 5, 20) else "prefill ranks"
    assert how in err


def test_every_hook_raising_leaves_sglangs_own_registration_working(bootstrap) -> None:
    port = process_port()
    server = bootstrap(port).start()
    proc = start_rank(port, raise_hooks=True)
    try:
        assert line(proc)["event"] == "init"
        assert wait_for(lambda: server.count >= 1)
        assert line(proc)["rows"] == []  # no registrar: SGLang registered on its own
        assert server.count == 1
        assert server.rows() == {(0, 0, 0, 0)}
    finally:
        err = end(proc)
    assert proc.returncode == 0, err
    assert "forced by the test" in err
    assert err.count("the hook on sglang.srt.disaggregation.common.conn.CommonKVManager.") == 1
