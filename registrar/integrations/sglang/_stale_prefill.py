"""The decode side: after each successful heartbeat, the rows a decode cached for a prefill are
checked against its bootstrap server, and dropped through SGLang's `_handle_node_failure` when
the answers show a new server (docs/sglang.md "The decode side: a relaunched prefill")."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core._redact import clean, load_json
from ...core._settings import HttpSettings
from ...protocols._http import HttpTransport
from ...protocols._httpvalues import with_query
from ...protocols._sglang import Rank, instance_of

logger = logging.getLogger("registrar.integrations.sglang.stale_prefill")

_STATE = "_registrar_prefill_checks"  # a decode KV manager's `_Watch`es, by prefill address
_TIMEOUT = (2.0, 3.0)  # as SGLang's heartbeat: (connect, read) seconds
_lock = threading.Lock()  # guards each manager's `_STATE`


@dataclass(frozen=True)
class CachedRow(Rank):
    ip: str
    port: int

    def name(self) -> str:
        return f"dp {self.dp} cp {self.cp} tp {self.tp} pp {self.pp}"


@dataclass(frozen=True)
class RowAnswer:
    """`status` None: no answer; `reconnected`: our kept-alive connection had to be re-opened;
    `instance`: the server's instance id on the answer (upstream PR #34289), if any."""

    status: int | None
    ip: str | None = None
    port: int | None = None
    reconnected: bool = False
    instance: str | None = None


@dataclass(frozen=True)
class Decision:
    """Drop the prefill (`drop` says why), or keep it with a new-lifetime suspicion `pending`."""

    drop: str | None
    pending: str | None


def decide(
    answers: Iterable[tuple[CachedRow, RowAnswer]],
    pending: str | None,
    same_cache: bool,
    instance: str | None = None,
) -> Decision:
    """Whether the cached rows belong to a server that is gone. `pending` is the new-lifetime
    evidence seen by earlier checks of this same cache; `same_cache` is False on the first check
    of a cache (a re-opened connection then predates it and says nothing); `instance` is the
    server's id when this cache was first checked."""
    present = True
    for row, answer in answers:
        if instance and answer.instance not in (None, instance) and pending is None:
            pending = (
                f"its bootstrap server's instance id changed from {instance} to {answer.instance}"
            )
        # Before anything else: a request that re-opened the connection and then got no answer
        # (cut at its deadline) is still evidence of a new process, and the only one there is.
        if answer.reconnected and same_cache and pending is None:
            pending = "its bootstrap server dropped our kept-alive connection (a new process)"
        if answer.status is None:
            return Decision(None, pending)  # down: SGLang's heartbeat decides
        if answer.status == 200:
            if (answer.ip, answer.port) != (row.ip, row.port):
                return Decision(
                    f"rank {row.name()} is now at {answer.ip}:{answer.port}, "
                    f"cached {row.ip}:{row.port}",
                    None,
                )
        elif answer.status == 404:
            return Decision(f"rank {row.name()} is gone from a ready bootstrap server", None)
        elif answer.status == 503:
            present = False
            pending = pending or (
                "its bootstrap server has fewer ranks registered than when the decode cached "
                "them (a new server)"
            )
        else:
            present = False
    if present and pending is not None:
        return Decision(f"{pending}, and its ranks registered again", None)
    return Decision(None, pending)


def cached_rows(
    addr: str, pool: Mapping[str, Sequence[Mapping[str, Any]]], info: Any
) -> list[CachedRow]:
    """The rows cached for the prefill at `addr`: one entry per (target tp, pp) under each
    `{addr}_{dp}_{cp}_{tp}` key, tp outer, pp inner reversed (`_setup_bootstrap_infos`'s order since
    0.5.10); an entry's pp is its own from 0.5.18, else its place in that order."""
    tps = list(getattr(info, "target_tp_ranks", None) or [])
    pps = list(reversed(getattr(info, "target_pp_ranks", None) or []))
    prefix = f"{addr}_"
    rows = []
    for key, entries in pool.items():
        parts = key[len(prefix) :].split("_") if key.startswith(prefix) else []
        try:
            dp, cp, key_tp = (int(part) for part in parts)
        except ValueError:  # not a row of this prefill
            continue
        order = [(t, p) for t in tps for p in pps] if len(tps) * len(pps) == len(entries) else []
        for i, entry in enumerate(entries):
            ip, port = entry.get("rank_ip"), entry.get("rank_port")
            if not isinstance(ip, str) or port is None:
                continue
            tp, pp = order[i] if order else (key_tp, None)
            if "pp_rank" in entry:
                pp = int(entry["pp_rank"])
            if pp is None:  # no pp_rank and an unknown order: not checked rather than misfiled
                continue
            rows.append(CachedRow(dp, cp, tp, pp, ip, int(port)))
    return rows


class _Watch:
    """The checks of one prefill from one decode manager: its connection and evidence."""

    def __init__(self, addr: str) -> None:
        self.transport = HttpTransport(HttpSettings(f"http://{addr}", timeout=_TIMEOUT))
        self.cache: Any = None
        self.pending: str | None = None
        self.instance: str | None = None  # the server's id at the first check of this cache

    def ask(self, row: CachedRow) -> RowAnswer:
        result = self.transport.send("GET", with_query("/route", row.query()))
        if result.error is not None or result.status_code is None:
            return RowAnswer(None, reconnected=result.reconnected)
        seen = instance_of(result)
        self.instance = self.instance or seen
        ip = port = None
        if result.status_code == 200:
            try:
                found = load_json(result.text)
                ip, port = str(found["rank_ip"]), int(found["rank_port"])
            except (ValueError, KeyError, TypeError):  # a 200 that names no address: no answer
                return RowAnswer(None, reconnected=result.reconnected)
        return RowAnswer(result.status_code, ip, port, result.reconnected, seen)


def check_prefill(manager: Any, addr: str) -> str | None:
    """Drop the stale rows `manager` cached for `addr` via `_handle_node_failure`: why, or None."""
    with manager.connection_lock:
        info = manager.prefill_info_table.get(addr)
        pool = {k: list(v) for k, v in manager.connection_pool.items() if k.startswith(addr + "_")}
    rows = cached_rows(addr, pool, info) if info is not None else []
    with _lock:
        watches: dict[str, _Watch] = manager.__dict__.setdefault(_STATE, {})
        watch = watches.get(addr) or watches.setdefault(addr, _Watch(addr))
    if not rows:
        watch.cache, watch.pending = None, None
        return None
    same_cache = watch.cache is info
    if not same_cache:
        watch.cache, watch.pending, watch.instance = info, None, None
    asked = ((row, watch.ask(row)) for row in rows)
    decision = decide(asked, watch.pending, same_cache, watch.instance)
    watch.pending = decision.pending
    if decision.drop is None:
        return None
    watch.cache, watch.pending = None, None
    logger.warning(
        "registrar: the prefill at %s restarted (%s); dropping the decode's cached addresses "
        "of it through SGLang's node-failure handling",
        addr,
        clean(decision.drop, 300),
    )
    manager._handle_node_failure(addr)
    return decision.drop


def close_checks(manager: Any) -> None:
    with _lock:
        watches: dict[str, _Watch] = manager.__dict__.pop(_STATE, {})
    for watch in watches.values():
        watch.transport.close()


def after_heartbeat_success(result: Any, manager: Any, addr: str, *args: Any, **kw: Any) -> Any:
    """AFTER `CommonKVManager._on_heartbeat_success` (decode only)."""
    try:
        check_prefill(manager, addr)
    except Exception:
        logger.exception("registrar: checking the prefill at %s for a restart failed", addr)
    return result
