"""Node 0's HTTP process keeps the server listed by `REGISTRAR_GATEWAY`'s smg gateways while /ready
holds, and drains from them at SIGTERM, uvicorn still serving (docs/sglang.md "The smg gateway")."""

from __future__ import annotations

import asyncio
import atexit
import ipaddress
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ...core._diagnosis import hostport
from ...core._errors import ConfigError
from ...core._group import RegistrarGroup
from ...protocols._smg.settings import SmgSettings
from ._rows import current_config
from ._settings import GatewayConfig
from ._tables import readiness

logger = logging.getLogger("registrar.integrations.sglang.gateway")

# SGLang's `--disaggregation-mode` to the gateway's worker type.
WORKER_TYPES = {"prefill": "prefill", "decode": "decode", "null": "regular", None: "regular"}
_SIGNAL_POLL = 0.25  # seconds between looks at `gracefully_exit` (a flag read)
_group: RegistrarGroup | None = None
_lock = threading.Lock()


def worker_of(server_args: Any, worker_url: str | None = None) -> dict[str, Any]:
    """The worker's `SmgSettings` fields from SGLang's server args (`worker_url` given wins), or
    `ConfigError` naming what to set."""
    mode = getattr(server_args, "disaggregation_mode", None)
    if mode not in WORKER_TYPES:
        raise ConfigError(f"--disaggregation-mode {mode!r} has no smg worker type")
    kind = WORKER_TYPES[mode]
    if worker_url is None:
        host = str(getattr(server_args, "host", "") or "")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            address = None
        if not host or (address is not None and address.is_unspecified):
            raise ConfigError(
                f"--host {host or '(none)'} is no address a gateway can reach: set "
                "REGISTRAR_WORKER_URL to this server's URL as the gateway reaches it"
            )
        scheme = "https" if getattr(server_args, "ssl_certfile", None) else "http"
        worker_url = f"{scheme}://{hostport(host, getattr(server_args, 'port', None))}"
    worker: dict[str, Any] = {"worker_url": worker_url, "worker_type": kind}
    if kind == "prefill":
        worker["bootstrap_port"] = int(server_args.disaggregation_bootstrap_port)
    return worker


def start(config: GatewayConfig, server_args: Any, ready: Callable[[], bool]) -> RegistrarGroup:
    """The plugin keeps one group, built as the library's (`smg_group`): a new one replaces it."""
    global _group
    worker = worker_of(server_args, config.smg.get("worker_url"))
    settings = SmgSettings(**{**config.smg, **worker}, ready=ready)
    from ..._assembly import smg_group  # noqa: PLC0415 - only with a gateway

    group = smg_group(settings, None, {**config.loop, "max_attempts": None})
    with _lock:
        previous, _group = _group, group
    if previous is not None:
        previous.stop()
    group.start()
    logger.info(
        "offering %s (%s) to the gateway%s %s once /ready holds; drained at SIGTERM",
        settings.worker_url,
        settings.worker_type,
        "" if len(settings.gateways) == 1 else "s",
        ", ".join(settings.gateways),
    )
    return group


def drain(reason: str) -> float | None:
    """Stop the gateway registrations (each DELETEs its worker and waits, within its bound,
    until it is no longer listed); the seconds it took, None when there was nothing to do."""
    global _group
    with _lock:
        group, _group = _group, None
    if group is None:
        return None
    started = time.monotonic()
    ended = group.stop()
    took = time.monotonic() - started
    gone = all(s.state.value != "registered" for s in group.statuses())
    logger.info(
        "drained from %d gateway%s in %.2f s (%s)%s",
        len(group),
        "" if len(group) == 1 else "s",
        took,
        reason,
        "" if ended and gone else "; not every drain finished within its bound",
    )
    return took


def gateway_summary() -> list[dict[str, Any]] | None:
    """Each gateway registration's status, for `/server_info` (None: no gateway)."""
    group = _group
    if group is None:
        return None
    return [
        {
            **r.status().to_dict(),
            "running": r.running,
            "worker_id": getattr(getattr(r, "_transport", None), "worker_id", None),
        }
        for r in group
    ]


def start_gateway(server_args: Any, tokenizer_manager: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_setup_and_run_http_server`. A bad worker address stops the server with one line
    (nothing is served unlisted)."""
    config = current_config().gateway
    if config is None or tokenizer_manager is None:
        return
    try:
        start(config, server_args, readiness(tokenizer_manager))
    except ConfigError as exc:
        raise SystemExit(f"sglang-registrar: REGISTRAR_GATEWAY: {exc}") from None


async def around_sigterm_watchdog(
    original: Callable[..., Any], manager: Any, *args: Any, **kwargs: Any
) -> Any:
    """AROUND `TokenizerManager.sigterm_watchdog`: once SIGTERM set `gracefully_exit`, drain off the
    event loop (uvicorn serves meanwhile); SGLang's watchdog then waits out requests and stops."""
    if _group is not None:
        while not getattr(manager, "gracefully_exit", False):
            await asyncio.sleep(_SIGNAL_POLL)
        await asyncio.get_running_loop().run_in_executor(None, drain, "SIGTERM")
    return await original(manager, *args, **kwargs)


@atexit.register
def _drain_at_exit() -> None:
    drain("process exit")
