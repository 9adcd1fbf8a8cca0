"""What the gateway's answers say: the worker id a 202 or a 409 names, a worker's listing and the
route check it means, our worker in the list of all. Pure, and never trusting a type: the
gateway's JSON is read through `load_json` and checked field by field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ...core.outcome import Route, RouteCheck
from ...core.redact import clean
from ...core.untrusted import load_json
from ..http import HttpTransport
from ..httpvalues import HttpResult

_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def worker_id_in(result: HttpResult) -> str | None:
    """The worker id a 202 (`worker_id`) or a 409 (in its error text) names."""
    try:
        body = load_json(result.text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("worker_id"), str) and _UUID.fullmatch(body["worker_id"]):
            return str(body["worker_id"])
        text = body.get("error")
        if isinstance(text, str):
            found = _UUID.search(text)
            return found.group(0) if found else None
    return None


def json_object(result: HttpResult) -> dict[str, Any] | None:
    """A complete answer's JSON object, or None."""
    if not result.complete:
        return None
    try:
        body = load_json(result.text)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def worker_check(
    result: HttpResult, url: str | None, worker_id: str | None, http: HttpTransport
) -> RouteCheck:
    """What `GET /workers/{worker_id}` answered about our worker at `url` (`http` describes
    errors and excerpts bodies). MISSING only when the gateway does not know the id."""
    if result.error is not None:
        return http.unreachable(result)
    code = result.status_code
    if code in (400, 404):
        return RouteCheck(
            Route.MISSING,
            code,
            f"the gateway does not know worker {worker_id} (it restarted, "
            "or the worker was removed)",
        )
    info = json_object(result) if code == 200 else None
    if info is None:
        return RouteCheck(Route.UNDETERMINED, code, f"unexpected {code}: {http.excerpt(result)}")
    return listed_check(info, code, url, worker_id)


def listed_check(
    info: Mapping[str, Any], code: int | None, url: str | None, worker_id: str | None
) -> RouteCheck:
    """What the listing `info` of our worker `worker_id` (at `url`) means for the route."""
    listed = str(info.get("url", "")).rstrip("/")
    ours = (url or "").rstrip("/")
    if listed != ours:
        theirs = clean(listed, 200)
        return RouteCheck(Route.CONFLICT, code, f"our worker id lists {theirs}, not {ours}")
    status = clean(info.get("status"), 40)
    if info.get("status") == "pending":
        return RouteCheck(Route.UNDETERMINED, code, "the gateway is still adding the worker")
    if info.get("status") == "draining":
        return RouteCheck(
            Route.UNDETERMINED,
            code,
            "the gateway is removing the worker (draining); it is added again once gone",
        )
    health = "healthy" if info.get("is_healthy", True) else "not healthy by the gateway's checks"
    return RouteCheck(Route.PRESENT, code, f"listed as {worker_id} ({status}, {health})")


def workers_at(body: Mapping[str, Any] | None, url: str) -> list[dict[str, Any]] | None:
    """The workers with an id that the list `body` (of `GET /workers`) has at `url`; None when
    the list cannot be read."""
    listed = body.get("workers") if body is not None else None
    if not isinstance(listed, list):
        return None
    return [
        w
        for w in listed
        if isinstance(w, dict)
        and str(w.get("url", "")).rstrip("/") == url
        and isinstance(w.get("id"), str)
    ]
