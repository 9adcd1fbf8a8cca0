"""What the plugin adds to SGLang's `/server_info`: each answering scheduler's registrations
(`internal_states[i]["registrar"]`), and in node 0's HTTP process the bootstrap server's missing
rows (`registrar_bootstrap`) and the gateway registrations (`registrar_gateway`)."""

from __future__ import annotations

import sys
from typing import Any

from .gateway import gateway_summary
from .rows import rank_summary
from .tables import HTTP_SERVER, bootstrap_summary

__all__ = ["after_internal_state", "after_server_info"]


def after_internal_state(result: Any, owner: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER `get_internal_state`, of the internal-state controller (0.5.22+, which holds the
    scheduler) or of the scheduler itself (before): add this rank's registration summary."""
    state = getattr(result, "internal_state", None)
    scheduler = getattr(owner, "scheduler", owner)
    queue = getattr(scheduler, "disagg_prefill_bootstrap_queue", None)
    manager = getattr(queue, "kv_manager", None)
    if isinstance(state, dict) and manager is not None:
        state["registrar"] = rank_summary(manager)
    return result


def after_server_info(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER `build_server_info`: in the node-0 HTTP process, which holds the bootstrap server,
    /server_info also says which rows the server is missing (`registrar_bootstrap`)."""
    http_server = sys.modules.get(HTTP_SERVER)
    state = getattr(http_server, "_global_state", None)
    manager = getattr(state, "tokenizer_manager", None)
    server = getattr(manager, "bootstrap_server", None)
    if isinstance(result, dict) and hasattr(server, "prefill_port_table"):
        result["registrar_bootstrap"] = bootstrap_summary(server)
    gateways = gateway_summary()
    if isinstance(result, dict) and gateways is not None:
        result["registrar_gateway"] = gateways
    return result
