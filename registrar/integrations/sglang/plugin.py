"""The plugin SGLang loads from the `sglang.srt.plugins` entry-point group.

What it patches, through SGLang's own `HookRegistry` (no change to SGLang's source):

- REPLACE `CommonKVManager._register_topology_row(self, url, payload)`: SGLang keeps building the
  URL and payload (multi-node host and port sync, every transfer backend); each row starts a
  `Registrar` kept on the manager, and the rank's init returns at once instead of blocking in
  the upstream retry loop (optionally after a bounded wait, `REGISTRAR_INIT_WAIT`).
- BEFORE `role_switch.teardown_disaggregation(scheduler)`: a role switch stops the rank's
  registrars before SGLang tears its manager down (and process exit stops them too).
- AROUND `TokenizerManager.is_ready`: `/ready` is false until the node-0 bootstrap server holds
  every row of its topology.
- AFTER `SchedulerInternalStateController.get_internal_state`: `/server_info` carries each
  answering scheduler's registration summary under `internal_states[i]["registrar"]`.
- AFTER `build_server_info`: in the node-0 HTTP process, `/server_info` also carries the
  bootstrap server's missing rows under `registrar_bootstrap`.
- AFTER `CommonKVManager._on_heartbeat_success` (decode): drop a restarted prefill's stale
  cached addresses through SGLang's own node-failure handling (stale_prefill.py).
- BEFORE `http_server._setup_and_run_http_server` and AROUND
  `TokenizerManager.sigterm_watchdog`: with `REGISTRAR_GATEWAY`, node 0's HTTP process keeps
  the server listed by the smg gateway(s) once `/ready` holds, and drains from them at SIGTERM
  before SGLang stops serving (gateway.py); `/server_info` shows it under `registrar_gateway`.

`HookRegistry` only logs a patch that failed, so after SGLang applies the hooks the plugin checks
each target: all applied, it logs the one line that proves it is active (`ACTIVE`); otherwise
one ERROR naming each missing target, its cause and the supported versions, or with
`REGISTRAR_STRICT=1` it stops the process with that line.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import logging
import os
import pkgutil
import signal
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

from ..._version import __version__
from ...core.errors import ConfigError
from ...core.machine import State
from ...core.registrar import Registrar
from ...core.settings import EXIT_CODE
from ...protocols.sglang import rank_of
from ...surfaces.verbose import make_verbose
from .gateway import around_sigterm_watchdog, before_http_server, gateway_summary
from .settings import PluginConfig, read_config
from .stale_prefill import after_heartbeat_success, close_checks

__all__ = [
    "ACTIVE",
    "DISTRIBUTION",
    "SUPPORTED_VERSIONS",
    "TARGETS",
    "bootstrap_summary",
    "load",
    "rank_summary",
    "table_complete",
    "verify",
]

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("0.5.23",)
"""SGLang versions the plugin is tested on (tests/sglang_real)."""

DISTRIBUTION = "sglang-registrar"
"""The name on the package index, which every line the plugin logs starts with."""

ACTIVE = f"{DISTRIBUTION} {__version__} active in sglang"
"""The start of the one INFO line, per process, that proves the plugin is active (grep it)."""

_CONN = "sglang.srt.disaggregation.common.conn"
REGISTER_ROW = f"{_CONN}.CommonKVManager._register_topology_row"
TEARDOWN = "sglang.srt.disaggregation.role_switch.teardown_disaggregation"
IS_READY = "sglang.srt.managers.tokenizer_manager.TokenizerManager.is_ready"
INTERNAL_STATE = (
    "sglang.srt.managers.scheduler_components.internal_state."
    "SchedulerInternalStateController.get_internal_state"
)
SERVER_INFO = "sglang.srt.utils.common.build_server_info"
HEARTBEAT_OK = f"{_CONN}.CommonKVManager._on_heartbeat_success"
_HTTP_SERVER = "sglang.srt.entrypoints.http_server"
HTTP_SERVER_START = f"{_HTTP_SERVER}._setup_and_run_http_server"
SIGTERM_WATCHDOG = "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog"
_MAX_LISTED = 64
"""At most this many missing rows are listed in /server_info (the count is always there)."""

_ROWS = "_registrar_rows"
"""The attribute on a KV manager that holds its registrars, one per topology row."""


_config: PluginConfig | None = None
_live: weakref.WeakSet[Any] = weakref.WeakSet()
_live_lock = threading.Lock()


# ------------------------------------------------------------------------ the hooks


def register_row(manager: Any, url: str, payload: dict[str, Any]) -> None:
    """REPLACE for `_register_topology_row`: start (or restart) this row's registrar."""
    config = _config if _config is not None else read_config()
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


def table_complete(server: Any) -> bool:
    """Whether a bootstrap server's table holds every (dp, cp, tp, pp) row of its topology (not
    its count: the real server counts every PUT, so a doubled one would read as complete)."""
    sizes = [getattr(server, name, None) for name in _SIZES]
    if not all(isinstance(size, int) and size >= 1 for size in sizes):
        return False
    dp, cp, tp, pp = (int(size) for size in sizes)  # type: ignore[arg-type]
    try:
        table = server.prefill_port_table
        for d in range(dp):
            for c in range(cp):
                for t in range(tp):
                    held = table.get(d, {}).get(c, {}).get(t, {})
                    if any(p not in held for p in range(pp)):
                        return False
    except (RuntimeError, AttributeError):  # changed under us by the server's thread
        return False
    return True


_SIZES = ("dp_size", "attn_cp_size", "attn_tp_size", "pp_size")


def around_is_ready(original: Callable[..., bool], manager: Any, *args: Any, **kwargs: Any) -> bool:
    """AROUND `TokenizerManager.is_ready`: also false until the node-0 bootstrap server that
    this process holds has every row of its topology registered."""
    if not original(manager, *args, **kwargs):
        return False
    server = getattr(manager, "bootstrap_server", None)
    if server is None or not hasattr(server, "prefill_port_table"):
        return True  # not the node-0 prefill HTTP process: nothing to wait for here
    return table_complete(server)


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


def after_internal_state(result: Any, controller: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER the scheduler's `get_internal_state`: add this rank's registration summary."""
    state = getattr(result, "internal_state", None)
    scheduler = getattr(controller, "scheduler", None)
    queue = getattr(scheduler, "disagg_prefill_bootstrap_queue", None)
    manager = getattr(queue, "kv_manager", None)
    if isinstance(state, dict) and manager is not None:
        state["registrar"] = rank_summary(manager)
    return result


# ------------------------------------------------------------------------ loading


def bootstrap_summary(server: Any) -> dict[str, Any]:
    """What a node-0 bootstrap server holds: its count, whether every row of its topology is
    there, and which rows are missing (dp, cp, tp, pp)."""
    sizes = [getattr(server, name, None) for name in _SIZES]
    summary: dict[str, Any] = {
        "registered_count": getattr(server, "_registered_count", None),
        "complete": table_complete(server),
    }
    if not all(isinstance(size, int) and size >= 1 for size in sizes):
        summary["missing_rows"] = None  # no rank has registered yet: the topology is unknown
        return summary
    dp, cp, tp, pp = (int(size) for size in sizes)  # type: ignore[arg-type]
    try:
        table = server.prefill_port_table
        missing = [
            {"dp": d, "cp": c, "tp": t, "pp": p}
            for d in range(dp)
            for c in range(cp)
            for t in range(tp)
            for p in range(pp)
            if p not in table.get(d, {}).get(c, {}).get(t, {})
        ]
    except (RuntimeError, AttributeError):  # changed under us by the server's thread
        missing = []
    summary["expected_rows"] = dp * cp * tp * pp
    summary["missing_count"] = len(missing)
    summary["missing_rows"] = missing[:_MAX_LISTED]
    return summary


def after_server_info(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER `build_server_info`: in the node-0 HTTP process, which holds the bootstrap server,
    /server_info also says which rows the server is missing (`registrar_bootstrap`)."""
    http_server = sys.modules.get(_HTTP_SERVER)
    state = getattr(http_server, "_global_state", None)
    manager = getattr(state, "tokenizer_manager", None)
    server = getattr(manager, "bootstrap_server", None)
    if isinstance(result, dict) and hasattr(server, "prefill_port_table"):
        result["registrar_bootstrap"] = bootstrap_summary(server)
    gateways = gateway_summary()
    if isinstance(result, dict) and gateways is not None:
        result["registrar_gateway"] = gateways
    return result


def start_gateway(server_args: Any, tokenizer_manager: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_setup_and_run_http_server`: with `REGISTRAR_GATEWAY`, start keeping this server
    listed by the gateway(s) (gateway.py)."""
    config = _config if _config is not None else read_config()
    before_http_server(config.gateway, server_args, tokenizer_manager)


def _hooks() -> list[tuple[str, Callable[..., Any], str]]:
    return [
        (REGISTER_ROW, register_row, "REPLACE"),
        (TEARDOWN, before_teardown, "BEFORE"),
        (IS_READY, around_is_ready, "AROUND"),
        (INTERNAL_STATE, after_internal_state, "AFTER"),
        (SERVER_INFO, after_server_info, "AFTER"),
        (HEARTBEAT_OK, after_heartbeat_success, "AFTER"),
        (HTTP_SERVER_START, start_gateway, "BEFORE"),
        (SIGTERM_WATCHDOG, around_sigterm_watchdog, "AROUND"),
    ]


TARGETS = tuple(target for target, _, _ in _hooks())


def _applied(target: str, hook: Callable[..., Any]) -> bool:
    """Whether `hook` is in the wrapper chain now installed at `target`."""
    try:
        current = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError):
        return False
    seen = 0
    while current is not None and seen < 32:
        cells = getattr(current, "__closure__", None) or ()
        if any(_cell(c) is hook for c in cells):
            return True
        current = getattr(current, "__wrapped__", None)
        seen += 1
    return False


def _cell(cell: Any) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return None


def _cause(target: str) -> str:
    """Why `target` is not patched: the error importing its module (a module SGLang needs that
    is missing: `pkgutil.resolve_name` would turn it into an AttributeError), the attribute
    that is not there (a renamed method), or that the registry did not apply the hook."""
    parts = target.split(".")
    for end in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module
        name = ".".join(parts[:end])
        try:
            if importlib.util.find_spec(name) is None:
                continue
            found: Any = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue  # not a module: a class or function of a shorter prefix
            return f"ModuleNotFoundError: {exc}"  # a module it imports is missing
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        try:
            for attribute in parts[end:]:
                found = getattr(found, attribute)
        except AttributeError as exc:
            return f"AttributeError: {exc}"
        return "present, but SGLang's HookRegistry did not apply the hook (see its log above)"
    return f"ModuleNotFoundError: No module named {parts[0]!r}"


def verify(strict: bool | None = None) -> list[str]:
    """Check each patch took effect. All of them: log the `ACTIVE` line. Otherwise one ERROR
    naming each missing target and its cause, or with `strict` (`REGISTRAR_STRICT=1`)
    `SystemExit` with that line, which stops the server at load. The missing targets."""
    if strict is None:
        strict = _config is not None and _config.strict
    version = _sglang_version()
    missing = [target for target, hook, _ in _hooks() if not _applied(target, hook)]
    if not missing:
        logger.info(
            "%s %s (pid %d): %d of %d patches applied, prefill ranks register in the "
            "background (supports sglang %s)",
            ACTIVE,
            version,
            os.getpid(),
            len(TARGETS),
            len(TARGETS),
            ", ".join(SUPPORTED_VERSIONS),
        )
        return missing
    causes = "; ".join(f"{target} ({_cause(target)})" for target in missing)
    line = (
        f"{DISTRIBUTION} {__version__} could not patch {causes} in sglang {version} "
        f"(supported: {', '.join(SUPPORTED_VERSIONS)})"
    )
    if strict:
        raise SystemExit(f"{line}; REGISTRAR_STRICT=1: stopping")
    logger.error(
        "%s; those parts are inactive and SGLang's own behaviour stands there "
        "(REGISTRAR_STRICT=1 stops the server instead)",
        line,
    )
    return missing


def _sglang_version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("sglang")
    except Exception:
        return "unknown"


def load() -> None:
    """The entry point: validate the configuration, register the hooks, and check them once
    SGLang has applied them. A bad or refused variable ends the process with one line naming
    it (SystemExit's message, printed once by the interpreter)."""
    global _config
    try:
        _config = read_config()
    except ConfigError as exc:
        raise SystemExit(f"{DISTRIBUTION}'s SGLang plugin: {exc}") from None
    for warning in _config.warnings:
        logger.warning("%s: %s", DISTRIBUTION, warning)
    version = _sglang_version()
    if version not in SUPPORTED_VERSIONS:
        logger.warning(
            "%s %s supports sglang %s; this is sglang %s: each patch is checked once SGLang "
            "applies them",
            DISTRIBUTION,
            __version__,
            ", ".join(SUPPORTED_VERSIONS),
            version,
        )
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    for target, hook, kind in _hooks():
        hooks.HookRegistry.register(target, hook, hooks.HookType[kind])
    _verify_after_apply(hooks.HookRegistry)


def _verify_after_apply(registry: Any) -> None:
    """Run `verify()` right after SGLang's next `HookRegistry.apply_hooks()` (load_plugins
    calls it once every plugin has registered), then put the original back."""
    original = registry.__dict__["apply_hooks"]
    if getattr(original.__func__, "_registrar_verifies", False):
        return

    def apply_then_verify(cls: Any) -> None:
        try:
            original.__func__(cls)
        finally:
            registry.apply_hooks = original
        verify()

    apply_then_verify._registrar_verifies = True  # type: ignore[attr-defined]
    registry.apply_hooks = classmethod(apply_then_verify)
