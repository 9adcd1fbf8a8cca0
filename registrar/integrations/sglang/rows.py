"""A prefill rank's registrations inside SGLang: one `Registrar` per topology row, kept on the
KV manager, started from SGLang's own URL and payload, stopped at a role switch or process exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import threading
import weakref
from typing import Any

from ...core.machine import State
from ...core.registrar import Registrar
from ...core.settings import EXIT_CODE
from ...protocols.sglang import rank_of
from ...surfaces.verbose import make_verbose
from .settings import PluginConfig, read_config
from .stale_prefill import close_checks

logger = logging.getLogger(__name__)

DISTRIBUTION = "sglang-registrar"
"""The name on the package index, which every line the plugin logs starts with."""

_ROWS = "_registrar_rows"
"""The attribute on a KV manager that holds its registrars, one per topology row."""

_config: PluginConfig | None = None
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_live_lock = threading.Lock()


def configure(config: PluginConfig | None) -> None:
    """The configuration `load()` read (None: read it again from the environment on use)."""
    global _config
    _config = config


def current_config() -> PluginConfig:
    return _config if _config is not None else read_config()


def register_row(manager: Any, url: str, payload: dict[str, Any]) -> None:
    """Start (or restart) the registrar of this row, SGLang's `url` and `payload` as they are."""
    config = current_config()
    root = url[: -len("/route")] if url.endswith("/route") else url
    key = (root, tuple(rank_of(payload).query().values()))
    rows: dict[tuple[Any, ...], Registrar] = manager.__dict__.setdefault(_ROWS, {})
    previous = rows.pop(key, None)
    if previous is not None:
        previous.stop()
    options = dict(config.registrar)
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
        dict(zip(("dp", "cp", "tp", "pp"), key[1], strict=True)),
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
    stopped = 0
    for registrar in list(rows.values()):
        if registrar.running:
            stopped += 1
        registrar.stop(timeout=2.0)
    if stopped:
        logger.info("stopped %d registrar%s: %s", stopped, "" if stopped == 1 else "s", reason)
    return stopped


def before_teardown(scheduler: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `teardown_disaggregation`: a role switch ends this rank's registrations (the
    server has no DELETE; the new role registers anew if it is prefill)."""
    for name in ("disagg_prefill_bootstrap_queue", "disagg_decode_prealloc_queue"):
        queue = getattr(scheduler, name, None)
        manager = getattr(queue, "kv_manager", None)
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
        out.append(
            {
                "url": status["url"],
                "rank": dict(zip(("dp", "cp", "tp", "pp"), rank, strict=True)),
                "running": registrar.running,
                **{k: v for k, v in status.items() if k != "url"},
            }
        )
    return {"rows": out}
