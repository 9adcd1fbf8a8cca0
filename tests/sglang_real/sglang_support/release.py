"""Where the SGLang releases of the CI matrix (0.5.13 to 0.5.23) differ for this harness, each
detected by the feature, not by the version string: how a rank process tells SGLang its place
in the topology before `CommonKVManager` reads it.

    0.5.21+        runtime_context.publish(..., ranks=SpawnRanks(world_rank=, dp_rank=)) derives
                   every rank and width; the pipeline group is overridden to None
    0.5.17-0.5.20  publish(...) without ranks: the ranks are set as parallel overrides, the
                   widths stamped (override_permanently 0.5.20, stamp_derived_widths before)
    <= 0.5.16      no publish: the getters `CommonKVManager` imported (get_attention_tp_size(),
                   get_pp_group(), ...) are replaced in its module by constants

DP attention (`--tp N --dp D --enable-dp-attention`): SGLang's data-parallel controller starts
one scheduler per TP rank of one WORLD and gives each the attention-DP rank as its `dp_rank`
(`compute_dp_attention_world_info`: tp_rank // (N / D) with one attention-CP rank), the same in
0.5.13-0.5.23. From 0.5.21 that is `SpawnRanks(dp_rank=)`, and `publish` derives the attention
ranks and widths from the world rank; before, the same values are stamped and overridden here.
The scheduler then sets `kv_args.system_dp_rank` to that dp rank (`get_parallel().dp_rank`
from 0.5.21, `scheduler.ps.dp_rank` before): `publish_rank` returns it.

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


def _topology(rank: int, tp_size: int, dp_size: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ranks and the widths of rank `rank` of a prefill with one cp and pp: TP only
    (`dp_size` 1), or `dp_size` attention-DP groups of tp_size / dp_size ranks each."""
    attn_tp_size = tp_size // dp_size
    ranks = {
        "world_rank": rank,
        "tp_rank": rank,
        "attn_tp_rank": rank % attn_tp_size,
        "attn_cp_rank": 0,
        "attn_dp_rank": rank // attn_tp_size,
        "dcp_rank": 0,
        "attn_dcp_rank": 0,
        "pp_rank": 0,
        "pp_group": None,
    }
    widths = {
        "attn_tp_size": attn_tp_size,
        "attn_dcp_size": 1,
        "dcp_enabled": False,
        "attn_dp_size": dp_size,
    }
    return ranks, widths


def _stub_getters(ranks: dict[str, Any], widths: dict[str, Any]) -> None:
    """Replace the group getters `CommonKVManager` calls, where its module imported them."""
    conn = importlib.import_module("sglang.srt.disaggregation.common.conn")
    values = {
        "get_attention_tp_size": widths["attn_tp_size"],
        "get_attention_tp_rank": ranks["attn_tp_rank"],
        "get_attention_cp_size": 1,
        "get_attention_cp_rank": 0,
        "get_attention_dp_size": widths["attn_dp_size"],
        "get_attention_dp_rank": ranks["attn_dp_rank"],
        "get_pp_group": None,
    }
    for name, value in values.items():
        if hasattr(conn, name):
            setattr(conn, name, lambda value=value: value)


def publish_rank(server_args: Any, rank: int, tp_size: int, dp_size: int = 1) -> int | None:
    """Tell SGLang which rank this process is, as its scheduler process would; return the dp
    rank its scheduler puts in `kv_args.system_dp_rank` (None without a data-parallel
    controller). `dp_size` > 1: a DP-attention prefill (`server_args` has
    `enable_dp_attention`)."""
    ranks, widths = _topology(rank, tp_size, dp_size)
    # What the launcher hands each scheduler: its attention-DP rank under DP attention.
    dp_rank = ranks["attn_dp_rank"] if dp_size > 1 else None
    context = _optional("sglang.srt.runtime_context")
    if context is not None and hasattr(context, "SpawnRanks"):
        spawn = context.SpawnRanks(world_rank=rank, dp_rank=dp_rank)
        context.publish(server_args, role="scheduler", ranks=spawn)
        parallel = context.get_parallel()
        parallel.override_permanently(pp_group=None)
        return parallel.dp_rank  # type: ignore[no-any-return]
    if context is not None and hasattr(context, "publish"):
        context.publish(server_args, role="scheduler")
        parallel = context.get_parallel()
        stamp = getattr(parallel, "override_permanently", None) or parallel.stamp_derived_widths
        stamp(**widths)
        # The scoped `override` has no permanent form here: its table, kept for the process.
        parallel._overrides.update(ranks)
    _stub_getters(ranks, widths)
    return dp_rank
