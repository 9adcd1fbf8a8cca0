"""SGLang's bootstrap protocol: the payload, its rank, and a route check that tells a server that
forgot us from one not ready (docs/sglang.md, "How a missing route is detected")."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..core import _rules as rules
from ..core._errors import ConfigError
from ..core._redact import clean, json_object, load_json
from ..core._settings import HttpSettings
from ..core._transport import RegisterOutcome, Route, RouteCheck, Token, Verdict, file_token
from ._http import HttpTransport
from ._httpvalues import HttpResult, with_query
from ._probe import Answer

TOKEN_ENV = "SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN"
# A bootstrap server process's own id on each of its answers (upstream PR #34289, not in 0.5.23).
INSTANCE_HEADER = "X-SGLang-Disaggregation-Instance-ID"

_SIZE_RANK = (
    ("attn_tp_size", "attn_tp_rank"),
    ("attn_cp_size", "attn_cp_rank"),
    ("attn_dp_size", "attn_dp_rank"),
    ("pp_size", "pp_rank"),
    ("system_dp_size", "system_dp_rank"),
)
# Fields the real server reads; a missing one makes it answer a bare 500.
REQUIRED_FIELDS: Mapping[str, type] = {
    **{name: int for pair in _SIZE_RANK for name in pair},
    "rank_ip": str,
    "rank_port": int,
    "page_size": int,
    "kv_cache_dtype": str,
}
# ASCII digits, and few enough that int() stays cheap and within its digit limit.
_COUNT = re.compile(r"\(([0-9]{1,9}) workers? registered\)")


def count_in(text: str) -> int | None:
    """The registered count a 503 "(N workers registered)" states, or None."""
    match = _COUNT.search(text)
    return int(match.group(1)) if match else None


def is_bootstrap_answer(answer: Answer) -> bool:
    """Whether the answer to `PROBE_PATH` is an SGLang bootstrap server's (its info, or its 503)."""
    if answer.status == 503:
        return count_in(answer.text) is not None
    return answer.status == 200 and "attn_tp_size" in (json_object(answer.text) or {})


@dataclass(frozen=True)
class Rank:
    """The slot a payload occupies in the server's table."""

    dp: int
    cp: int
    tp: int
    pp: int

    def query(self) -> dict[str, int]:
        return {
            "prefill_dp_rank": self.dp,
            "prefill_cp_rank": self.cp,
            "target_tp_rank": self.tp,
            "target_pp_rank": self.pp,
        }


# The all-`-1` route query: the server's info once every rank is in, 503 with the count before.
PROBE_PATH = with_query("/route", Rank(-1, -1, -1, -1).query())


def make_payload(  # noqa: PLR0913 - public: every payload field a keyword, as documented
    rank_ip: str,
    rank_port: int,
    *,
    attn_tp_size: int = 1,
    attn_tp_rank: int = 0,
    pp_size: int = 1,
    pp_rank: int = 0,
    page_size: int = 16,
    kv_cache_dtype: str = "auto",
    **fields: Any,
) -> dict[str, Any]:
    """A complete payload for one rank: every required field a single-rank default unless given
    (any other field too may be passed as a keyword)."""
    # Every size 1 and rank 0, in `_SIZE_RANK`'s order (the keys given below keep their place).
    single = {name: 1 if name.endswith("_size") else 0 for pair in _SIZE_RANK for name in pair}
    return {
        **single,
        "attn_tp_size": attn_tp_size,
        "attn_tp_rank": attn_tp_rank,
        "pp_size": pp_size,
        "pp_rank": pp_rank,
        "rank_ip": rank_ip,
        "rank_port": rank_port,
        "page_size": page_size,
        "kv_cache_dtype": kv_cache_dtype,
        **fields,
    }


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_payload(payload: object) -> dict[str, Any]:
    """A copy of `payload`, or one `ConfigError` listing every missing or wrong field."""
    if not isinstance(payload, Mapping):
        kind = type(payload).__name__
        raise ConfigError(f"payload must be a mapping of SGLang registration fields, got {kind}")
    problems = list(_problems(payload))
    if problems:
        raise ConfigError("invalid SGLang payload: " + "; ".join(problems))
    return dict(payload)


def _problems(payload: Mapping[str, Any]) -> Iterator[str]:
    missing = [name for name in REQUIRED_FIELDS if name not in payload]
    if missing:
        yield "missing " + ", ".join(missing)
    for name, kind in REQUIRED_FIELDS.items():
        if name not in payload:
            continue
        value = payload[name]
        if kind is int and not _is_int(value):
            yield f"{name} must be an integer, got {value!r}"
        elif kind is str and (not isinstance(value, str) or not value):
            yield f"{name} must be a non-empty string, got {value!r}"
    yield from _range_problems(payload)
    port = payload.get("rank_port")
    if _is_int(port) and not 1 <= port <= 65535:  # type: ignore[operator]
        yield f"rank_port must be within [1, 65535], got {port!r}"


def _range_problems(payload: Mapping[str, Any]) -> Iterator[str]:
    for size, rank in _SIZE_RANK:
        s, r = payload.get(size), payload.get(rank)
        if _is_int(s) and s < 1:  # type: ignore[operator]
            yield f"{size} must be >= 1, got {s!r}"
        elif rank == "system_dp_rank" and s == 1:
            # The server files the row by attn_dp_rank then (`rank_of`), and with DP attention
            # SGLang sends the attention-DP rank here: rank 1 of `--dp 2 --enable-dp-attention`
            # has system_dp_size 1 and system_dp_rank 1.
            continue
        elif _is_int(s) and _is_int(r) and not 0 <= r < s:  # type: ignore[operator]
            yield f"{rank} must be within [0, {size}={s}), got {r!r}"


def rank_of(payload: Mapping[str, Any]) -> Rank:
    """The rank the server files this payload under."""
    dp = payload["system_dp_rank"] if payload["system_dp_size"] > 1 else payload["attn_dp_rank"]
    ranks = (dp, payload["attn_cp_rank"], payload["attn_tp_rank"], payload["pp_rank"])
    return Rank(*(int(rank) for rank in ranks))


def bootstrap_token(  # noqa: PLR0911, PLR0913 - every source of the token, in its order
    token: Token | None = None,
    token_file: str | None = None,
    *,
    variable_file: str | None = None,
    variable: str | None = None,
    broadcast: object = None,
    api_key: object = None,
    env: Mapping[str, str] | None = None,
) -> tuple[Token | None, str]:
    """The bootstrap server's bearer token and where it came from: the one place deciding its
    precedence, first found wins. Given directly (a flag, `token=`, the plugin's
    `REGISTRAR_TOKEN(_FILE)`), then `--token-file`, then `REGISTRAR_TOKEN_FILE` (not visible in
    ps), then `REGISTRAR_TOKEN` (each checked where it was read: the options table,
    `HttpSettings`), then what SGLang itself would send (upstream PR #39416, not in 0.5.23): node
    0's token, broadcast to every node as the KV manager's `bootstrap_auth_token` (a node's own
    environment may differ), then SGLang's variable from `env` (the process's when None; `{}`
    leaves it to the protocol), then its `--api-key` (a `broadcast` or `api_key` that is not a
    non-empty string is none). A file is read before each request."""
    if token is not None:
        return token or None, "token" if token else TOKEN_ENV
    if token_file is not None:
        return file_token(token_file, "--token-file"), "token"
    if variable_file is not None:
        return file_token(variable_file, "REGISTRAR_TOKEN_FILE"), "token"
    if variable is not None:
        return variable or None, "token"
    if isinstance(broadcast, str) and broadcast:
        return broadcast, "bootstrap_auth_token"
    found = (os.environ if env is None else env).get(TOKEN_ENV)
    if not found and isinstance(api_key, str) and api_key:
        return api_key, "--api-key"
    return rules.applied(TOKEN_ENV, found, rules.header_token), TOKEN_ENV


def instance_of(result: HttpResult) -> str | None:
    """The server's instance id on this answer, escaped and capped (None: the header is absent)."""
    found = result.headers.get(INSTANCE_HEADER)
    return clean(found, 80) if found else None


@dataclass
class _Evidence:
    """What has been seen of the server since our last accepted PUT; `instance` is the server's
    id then (else the first one seen since), `latest` the last one seen."""

    seen_ready: bool = False
    highest_count: int = 0
    refused: bool = False
    reconnected: bool = False
    instance: str | None = None
    latest: str | None = None

    def reasons_forgotten(self, count: int) -> list[str]:
        new = self.latest if self.instance not in (None, self.latest) else None
        reasons = {
            f"the server's instance id changed from {self.instance} to {new}": new is not None,
            "the server has 0 workers registered": count == 0,
            "the topology was ready since our registration": self.seen_ready,
            f"the count fell from {self.highest_count} to {count}": count < self.highest_count,
            "a connection was refused since our registration": self.refused,
            "the kept-alive connection was re-opened since our registration": self.reconnected,
        }
        return [reason for reason, holds in reasons.items() if holds]


class SGLangTransport(HttpTransport):
    """`PUT {url}/route` and the rank query of SGLang's bootstrap server."""

    token_hint = "check the bootstrap auth token"
    token_how = f"pass one with token= or {TOKEN_ENV}"

    def __init__(self, settings: HttpSettings) -> None:
        super().__init__(settings, path="/route", auth=bootstrap_token(settings.token))
        self._evidence = _Evidence()

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        result = self.send("PUT", "/route", json=dict(payload))
        self._note(result)
        outcome = self.classify_registration(result)
        if outcome.verdict is Verdict.ACCEPTED:
            self._evidence = _Evidence(instance=instance_of(result))
        return outcome

    def _note(self, result: HttpResult) -> None:
        self._evidence.refused |= result.refused
        self._evidence.reconnected |= result.reconnected
        seen = instance_of(result)
        if seen is not None:
            self._evidence.instance = self._evidence.instance or seen
            self._evidence.latest = seen

    def check(self, payload: Mapping[str, Any]) -> RouteCheck:
        result = self.send("GET", with_query("/route", rank_of(payload).query()))
        self._note(result)
        check = self._classify_check(payload, result)
        self.settle_idle_signal(check.route in (Route.PRESENT, Route.CONFLICT))
        return check

    probe_path = PROBE_PATH
    recognise = staticmethod(is_bootstrap_answer)

    def fleet_size(self, payload: Mapping[str, Any]) -> int:
        """The ranks of the topology: all register with this one server."""
        dp = payload["system_dp_size"] if payload["system_dp_size"] > 1 else payload["attn_dp_size"]
        size = dp * payload["attn_cp_size"] * payload["attn_tp_size"] * payload["pp_size"]
        return max(1, int(size))

    def _classify_check(self, payload: Mapping[str, Any], result: HttpResult) -> RouteCheck:
        code = result.status_code
        if result.error is not None:
            return self.unreachable(result)
        assert code is not None
        body = self.excerpt(result)
        if code == 200:
            return self._classify_found(payload, result, body)
        if code == 404:
            return RouteCheck(Route.MISSING, code, f"404 for our rank from a ready server: {body}")
        if code == 503:
            return self._classify_not_ready(body)
        return RouteCheck(Route.UNDETERMINED, code, f"unexpected {code}: {body}")

    def _classify_found(
        self, payload: Mapping[str, Any], result: HttpResult, body: str
    ) -> RouteCheck:
        """A 200 names who holds our rank; any answer that does not, plainly, is undetermined
        (never an error that could end the loop, whatever its shape or size)."""
        if not result.complete:
            return RouteCheck(Route.UNDETERMINED, 200, f"200 answer too large to read: {body}")
        try:
            found = load_json(result.text)
        except ValueError as exc:
            return RouteCheck(Route.UNDETERMINED, 200, f"unparseable 200 answer ({exc}): {body}")
        ip = found.get("rank_ip") if isinstance(found, dict) else None
        port = found.get("rank_port") if isinstance(found, dict) else None
        if not isinstance(ip, str) or not _is_int(port):
            text = f"200 answer without a string rank_ip and an integer rank_port: {body}"
            return RouteCheck(Route.UNDETERMINED, 200, text)
        self._evidence.seen_ready = True
        ours = f"{payload['rank_ip']}:{payload['rank_port']}"
        if ip == payload["rank_ip"] and port == payload["rank_port"]:
            return RouteCheck(Route.PRESENT, 200, f"registered as {ours}")
        # The server's words, escaped and capped: a newline in them must not forge a log line.
        theirs = clean(f"{ip}:{port}", 120, self._auth.secrets)
        return RouteCheck(Route.CONFLICT, 200, f"our rank is registered as {theirs}, not {ours}")

    def _classify_not_ready(self, body: str) -> RouteCheck:
        count = count_in(body)
        if count is None:
            return RouteCheck(Route.UNDETERMINED, 503, f"503 without a worker count: {body}")
        reasons = self._evidence.reasons_forgotten(count)
        self._evidence.highest_count = max(self._evidence.highest_count, count)
        if reasons:
            text = f"503 with {count} workers registered: " + "; ".join(reasons)
            return RouteCheck(Route.MISSING, 503, text, count=count)
        text = f"503 with {count} workers registered (other ranks missing)"
        return RouteCheck(Route.UNDETERMINED, 503, text, count=count)
