"""SGLang's bootstrap route table and its `/route` handlers, step for step (same reads, checks
and order, so the same payload fails the same way), as of SGLang 0.5.23 (docs/sglang.md, "The
reference bootstrap server"; the tests' lab copies earlier releases, docs/testing.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..protocols._sglang import REQUIRED_FIELDS

_RANK_QUERY = ("prefill_dp_rank", "prefill_cp_rank", "target_tp_rank", "target_pp_rank")

CRASH = "500 Internal Server Error\n\nServer got itself in trouble"
"""aiohttp's answer when a handler raises: the real server lets bad input escape its handlers."""

Reply = tuple[int, str, str]
"""An answer: its status, text and content type."""


@dataclass
class RouteTable:
    """`CommonKVBootstrapServer`'s memory. Values are kept as the payload gave them, so a wrongly
    typed one fails later where it fails on the real server. The server's lock guards it."""

    attn_tp_size: Any = None
    attn_cp_size: Any = None
    dp_size: Any = None
    pp_size: Any = None
    page_size: Any = None
    kv_cache_dtype: Any = None
    kv_layout: Any = None
    dsv41_spec_layout: Any = None
    follow_bootstrap_room: bool | None = None
    enable_dsa_cache_layer_split: bool | None = None
    enable_kv_cache_sharding: bool | None = None
    prefill_http_port: int | None = None
    decode_allocation_policy: Any = "early"
    ranks: dict[tuple[Any, Any, Any, Any], dict[str, Any]] = field(default_factory=dict)
    count: int = 0

    def ready(self) -> bool:
        """The real `_is_ready`: raises TypeError, as it does, on wrongly typed sizes."""
        sizes = (self.attn_tp_size, self.attn_cp_size, self.pp_size, self.dp_size)
        return None not in sizes and bool(self.count >= self.expected())

    def expected(self) -> Any:
        return self.dp_size * self.attn_cp_size * self.attn_tp_size * self.pp_size

    def put(self, body: bytes) -> Reply:
        """SGLang's `_handle_route_put`: reads first (a null page_size fails before any change)."""
        data = json.loads(body)
        fields = {name: data[name] for name in REQUIRED_FIELDS}
        rank_port = int(fields["rank_port"])
        int(fields["page_size"])
        # The layout checks; the last writer's values kept.
        layout = data.get("dsv41_spec_layout")
        if self.count and self.dsv41_spec_layout != layout:
            text = "DeepSeek-V4.1 DSpark PD layout differs across prefill ranks"
            return 400, text, "text/plain"
        policy = data.get("decode_allocation_policy", "early")
        if self.count and self.decode_allocation_policy != policy:
            return 400, "Inconsistent prefill allocation policies", "text/plain"
        self.decode_allocation_policy = policy
        self.dsv41_spec_layout = layout
        single = fields["system_dp_size"] == 1
        # The topology's fields are set by the first registration that carries them, in
        # SGLang's order of assignments (so that a bad value fails at the same point).
        port = data.get("prefill_http_port")
        balance = data.get("load_balance_method", "follow_bootstrap_room")
        firsts: tuple[tuple[str, Callable[[], Any]], ...] = (
            ("attn_tp_size", lambda: fields["attn_tp_size"]),
            ("attn_cp_size", lambda: fields["attn_cp_size"]),
            ("dp_size", lambda: fields["attn_dp_size"] if single else fields["system_dp_size"]),
            ("pp_size", lambda: fields["pp_size"]),
            ("page_size", lambda: int(fields["page_size"])),
            ("kv_cache_dtype", lambda: fields["kv_cache_dtype"]),
            ("kv_layout", lambda: data.get("kv_layout")),
            ("prefill_http_port", lambda: None if port is None else int(port)),
            ("follow_bootstrap_room", lambda: balance == "follow_bootstrap_room"),
            (
                "enable_dsa_cache_layer_split",
                lambda: bool(data.get("enable_dsa_cache_layer_split")),
            ),
            ("enable_kv_cache_sharding", lambda: bool(data.get("enable_kv_cache_sharding"))),
        )
        for name, value in firsts:
            if getattr(self, name) is None:
                chosen = value()
                if chosen is not None:
                    setattr(self, name, chosen)
        dp = fields["attn_dp_rank"] if single else fields["system_dp_rank"]
        key = (dp, fields["attn_cp_rank"], fields["attn_tp_rank"], fields["pp_rank"])
        self.ranks[key] = {"rank_ip": fields["rank_ip"], "rank_port": rank_port}
        self.count += 1
        self.expected()  # computed for a log line after the count: a bad size fails here
        return 200, "OK", "text/plain"

    def get(self, path: str) -> Reply:
        """SGLang's `_handle_route_get` (a repeated parameter's first; int() where it calls it)."""
        query = parse_qs(urlsplit(path).query)
        values = [query[name][0] if name in query else "" for name in _RANK_QUERY]
        if not all(values):
            return 400, "Missing inputs for bootstrap server.", "text/plain"
        dp, cp, tp, pp = values
        everything = int(dp) == -1 and int(cp) == -1 and int(tp) == -1 and int(pp) == -1
        if not self.ready():
            text = f"Prefill server not fully registered yet ({self.count} workers registered)."
            return 503, text, "text/plain"
        if everything:
            return 200, json.dumps(self.info()), "application/json"
        # Keys are the payload's values; the real nested lookup by int finds the same ones.
        found = self.ranks.get((int(dp), int(cp), int(tp), int(pp)))
        if found is None:
            text = (
                f"Bootstrap info not found for dp_rank={dp} cp_rank={cp} tp_rank={tp} pp_rank={pp}"
            )
            return 404, text, "text/plain"
        return 200, json.dumps(found), "application/json"

    def info(self) -> dict[str, Any]:
        """The answer to the all-`-1` query: `PrefillServerInfo` as the real server sends it."""
        info: dict[str, Any] = {
            "attn_tp_size": int(self.attn_tp_size),
            "attn_cp_size": int(self.attn_cp_size),
            "dp_size": int(self.dp_size),
            "pp_size": int(self.pp_size),
            "page_size": int(self.page_size) if self.page_size is not None else None,
            "kv_cache_dtype": str(self.kv_cache_dtype) if self.kv_cache_dtype is not None else None,
            "follow_bootstrap_room": self.follow_bootstrap_room is not False,  # None: True
            "enable_dsa_cache_layer_split": bool(self.enable_dsa_cache_layer_split),
            "dsv41_spec_layout": self.dsv41_spec_layout,
            "kv_layout": self.kv_layout,
            "decode_allocation_policy": self.decode_allocation_policy,
            "enable_kv_cache_sharding": bool(self.enable_kv_cache_sharding),
            "prefill_http_port": self.prefill_http_port,
            "target_tp_rank": None,
            "target_tp_ranks": None,
            "target_cp_ranks": None,
            "target_pp_ranks": None,
            "required_dst_info_num": None,
            "required_prefill_response_num": None,
        }
        layouts = ("dsv41_spec_layout", "kv_layout")  # only when set
        return {k: v for k, v in info.items() if v is not None or k not in layouts}
