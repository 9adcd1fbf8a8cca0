"""The node-0 bootstrap server's table, as this process holds it: complete or not, which rows are
missing or no longer answer (`_reach`), and the readiness `/ready` and the gateway read from it.
Where SGLang has no `/ready` (before 0.5.20), the plugin adds the route, with readiness computed
as 0.5.20 computes it."""

from __future__ import annotations

import itertools
import logging
import math
import sys
from collections.abc import Callable
from typing import Any

from ._reach import REACH

logger = logging.getLogger("registrar.integrations.sglang.tables")

_SIZES = ("dp_size", "attn_cp_size", "attn_tp_size", "pp_size")
_MAX_LISTED = 64  # missing rows listed in /server_info (the count is always there)
HTTP_SERVER = "sglang.srt.entrypoints.http_server"


def _sizes(server: Any) -> tuple[int, ...] | None:
    """(dp, cp, tp, pp); None: no rank has registered yet, the topology is unknown."""
    sizes: tuple[Any, ...] = tuple(getattr(server, name, None) for name in _SIZES)
    return sizes if all(isinstance(size, int) and size >= 1 for size in sizes) else None


def _missing(server: Any, sizes: tuple[int, ...]) -> list[dict[str, int]] | None:
    """The (dp, cp, tp, pp) rows not in the table; None if it changed under us."""
    try:
        return [
            {"dp": d, "cp": c, "tp": t, "pp": p}
            for d, c, t, p in itertools.product(*map(range, sizes))
            if p not in server.prefill_port_table.get(d, {}).get(c, {}).get(t, {})
        ]
    except (RuntimeError, AttributeError):  # changed under us by the server's thread
        return None


def table_complete(server: Any) -> bool:
    """Whether a bootstrap server's table holds every (dp, cp, tp, pp) row of its topology (not
    its count: the real server counts every PUT, so a doubled one would read as complete)."""
    sizes = _sizes(server)
    return sizes is not None and _missing(server, sizes) == []


def bootstrap_summary(server: Any) -> dict[str, Any]:
    """A node-0 bootstrap server's count, whether its table is complete, which rows are missing."""
    summary = {"registered_count": getattr(server, "_registered_count", None)}
    sizes = _sizes(server)
    if sizes is None:
        return {**summary, "complete": False, "missing_rows": None}
    missing = _missing(server, sizes)
    listed = missing or []
    silent = [
        {"dp": d, "cp": c, "tp": t, "pp": p, "error": error}
        for (d, c, t, p), error in REACH.silent(server).items()
    ]
    return {
        **summary,
        "complete": missing == [],
        "expected_rows": math.prod(sizes),
        "missing_count": len(listed),
        "missing_rows": listed[:_MAX_LISTED],
        "silent_rows": silent[:_MAX_LISTED],
    }


def _table_ready(manager: Any) -> bool:
    server = getattr(manager, "bootstrap_server", None)
    if not hasattr(server, "prefill_port_table"):
        return True  # not the node-0 prefill HTTP process: nothing to wait for here
    return table_complete(server) and not REACH.silent(server)


def around_is_ready(original: Callable[..., bool], manager: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND `TokenizerManager.is_ready` (0.5.20+): also false until the table is complete."""
    return bool(original(manager, *args, **kwargs)) and _table_ready(manager)


def server_ready(manager: Any) -> bool:
    """Readiness where SGLang has no `is_ready` (before 0.5.20), computed as 0.5.20 computes it."""
    status = getattr(manager, "server_status", None)
    if getattr(manager, "is_pause", False) or getattr(manager, "gracefully_exit", False):
        return False
    return getattr(status, "name", None) == "Up" and _table_ready(manager)


def readiness(manager: Any) -> Callable[[], bool]:
    """The server's readiness: SGLang's `is_ready` (gated by the AROUND hook), or `server_ready`."""
    own = getattr(manager, "is_ready", None)
    return own if callable(own) else lambda: server_ready(manager)


def add_ready_route(server_args: Any, tokenizer_manager: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_setup_and_run_http_server` (< 0.5.20): 0.5.20's `/ready` on SGLang's FastAPI app."""
    app = getattr(sys.modules.get(HTTP_SERVER), "app", None)
    if app is None or tokenizer_manager is None:
        return
    if any(getattr(route, "path", None) == "/ready" for route in app.routes):
        return
    from starlette.responses import Response  # noqa: PLC0415 - SGLang's own dependency

    async def ready_route() -> Response:
        """Whether the server is ready to receive new requests (added by sglang-registrar)."""
        return Response(status_code=200 if readiness(tokenizer_manager)() else 503)

    app.add_api_route("/ready", ready_route, methods=["GET"])
    logger.info("sglang-registrar: added GET /ready (this SGLang has none), gated on the table")
