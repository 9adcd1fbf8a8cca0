"""Registration where SGLang has no `_register_topology_row` (0.5.11-0.5.19): there
`register_to_bootstrap` sends its PUT itself with the module-level `requests`, in a blocking
loop. For the call's duration that `requests` is a proxy whose `put`, on the calling thread
only, records `(url, json)` and answers 200, so SGLang builds everything and its loop ends at
its first try; each recorded row then starts the registrar the REPLACE starts on 0.5.20+.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .rows import register_row

logger = logging.getLogger(__name__)

Row = tuple[str, dict[str, Any]]


class Accepted:
    """What the proxy answers SGLang's PUT: a 200, as `requests.Response` shows one."""

    status_code = 200
    ok = True
    text = ""
    content = b""
    reason = "OK"

    def json(self) -> Any:
        return {}

    def raise_for_status(self) -> None:
        return None


class CapturingRequests:
    """Stands for the `requests` module inside SGLang's conn module while rows are captured."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self._local = threading.local()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def rows(self) -> list[Row] | None:
        found: list[Row] | None = getattr(self._local, "rows", None)
        return found

    def put(self, url: Any, *args: Any, **kwargs: Any) -> Any:
        rows = self.rows()
        payload = kwargs.get("json")
        if rows is None or args or not isinstance(url, str) or not isinstance(payload, dict):
            return self.real.put(url, *args, **kwargs)  # not the call we capture: SGLang's own
        rows.append((url, dict(payload)))
        return Accepted()


_lock = threading.Lock()
_users: dict[int, int] = {}
"""How many threads capture in each module namespace (id of its globals), to put the real
`requests` back when the last one ends."""


@contextmanager
def capturing(namespace: dict[str, Any]) -> Iterator[list[Row]]:
    """While inside, `namespace["requests"]` (SGLang's module globals) records this thread's
    PUTs in the list yielded; other threads are not affected."""
    key = id(namespace)
    with _lock:
        proxy = namespace.get("requests")
        if not isinstance(proxy, CapturingRequests):
            proxy = CapturingRequests(proxy)
            namespace["requests"] = proxy
        _users[key] = _users.get(key, 0) + 1
    rows: list[Row] = []
    proxy._local.rows = rows
    try:
        yield rows
    finally:
        proxy._local.rows = None
        with _lock:
            _users[key] -= 1
            if _users[key] == 0:
                del _users[key]
                namespace["requests"] = proxy.real


def around_register_to_bootstrap(
    original: Callable[..., Any],
    manager: Any,
    *args: Any,
    register: Callable[[Any, str, dict[str, Any]], None] = register_row,
    **kwargs: Any,
) -> Any:
    """AROUND `register_to_bootstrap`: each captured row starts a registrar (`register`). A row
    whose registrar cannot start is sent once as SGLang would, so the plugin never leaves the
    rank unregistered."""
    namespace = inspect.unwrap(original).__globals__
    with capturing(namespace) as rows:
        result = original(manager, *args, **kwargs)
    for url, payload in rows:
        try:
            register(manager, url, payload)
        except Exception:
            logger.exception(
                "sglang-registrar: could not start the registrar for %s; sending SGLang's PUT "
                "once instead",
                url,
            )
            _send_once(namespace, url, payload)
    return result


def _send_once(namespace: dict[str, Any], url: str, payload: dict[str, Any]) -> None:
    requests = namespace.get("requests")
    try:
        response = requests.put(url, json=payload, timeout=5) if requests is not None else None
        status = getattr(response, "status_code", None)
        if status != 200:
            logger.error("sglang-registrar: SGLang's PUT to %s answered %s", url, status)
    except Exception as exc:
        logger.error("sglang-registrar: SGLang's PUT to %s failed: %s", url, exc)
