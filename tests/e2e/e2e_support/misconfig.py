"""Multi-node misconfigurations (issue 36 scenario 5), staged for real in the two namespaces: a
TP 2 prefill over two nodes and nothing else (a group set up wrong serves nothing; the subject is
what each node and `registrar doctor` say about it), with and without registrar.

- `loopback_only`: node 0 started with `--host 127.0.0.1`. SGLang binds node 0's bootstrap server
  to `--host`, while every rank, node 0's own too, registers at the `--dist-init-addr` host: no
  registration can reach it.
- `another_dist_host`: node 1 given a `--dist-init-addr` host other than the one node 0 binds:
  an alias of node 0 (torch's rendezvous finds node 0 there, so the group comes up), where the
  bootstrap server does not listen. Node 0's rank registers, node 1's cannot.
- `loopback_rank_ip`: node 1 with `SGLANG_HOST_IP=127.0.0.1` (what a host whose name resolves to
  its loopback publishes): its rank registers, but at an address node 0 (and the decode) cannot
  reach, so the table is complete and the group cannot serve.

(Dropping the traffic between the nodes is n3's subject: this kernel drops all of it or none,
and dropped from the start, torch's rendezvous never lets the ranks reach registration.)
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from datetime import datetime
from typing import Any

import requests

from .deploy import ROOT, Process
from .scenarios import UPSTREAM_GAVE_UP, _wait_log
from .stack import Record, Stack

__all__ = ["ALIAS", "another_dist_host", "loopback_only", "loopback_rank_ip"]

ALIAS = "10.231.77.3"
"""The second address of node 0 that node 1 is given as the `--dist-init-addr` host."""
DIAGNOSIS = "[diagnosis refused]"
DIAGNOSE_AFTER = 30.0
"""REGISTRAR_DIAGNOSE_AFTER's default: the threshold the diagnosis is stated within."""
PROBE_SLACK = 10.0
"""The probe's few connects and the log's 1-s timestamps, on two busy cores."""
BIND_WARNING = "node 0's bootstrap server listens on 127.0.0.1 only (--host)"
WATCH = 8.0
"""Seconds of node 0's `/ready` asked, once the ranks have said what they had to."""
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)")


def loopback_only(stack: Stack, record: Record) -> None:
    """m1: node 0's bootstrap server on its loopback only: no rank can register."""
    _misconfigured(stack, record, registered=0, refused_at=stack.host)
    if stack.registrar:
        node0 = stack.prefill_nodes[0]
        assert BIND_WARNING in node0.text(), node0.tail()
        record.notes.append(f"node 0's log: {_line(node0, BIND_WARNING).partition('] ')[2]}")
    else:
        assert "sglang-registrar" not in stack.prefill_nodes[0].text()


def another_dist_host(stack: Stack, record: Record) -> None:
    """m2: node 1 registers at an alias of node 0 where nothing listens: its row is missing."""
    info = _misconfigured(stack, record, registered=1, refused_at=ALIAS)
    if stack.registrar:
        assert info["missing_rows"] == [{"dp": 0, "cp": 0, "tp": 1, "pp": 0}], info
        assert "dp0 cp0 tp1 pp0" in record.figures["doctor rows"], record.figures


def loopback_rank_ip(stack: Stack, record: Record) -> None:
    """m3: both rows in, node 1's at 127.0.0.1: with registrar node 0 connects to it, gets no
    answer, says so in its log and `/server_info`, and `/ready` is 503."""
    node0 = stack.prefill_nodes[0]
    silent: list[Any] = []
    deadline = time.monotonic() + 30
    while stack.registrar and not silent and time.monotonic() < deadline:
        silent = (_bootstrap_info(stack) or {}).get("silent_rows") or []
        time.sleep(0.5)
    ready = _ready_statuses(stack, WATCH)
    rows = stack.bootstrap()["lifetimes"][-1]["rows"]
    said = [line for line in node0.text().splitlines() if "does not answer (" in line]
    record.figures.update(
        {
            "rows in node 0's table": [f"tp {r[2]} at {r[4]}" for r in rows],
            "node 0 /ready": f"{ready.count(200)} of {len(ready)} asks 200",
            "silent_rows in node 0's /server_info": silent,
        }
    )
    record.notes += [f"node 0's log: {line.partition('] ')[2]}" for line in said[:1]]
    assert sorted((r[2], r[4]) for r in rows) == [(0, stack.host), (1, "127.0.0.1")], rows
    if stack.registrar:
        assert [(r["tp"], r["error"] != "") for r in silent] == [(1, True)], silent
        assert 200 not in ready, ready
        assert "rank dp 0 cp 0 tp 1 pp 0 at 127.0.0.1:" in said[0], said
    else:
        assert not said


def _misconfigured(stack: Stack, record: Record, registered: int, refused_at: str) -> Any:
    """What node 1 says, what node 0's `/ready`, `/server_info` and table say, and what
    `registrar doctor --expect 2` says; the assertions both scenarios share."""
    node1 = stack.prefill_nodes[1]
    if stack.registrar:
        _wait_log(node1, DIAGNOSIS, DIAGNOSE_AFTER + 2 * PROBE_SLACK)
        line = _line(node1, DIAGNOSIS)
        took = _seconds(line) - _seconds(_line(node1, "registering rank"))
        record.figures["node 1: first try to diagnosis (s)"] = took
        record.notes.append(line.partition("] ")[2])
        assert f"nothing listens on {refused_at}:{stack.bootstrap_port}" in line, line
        assert took <= DIAGNOSE_AFTER + PROBE_SLACK, line
    else:
        _wait_log(node1, UPSTREAM_GAVE_UP, 60)
        record.notes.append(f"node 1's log: {UPSTREAM_GAVE_UP!r}, and nothing after")
    ready = _ready_statuses(stack, WATCH)
    rows = [life["rows"] for life in stack.bootstrap()["lifetimes"]]
    info = _bootstrap_info(stack)
    record.figures.update(
        {
            "node 0 /ready": f"{ready.count(200)} of {len(ready)} asks 200",
            "rows in node 0's table": len(rows[-1]),
            "registrar_bootstrap": info,
            "doctor rows": _doctor_rows(stack),
        }
    )
    assert len(rows[-1]) == registered, rows
    if stack.registrar:
        assert 200 not in ready, ready
        assert info is not None
        assert info["registered_count"] == registered, info
        assert "of 2 rows registered" in record.figures["doctor rows"], record.figures
        if registered == 0:  # m1: no row, so no topology to list; doctor says every rank
            assert "every rank is missing" in record.figures["doctor rows"], record.figures
    return info


def _line(process: Process, text: str) -> str:
    return next(line for line in process.text().splitlines() if text in line)


def _seconds(line: str) -> float:
    found = _STAMP.match(line)
    assert found is not None, f"no timestamp on {line!r}"
    return datetime.fromisoformat(found.group(1)).timestamp()


def _ready_statuses(stack: Stack, seconds: float) -> list[int | None]:
    assert stack.prefill is not None
    statuses: list[int | None] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            statuses.append(requests.get(stack.prefill.url + "/ready", timeout=5).status_code)
        except requests.RequestException:
            statuses.append(None)
        time.sleep(0.5)
    return statuses


def _bootstrap_info(stack: Stack) -> Any:
    assert stack.prefill is not None
    return (
        requests.get(stack.prefill.url + "/server_info", timeout=10)
        .json()
        .get("registrar_bootstrap")
    )


def _doctor_rows(stack: Stack) -> str:
    """`registrar doctor` on node 0's bootstrap server, as an operator on node 0 runs it."""
    assert stack.prefill is not None
    host = stack.prefill.url.rpartition(":")[0]
    cmd = [
        sys.executable, "-m", "registrar", "doctor", "--json", "--expect", "2",
        "--url", f"{host}:{stack.bootstrap_port}", "--http-port", str(stack.prefill_port),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout's registrar
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False, env=env)
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    checks = json.loads(done.stdout)["checks"]
    (rows,) = [c for c in checks if c["check"] == "rows"]
    return str(rows["detail"])
