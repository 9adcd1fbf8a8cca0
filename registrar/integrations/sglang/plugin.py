"""The plugin SGLang loads from the `sglang.srt.plugins` entry-point group.

What it hooks, through SGLang's own `HookRegistry` (no change to SGLang's source), depends on
the release: targets.py holds, per feature, the targets each release range has and what stands
in for them elsewhere (docs/sglang.md "Supported releases" is generated from it):

- registration: REPLACE `CommonKVManager._register_topology_row(self, url, payload)` (0.5.20+),
  or AROUND `register_to_bootstrap` capturing SGLang's own PUT (0.5.11-0.5.19, capture.py):
  SGLang keeps building the URL and payload; each row starts a `Registrar` kept on the manager
  (rows.py), and the rank's init returns at once instead of blocking in SGLang's retry loop;
- `/ready` false until the node-0 bootstrap server holds every row: AROUND
  `TokenizerManager.is_ready` (0.5.20+), or a `/ready` route the plugin adds (tables.py);
- a role switch stops the rank's registrars (BEFORE `teardown_disaggregation`, 0.5.21+);
- `/server_info` fields (status.py); the decode-side check of a restarted prefill (AFTER
  `_on_heartbeat_success`, also on Mooncake's override where it has one, stale_prefill.py);
- with `REGISTRAR_GATEWAY`, the smg gateway registration and its drain at SIGTERM (gateway.py).

Each hook is guarded (guard.py): an unexpected exception is logged once and SGLang's own
behaviour goes on. `HookRegistry` only logs a patch that failed, so after SGLang applies the
hooks the plugin checks each one it registered: all applied, it logs the one line that proves it
is active (`ACTIVE`), naming what this release cannot do and why; a target this SGLang has that
did not take, or no registration hook at all, is one ERROR (with `REGISTRAR_STRICT=1`, the
process stops with that line); a target a release should have and lacks (an unknown newer
release, say) is one WARNING.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pkgutil
from collections.abc import Callable
from typing import Any

from ... import __version__
from ...core.errors import ConfigError
from .capture import around_register_to_bootstrap
from .gateway import around_sigterm_watchdog, before_http_server
from .guard import guarded
from .probe import ImportProbe
from .rows import (
    DISTRIBUTION,
    before_teardown,
    configure,
    current_config,
    rank_summary,
    register_row,
    stop_rows,
)
from .settings import read_config
from .stale_prefill import after_heartbeat_success
from .status import after_internal_state, after_server_info
from .tables import add_ready_route, around_is_ready, bootstrap_summary, table_complete
from .targets import FEATURES, NEWEST_KNOWN, Plan, Target, parse_release, plan, release_text

__all__ = [
    "ACTIVE",
    "DISTRIBUTION",
    "SUPPORTED_VERSIONS",
    "TARGETS",
    "after_internal_state",
    "after_server_info",
    "bootstrap_summary",
    "load",
    "rank_summary",
    "register_row",
    "stop_rows",
    "table_complete",
    "verify",
]

logger = logging.getLogger(__name__)

SUPPORTED_VERSIONS = ("0.5.13", "0.5.19", "0.5.20", "0.5.21", "0.5.23")
"""SGLang releases tests/sglang_real runs on in CI; every release 0.5.11-0.5.23 is in the target
table (targets.py), read from its wheel."""

ACTIVE = f"{DISTRIBUTION} {__version__} active in sglang"
"""The start of the one INFO line, per process, that proves the plugin is active (grep it)."""

REGISTER_ROW = "sglang.srt.disaggregation.common.conn.CommonKVManager._register_topology_row"
HTTP_SERVER_START = "sglang.srt.entrypoints.http_server._setup_and_run_http_server"
SIGTERM_WATCHDOG = "sglang.srt.managers.tokenizer_manager.TokenizerManager.sigterm_watchdog"
TARGETS = tuple(dict.fromkeys(t.path for f in FEATURES for t in f.candidates))
"""Every target of every release (which this SGLang has: `plan`)."""


def capture_registration(original: Callable[..., Any], manager: Any, *a: Any, **k: Any) -> Any:
    """AROUND `register_to_bootstrap` (0.5.11-0.5.19): SGLang's rows start registrars."""
    return around_register_to_bootstrap(original, manager, *a, register=register_row, **k)


def start_gateway(server_args: Any, tokenizer_manager: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_setup_and_run_http_server`: with `REGISTRAR_GATEWAY`, start keeping this server
    listed by the gateway(s) (gateway.py)."""
    before_http_server(current_config().gateway, server_args, tokenizer_manager)


HOOKS: dict[str, Callable[..., Any]] = {
    "register_row": register_row,
    "capture_registration": capture_registration,
    "around_is_ready": around_is_ready,
    "add_ready_route": add_ready_route,
    "before_teardown": before_teardown,
    "after_internal_state": after_internal_state,
    "after_server_info": after_server_info,
    "after_heartbeat_success": after_heartbeat_success,
    "start_gateway": start_gateway,
    "around_sigterm_watchdog": around_sigterm_watchdog,
}
"""The hook functions the target table names."""

_plan: Plan | None = None
_registered: list[tuple[Target, Callable[..., Any]]] = []
"""What this process registered with HookRegistry: each target and the guarded hook at it."""


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


def _cause(target: str, registered: bool = True) -> str:
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
        if not registered:
            return "present, but not in the form the plugin hooks"
        return "present, but SGLang's HookRegistry did not apply the hook (see its log above)"
    return f"ModuleNotFoundError: No module named {parts[0]!r}"


def _current_plan(version: str) -> Plan:
    return _plan if _plan is not None else plan(ImportProbe(), parse_release(version))


def verify(strict: bool | None = None) -> list[str]:
    """Check each hook this process registered took effect, and log what this SGLang gets: the
    `ACTIVE` line (with what this release cannot do, and why), or one ERROR when a target this
    SGLang has did not take or registration has no hook (with `strict`, `REGISTRAR_STRICT=1`:
    `SystemExit` with that line); one WARNING naming targets a release should have and lacks.
    The targets missing or not applied."""
    if strict is None:
        strict = current_config().strict if _plan is not None else False
    version = _sglang_version()
    current = _current_plan(version)
    failed = [t.path for t, hook in _registered if not _applied(t.path, hook)]
    lacking = [c for c in current.unavailable() if c.feature.required]
    absent = [t.path for c in lacking for t in c.feature.candidates if t.covers(current.release)]
    if failed or absent:
        causes = "; ".join(
            [f"{path} ({_cause(path)})" for path in failed]
            + [f"{path} ({_cause(path, registered=False)})" for path in absent]
        )
        line = f"{DISTRIBUTION} {__version__} could not patch {causes} in sglang {version}"
        if strict:
            raise SystemExit(f"{line}; REGISTRAR_STRICT=1: stopping")
        logger.error(
            "%s; those parts are inactive and SGLang's own behaviour stands there "
            "(REGISTRAR_STRICT=1 stops the server instead)",
            line,
        )
    else:
        _log_active(current, version)
    _warn_unexpected(current, version)
    unexpected = [
        t.path
        for c in current.unexpected()
        for t in c.feature.candidates
        if t.covers(current.release)
    ]
    return list(dict.fromkeys(failed + unexpected))


def _log_active(current: Plan, version: str) -> None:
    taken = len(_registered)
    register = next(c.target for c in current.choices if c.feature.name == "registration")
    how = "captured from register_to_bootstrap" if register and register.kind == "AROUND" else ""
    cannot = [
        f"{c.feature.name} ({c.reason})"
        for c in current.unavailable()
        if c.expected and c.feature.loss
    ]
    logger.info(
        "%s %s (pid %d): %d of %d targets this sglang has applied, prefill ranks register in "
        "the background%s%s (tested on sglang %s)",
        ACTIVE,
        version,
        os.getpid(),
        taken,
        taken,
        f" ({how})" if how else "",
        f"; not on this release: {'; '.join(cannot)}" if cannot else "",
        ", ".join(SUPPORTED_VERSIONS),
    )


def _warn_unexpected(current: Plan, version: str) -> None:
    lacking = [c for c in current.unexpected() if not c.feature.required]
    if not lacking:
        return
    if current.release is None:
        which = " (a release the plugin cannot read)"
    elif current.newer():
        which = f" (newer than {release_text(NEWEST_KNOWN)}, the newest release the plugin knows)"
    else:
        which = ""
    logger.warning(
        "%s %s: sglang %s%s lacks targets the plugin looks for: %s; the rest is applied",
        DISTRIBUTION,
        __version__,
        version,
        which,
        "; ".join(f"{c.feature.name} ({c.feature.without}: {_why(c, current)})" for c in lacking),
    )


def _why(choice: Any, current: Plan) -> str:
    """Each target a release should have for `choice`'s feature, and why it is not usable."""
    covering = [t for t in choice.feature.candidates if t.covers(current.release)]
    return ", ".join(f"{t.path} ({_cause(t.path, registered=False)})" for t in covering)


def _sglang_version() -> str:
    try:
        from importlib.metadata import version  # noqa: PLC0415

        return version("sglang")
    except Exception:
        return "unknown"


def load() -> None:
    """The entry point: validate the configuration, register the hooks this SGLang has, and
    check them once SGLang has applied them. A bad or refused variable ends the process with
    one line naming it (SystemExit's message, printed once by the interpreter)."""
    global _plan
    try:
        config = read_config()
    except ConfigError as exc:
        raise SystemExit(f"{DISTRIBUTION}'s SGLang plugin: {exc}") from None
    configure(config)
    for warning in config.warnings:
        logger.warning("%s: %s", DISTRIBUTION, warning)
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    _plan = plan(ImportProbe(), parse_release(_sglang_version()))
    for target in _plan.taken():
        original = pkgutil.resolve_name(target.path) if target.kind == "REPLACE" else None
        hook = guarded(HOOKS[target.hook], target.kind, target.path, original)
        hooks.HookRegistry.register(target.path, hook, hooks.HookType[target.kind])
        _registered.append((target, hook))
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
