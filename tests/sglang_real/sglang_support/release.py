"""Where the SGLang releases of the CI matrix (0.5.13 to 0.5.23) differ for this harness, each
detected by the feature, not by the version string: how a rank process tells SGLang its place
in the topology before `CommonKVManager` reads it.

    0.5.21+        runtime_context.publish(..., ranks=SpawnRanks(world_rank=)) derives every
                   rank and width; the pipeline group is overridden to None
    0.5.17-0.5.20  publish(...) without ranks: the ranks are set as parallel overrides, the
                   widths stamped (override_permanently 0.5.20, stamp_derived_widths before)
    <= 0.5.16      no publish: the getters `CommonKVManager` imported (get_attention_tp_size(),
                   get_pp_group(), ...) are replaced in its module by constants

No torch.distributed here: every group getter would assert; the pipeline group is never used
with pp_size 1.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from typing import Any


def installed() -> str:
    """The installed SGLang release (for the reference server's knob); "" without SGLang."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _optional(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def _topology(rank: int, tp_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ranks and the widths of rank `rank` of a tp-only prefill (one dp, cp, pp)."""
    ranks = {
        "world_rank": rank,
        "tp_rank": rank,
        "attn_tp_rank": rank,
        "attn_cp_rank": 0,
        "attn_dp_rank": 0,
        "dcp_rank": 0,
        "attn_dcp_rank": 0,
        "pp_rank": 0,
        "pp_group": None,
    }
    widths = {"attn_tp_size": tp_size, "attn_dcp_size": 1, "dcp_enabled": False, "attn_dp_size": 1}
    return ranks, widths


def _stub_getters(rank: int, tp_size: int) -> None:
    """Replace the group getters `CommonKVManager` calls, where its module imported them."""
    conn = importlib.import_module("sglang.srt.disaggregation.common.conn")
    values = {
        "get_attention_tp_size": tp_size,
        "get_attention_tp_rank": rank,
        "get_attention_cp_size": 1,
        "get_attention_cp_rank": 0,
        "get_attention_dp_size": 1,
        "get_attention_dp_rank": 0,
        "get_pp_group": None,
    }
    for name, value in values.items():
        if hasattr(conn, name):
            setattr(conn, name, lambda value=value: value)


def publish_rank(server_args: Any, rank: int, tp_size: int) -> None:
    """Tell SGLang which rank this process is, as its scheduler process would."""
    context = _optional("sglang.srt.runtime_context")
    if context is not None and hasattr(context, "SpawnRanks"):
        context.publish(server_args, role="scheduler", ranks=context.SpawnRanks(world_rank=rank))
        context.get_parallel().override_permanently(pp_group=None)
        return
    ranks, widths = _topology(rank, tp_size)
    if context is not None and hasattr(context, "publish"):
        context.publish(server_args, role="scheduler")
        parallel = context.get_parallel()
        stamp = getattr(parallel, "override_permanently", None) or parallel.stamp_derived_widths
        stamp(**widths)
        # The scoped `override` has no permanent form here: its table, kept for the process.
        parallel._overrides.update(ranks)
    _stub_getters(rank, tp_size)
