"""A prefill rank's registrations inside SGLang: one `Registrar` per topology row, kept on the
KV manager, from SGLang's own URL and payload (replaced on 0.5.20+, captured from its PUT on
0.5.11-0.5.19), stopped at a role switch or process exit."""

from __future__ import annotations

import atexit
import inspect
import logging
import os
import signal
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

from ...core._board import State
from ...core._registrar import Registrar
from ...core._settings import EXIT_CODE
from ...core._transport import Token
from ...protocols._sglang import bootstrap_token, rank_of
from ...surfaces._verbose import make_verbose
from ._settings import PluginConfig, read_config
from ._stale_prefill import close_checks

logger = logging.getLogger("registrar.integrations.sglang.rows")

DISTRIBUTION = "sglang-registrar"  # the name on the package index, which log lines start with
_ROWS = "_registrar_rows"  # the KV manager's attribute holding its registrars, one per row
_RANK = ("dp", "cp", "tp", "pp")

_config: PluginConfig | None = None
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_live_lock = threading.Lock()
_capture_lock = threading.Lock()
_WILDCARDS = frozenset({"0.0.0.0", "::", ""})
_said: set[tuple[str, str]] = set()


def configure(config: PluginConfig | None) -> None:
    """None: read the environment again on use."""
    global _config
    _config = config


def current_config() -> PluginConfig:
    return _config if _config is not None else read_config()


def register_row(manager: Any, url: str, payload: dict[str, Any]) -> None:
    """Start (or restart) the registrar of this row, SGLang's `url` and `payload` as they are."""
    config = current_config()
    root = url.removesuffix("/route")
    key = (root, tuple(rank_of(payload).query().values()))
    _check_bind(getattr(manager, "server_args", None), root)
    rows: dict[tuple[Any, ...], Registrar] = manager.__dict__.setdefault(_ROWS, {})
    previous = rows.pop(key, None)
    if previous is not None:
        previous.stop()
    options = dict(config.registrar)
    options["token"] = sglang_token(manager, options.get("token"))
    if options.get("on_failure") == "exit":
        options["exit"] = _fail_rank
    registrar = Registrar(root, payload, **options)
    if config.verbose:
        make_verbose(registrar)
    rows[key] = registrar
    with _live_lock:
        _live.add(manager)
    registrar.start()
    logger.info(
        "registering rank %s with %s in the background (registrar %s)",
        dict(zip(_RANK, key[1], strict=True)),
        registrar.status().url,
        registrar.state.value,
    )
    if config.init_wait > 0 and not registrar.wait_for(State.REGISTERED, config.init_wait):
        logger.warning(
            "not registered within REGISTRAR_INIT_WAIT=%g s (%s); init goes on, registration "
            "goes on in the background",
            config.init_wait,
            registrar.status().last_error,
        )


def _addresses(host: str) -> set[str]:
    try:
        return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except (OSError, UnicodeError):  # a name that does not resolve, or is not a name at all
        return {host}


def _check_bind(args: Any, url: str) -> None:
    """Node 0 of a group binds its bootstrap server to `--host`, while every rank, its own too,
    registers at the `--dist-init-addr` host (SGLang's multi-node rule): one WARNING per process
    when those differ, since then nothing listens where the ranks register (docs/sglang.md)."""
    bind, target = getattr(args, "host", None), urlsplit(url).hostname or ""
    multi = getattr(args, "dist_init_addr", None) and getattr(args, "node_rank", 0) == 0
    if not multi or not isinstance(bind, str) or bind in _WILDCARDS or (bind, target) in _said:
        return
    _said.add((bind, target))
    if not _addresses(bind) & _addresses(target):
        logger.warning(
            "%s: node 0's bootstrap server listens on %s only (--host), but the ranks of every "
            "node register at %s (the --dist-init-addr host), where it does not listen: start "
            "node 0 with --host 0.0.0.0, or with the --dist-init-addr host",
            DISTRIBUTION,
            bind,
            target,
        )


def sglang_token(manager: Any, chosen: Token | None = None) -> Token | None:
    """`bootstrap_token` of `chosen` (REGISTRAR_TOKEN(_FILE)) and what SGLang would send."""
    return bootstrap_token(
        chosen,
        broadcast=getattr(manager, "bootstrap_auth_token", None),
        api_key=getattr(getattr(manager, "server_args", None), "api_key", None),
    )[0]


def _fail_rank(code: int) -> None:
    """on_failure=exit inside SGLang: fail as a failing scheduler does (run_scheduler_process
    sends SIGQUIT to its parent, whose handler takes the whole server down), then end."""
    logger.error(
        "%s: this prefill rank could not register with its bootstrap server "
        "(REGISTRAR_ON_FAILURE=exit); failing the scheduler: SIGQUIT to the parent process %d",
        DISTRIBUTION,
        os.getppid(),
    )
    try:
        os.kill(os.getppid(), signal.SIGQUIT)
    except OSError as exc:
        logger.error("could not signal the parent process: %s", exc)
    logging.shutdown()
    os._exit(code or EXIT_CODE)


def stop_rows(manager: Any, reason: str) -> int:
    """Stop every registrar kept on `manager`; how many were running."""
    rows: dict[tuple[Any, ...], Registrar] = getattr(manager, _ROWS, None) or {}
    stopped = sum(registrar.running for registrar in rows.values())
    for registrar in list(rows.values()):
        registrar.stop(timeout=2.0)
    if stopped:
        logger.info("stopped %d registrar%s: %s", stopped, "" if stopped == 1 else "s", reason)
    return stopped


def before_teardown(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `teardown_disaggregation`: a role switch ends this rank's registrations (the
    server has no DELETE; the new role registers anew if it is prefill)."""
    for name in ("disagg_prefill_bootstrap_queue", "disagg_decode_prealloc_queue"):
        manager = getattr(getattr(scheduler, name, None), "kv_manager", None)
        if manager is not None:
            stop_rows(manager, "PD role switch")
            close_checks(manager)


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        managers = list(_live)
    for manager in managers:
        stop_rows(manager, "process exit")


def rank_summary(manager: Any) -> dict[str, Any]:
    """This rank's registrations, one entry per topology row, for `/server_info`."""
    rows: dict[tuple[Any, ...], Registrar] = getattr(manager, _ROWS, None) or {}
    out = []
    for (_url, rank), registrar in rows.items():
        status = registrar.status().to_dict()
        head = {"url": status.pop("url"), "rank": dict(zip(_RANK, rank, strict=True))}
        out.append({**head, "running": registrar.running, **status})
    return {"rows": out}


Row = tuple[str, dict[str, Any]]
_ACCEPTED = {"status_code": 200, "ok": True, "text": "", "content": b"", "reason": "OK"}


class CapturingRequests:
    """Stands for the `requests` module inside SGLang's conn module while rows are captured."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self._local = threading.local()
        self.users = 0  # threads capturing in its namespace: the last one puts `requests` back

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def put(self, url: Any, *args: Any, **kwargs: Any) -> Any:
        rows: list[Row] | None = getattr(self._local, "rows", None)
        payload = kwargs.get("json")
        if rows is None or args or not isinstance(url, str) or not isinstance(payload, dict):
            return self.real.put(url, *args, **kwargs)  # not the call we capture: SGLang's own
        rows.append((url, dict(payload)))
        # A 200, as `requests.Response` shows one.
        return SimpleNamespace(**_ACCEPTED, json=dict, raise_for_status=lambda: None)


@contextmanager
def capturing(namespace: dict[str, Any]) -> Iterator[list[Row]]:
    """While inside, `namespace["requests"]` (SGLang's module globals) records this thread's PUTs in
    the list yielded and answers them 200, so SGLang's blocking loop ends at its first try."""
    with _capture_lock:
        proxy = namespace.get("requests")
        if not isinstance(proxy, CapturingRequests):
            proxy = CapturingRequests(proxy)
            namespace["requests"] = proxy
        proxy.users += 1
    rows: list[Row] = []
    proxy._local.rows = rows
    try:
        yield rows
    finally:
        proxy._local.rows = None
        with _capture_lock:
            proxy.users -= 1
            if proxy.users == 0:
                namespace["requests"] = proxy.real


def capture_registration(
    original: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND `register_to_bootstrap`: `register_row` for each captured row; one whose registrar
    cannot start is sent once as SGLang would, never leaving the rank unregistered."""
    namespace = inspect.unwrap(original).__globals__
    with capturing(namespace) as rows:
        result = original(manager, *args, **kwargs)
    for url, payload in rows:
        try:
            register_row(manager, url, payload)
        except Exception:
            logger.exception(
                "sglang-registrar: could not start the registrar for %s; sending SGLang's PUT "
                "once instead",
                url,
            )
            requests = namespace.get("requests")
            try:
                sent = requests.put(url, json=payload, timeout=5) if requests is not None else None
                status = getattr(sent, "status_code", None)
                if status != 200:
                    logger.error("sglang-registrar: SGLang's PUT to %s answered %s", url, status)
            except Exception as exc:
                logger.error("sglang-registrar: SGLang's PUT to %s failed: %s", url, exc)
    return result
