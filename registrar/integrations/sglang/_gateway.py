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

from ...core import _rules as rules
from ...core._diagnosis import hostport
from ...core._errors import ConfigError
from ...core._group import RegistrarGroup
from ._rows import current_config
from ._settings import GatewayConfig
from ._tables import readiness

logger = logging.getLogger("registrar.integrations.sglang.gateway")

# SGLang's `--disaggregation-mode` to the gateway's worker type.
WORKER_TYPES = {"prefill": "prefill", "decode": "decode", "null": "regular", None: "regular"}
_SIGNAL_POLL = 0.25  # seconds between looks at `gracefully_exit` (a flag read)
# The shared `Registrar` options the gateway registrations take too (the bootstrap token and the
# failure policy are a prefill rank's, not the gateway's).
_PASSED = ("timeout", "verify", "backoff", "max_retry_after", "watch_interval")

_group: RegistrarGroup | None = None
_lock = threading.Lock()


def worker_of(server_args: Any, worker_url: str | None = None) -> dict[str, Any]:
    """The smg worker spec from SGLang's server args, or `ConfigError` naming what to set."""
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
    spec = {"url": rules.applied("worker url", worker_url, rules.url), "worker_type": kind}
    if kind == "prefill":
        spec["bootstrap_port"] = int(server_args.disaggregation_bootstrap_port)
    return spec


def start(
    config: GatewayConfig,
    server_args: Any,
    ready: Callable[[], bool],
    *,
    make: Callable[..., RegistrarGroup] | None = None,
) -> RegistrarGroup:
    """The plugin keeps one group: a new one replaces it."""
    global _group
    worker = worker_of(server_args, config.worker_url)
    extra: dict[str, Any] = {k: v for k, v in (config.options or {}).items() if k in _PASSED}
    for name, value in (
        ("key_file", config.key_file),
        ("grace", config.grace),
        ("drain_timeout", config.drain_timeout),
        ("bootstrap_port", worker.get("bootstrap_port")),
    ):
        if value is not None:
            extra[name] = value
    if make is None:
        from ..._assembly import smg_registrars  # noqa: PLC0415 - only with a gateway

        make = smg_registrars
    group = make(
        list(config.gateways),
        worker["url"],
        worker["worker_type"],
        ready=ready,
        max_attempts=None,
        **extra,
    )
    with _lock:
        previous, _group = _group, group
    if previous is not None:
        previous.stop()
    group.start()
    logger.info(
        "offering %s (%s) to the gateway%s %s once /ready holds; drained at SIGTERM",
        worker["url"],
        worker["worker_type"],
        "" if len(config.gateways) == 1 else "s",
        ", ".join(config.gateways),
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
    with _lock:
        group = _group
    if group is None:
        return None
    return [
        {**r.status().to_dict(), "running": r.running, "worker_id": _worker_id(r)} for r in group
    ]


def _worker_id(registrar: Any) -> str | None:
    transport = getattr(registrar, "_transport", None)
    found = getattr(transport, "worker_id", None)
    return found if isinstance(found, str) else None


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
    with _lock:
        active = _group is not None
    if active:
        while not getattr(manager, "gracefully_exit", False):
            await asyncio.sleep(_SIGNAL_POLL)
        await asyncio.get_running_loop().run_in_executor(None, drain, "SIGTERM")
    return await original(manager, *args, **kwargs)


@atexit.register
def _drain_at_exit() -> None:
    drain("process exit")
