"""One prefill rank, as SGLang's scheduler process builds it, in a process of its own.

    python -m sglang_support.rank --bootstrap-port P --tp-size N --rank R --model DIR
    python -m sglang_support.rank ... --tp-size 2 --dp-size 2 --enable-dp-attention --rank R

With `--enable-dp-attention` the rank is TP rank R of a `--tp N --dp D --enable-dp-attention`
prefill: attention-DP rank R // (N / D), published as SGLang's launcher publishes it
(release.py), and its `kv_args.system_dp_rank` is what that release's scheduler sets there.

Like `run_scheduler_process`, it loads SGLang's plugins (`load_plugins()`, so `SGLANG_PLUGINS`
decides whether registrar's is among them), publishes the scheduler's runtime context, then runs
the real `CommonKVManager.__init__` in prefill mode on CPU: SGLang's own payload building,
socket binding and registration. What it measured goes to stdout as one JSON object a line:

    {"event": "init", "seconds": 0.01, "rank_port": 41234, "place": {"attn_dp_rank": 0, ...}}

then it answers commands read from stdin, one a line: `status` (the registrars the plugin keeps
on the manager, `{"event": "status", "rows": [...]}`), `teardown` (SGLang's role-switch
teardown of this rank; `"role_switch": false` in the answer where the release has none, before
0.5.21), `exit`. End of input ends the process.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import warnings
from typing import Any

log = logging.getLogger("rank")

BROADCAST_TOKEN = "SGLANG_SUPPORT_BROADCAST_TOKEN"
"""Set: the manager has `bootstrap_auth_token`, as upstream PR #39416 (not in 0.5.23) makes it."""


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def kv_args(rank: int, system_dp_rank: int | None) -> Any:
    """The fields of SGLang's KVArgs that the common manager reads in prefill mode (0.5.23's;
    an older release ignores those it does not have)."""
    from sglang.srt.disaggregation.base.conn import KVArgs

    args = KVArgs()
    fields: dict[str, Any] = {
        "engine_rank": rank,
        "kv_data_ptrs": [],
        "kv_data_lens": [],
        "kv_item_lens": [1],
        "kv_layer_ids": [],
        "kv_cache_dtype_str": "auto",
        "kv_layout": None,
        "aux_data_ptrs": [],
        "aux_data_lens": [],
        "aux_item_lens": [],
        "state_types": [],
        "state_data_ptrs": [],
        "state_data_lens": [],
        "state_item_lens": [],
        "ib_device": None,
        "gpu_id": 0,
        "page_size": 1,
        "system_dp_rank": 0 if system_dp_rank is None else system_dp_rank,
        "pp_rank": 0,
        "prefill_start_layer": 0,
        "rust_http_port": None,
    }
    for name, value in fields.items():
        setattr(args, name, value)
    return args


def build_manager(
    bootstrap_port: int,
    tp_size: int,
    rank: int,
    model: str,
    dp_size: int = 1,
    dp_attention: bool = False,
) -> Any:
    """The real CommonKVManager of one prefill rank, as a scheduler process builds it."""
    from sglang.srt.disaggregation.common.conn import CommonKVManager
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.server_args import ServerArgs

    from sglang_support.release import publish_rank

    server_args = ServerArgs(
        model_path=model,
        disaggregation_mode="prefill",
        device="cpu",
        host="127.0.0.1",
        port=30000,
        disaggregation_bootstrap_port=bootstrap_port,
        tp_size=tp_size,
        **({"dp_size": dp_size, "enable_dp_attention": True} if dp_attention else {}),
    )
    # As each release's scheduler does (release.py); the dp rank its scheduler is given.
    system_dp_rank = publish_rank(server_args, rank, tp_size, dp_size if dp_attention else 1)
    broadcast = os.environ.get(BROADCAST_TOKEN)
    if broadcast:  # the next release, stood in for: node 0's token on every manager (#39416)
        CommonKVManager.bootstrap_auth_token = broadcast
    args = kv_args(rank, system_dp_rank)
    return CommonKVManager(args, DisaggregationMode.PREFILL, server_args, False)


PLACE = ("attn_tp_rank", "attn_tp_size", "attn_dp_rank", "attn_dp_size")
PLACE += ("system_dp_rank", "system_dp_size")


def place(manager: Any) -> dict[str, Any]:
    """The manager's fields its registration payload takes the rank's place from."""
    return {name: getattr(manager, name, None) for name in PLACE}


def rows(manager: Any) -> list[dict[str, Any]]:
    from registrar.integrations.sglang._rows import rank_summary

    return rank_summary(manager)["rows"]  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap-port", type=int, required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--dp-size", type=int, default=1)
    parser.add_argument("--enable-dp-attention", action="store_true")
    parser.add_argument("--model", required=True)
    opts = parser.parse_args()
    if opts.dp_size > 1 and not opts.enable_dp_attention:
        parser.error("--dp-size without --enable-dp-attention: the harness has no DP replicas")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang warns about every GPU-only feature on CPU
        from sglang.srt.plugins import load_plugins

        load_plugins()
        started = time.monotonic()
        manager = build_manager(
            opts.bootstrap_port,
            opts.tp_size,
            opts.rank,
            opts.model,
            dp_size=opts.dp_size,
            dp_attention=opts.enable_dp_attention,
        )
        seconds = time.monotonic() - started
    say(event="init", seconds=seconds, rank_port=manager.rank_port, place=place(manager))
    for line in sys.stdin:
        command = line.strip()
        if command == "status":
            say(event="status", rows=rows(manager))
        elif command == "teardown":
            try:
                from sglang.srt.disaggregation.role_switch import teardown_disaggregation
            except ImportError:  # no role switch before SGLang 0.5.21: nothing to tear down
                say(event="teardown", rows=rows(manager), role_switch=False)
                continue

            scheduler = argparse.Namespace(
                disaggregation_mode=manager.disaggregation_mode,
                disagg_prefill_bootstrap_queue=argparse.Namespace(kv_manager=manager),
            )
            try:
                teardown_disaggregation(scheduler)
            except Exception as exc:  # the common manager has no teardown of its own
                log.info("teardown after the plugin's hook: %r", exc)
            say(event="teardown", rows=rows(manager))
        elif command == "exit":
            break
    say(event="exit")


if __name__ == "__main__":
    main()
