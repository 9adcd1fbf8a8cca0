"""The entry point SGLang loads: installs the targets this release has through its
`HookRegistry`, each guarded, then logs the `ACTIVE` line or one ERROR naming what did not take
(docs/sglang.md "What changes in SGLang", "Is it active?"); and the `/server_info` hooks."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import pkgutil
import sys
from collections.abc import Callable
from typing import Any

from ..._version import __version__
from ...core._errors import ConfigError
from . import _gateway, _rows, _stale_prefill, _tables, _targets
from ._guard import guarded
from ._logs import hold
from ._probe import ImportProbe
from ._rows import DISTRIBUTION, configure, current_config
from ._settings import read_config
from ._targets import installed_version

logger = logging.getLogger("registrar.integrations.sglang.plugin")

SUPPORTED_VERSIONS = ("0.5.13", "0.5.19", "0.5.20", "0.5.21", "0.5.23")  # tests/sglang_real's
ACTIVE = f"{DISTRIBUTION} {__version__} active in sglang"  # one INFO line per process: grep it
TARGETS = tuple(dict.fromkeys(t.path for f in _targets.FEATURES for t in f.candidates))


def after_internal_state(result: Any, owner: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER `get_internal_state`: the scheduler's, or (0.5.22+) its internal-state controller's."""
    state = getattr(result, "internal_state", None)
    queue = getattr(getattr(owner, "scheduler", owner), "disagg_prefill_bootstrap_queue", None)
    manager = getattr(queue, "kv_manager", None)
    if isinstance(state, dict) and manager is not None:
        state["registrar"] = _rows.rank_summary(manager)
    return result


def after_server_info(result: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER `build_server_info`: in the node-0 HTTP process, which holds the bootstrap server."""
    state = getattr(sys.modules.get(_tables.HTTP_SERVER), "_global_state", None)
    server = getattr(getattr(state, "tokenizer_manager", None), "bootstrap_server", None)
    if isinstance(result, dict) and hasattr(server, "prefill_port_table"):
        result["registrar_bootstrap"] = _tables.bootstrap_summary(server)
    gateways = _gateway.gateway_summary()
    if isinstance(result, dict) and gateways is not None:
        result["registrar_gateway"] = gateways
    return result


HOOKS: dict[str, Callable[..., Any]] = {
    "register_row": _rows.register_row,
    "capture_registration": _rows.capture_registration,
    "around_is_ready": _tables.around_is_ready,
    "add_ready_route": _tables.add_ready_route,
    "before_teardown": _rows.before_teardown,
    "after_internal_state": after_internal_state,
    "after_server_info": after_server_info,
    "after_heartbeat_success": _stale_prefill.after_heartbeat_success,
    "start_gateway": _gateway.start_gateway,
    "around_sigterm_watchdog": _gateway.around_sigterm_watchdog,
}

_plan: _targets.Plan | None = None
_registered: list[tuple[_targets.Target, Callable[..., Any]]] = []  # targets, guarded hooks


def _applied(target: str, hook: Callable[..., Any]) -> bool:
    """Whether `hook` is in the wrapper chain now installed at `target`."""
    try:
        current = pkgutil.resolve_name(target)
    except (ImportError, AttributeError, ValueError):
        return False
    for _ in range(32):  # a bound, should a chain loop
        for cell in getattr(current, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                if cell.cell_contents is hook:
                    return True
        current = getattr(current, "__wrapped__", None)
    return False


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
            functools.reduce(getattr, parts[end:], importlib.import_module(name))
        except Exception as exc:
            if isinstance(exc, ModuleNotFoundError) and exc.name == name:
                continue  # not a module: a class or function of a shorter prefix
            return f"{type(exc).__name__}: {exc}"  # a module it imports is missing, or a name
        if all(t.path != target for t, _ in _registered):
            return "present, but not in the form the plugin hooks"
        return "present, but SGLang's HookRegistry did not apply the hook (see its log above)"
    return f"ModuleNotFoundError: No module named {parts[0]!r}"


def _installed_plan() -> _targets.Plan:
    release = _targets.parse_release(installed_version())
    return _targets.plan(ImportProbe(), release, _targets.rust_server_mode(os.environ))


def verify(strict: bool | None = None) -> list[str]:
    """Check each hook this process registered took effect and log what this SGLang gets (an
    ERROR is `SystemExit` with `strict`, `REGISTRAR_STRICT=1`); the targets missing or unapplied."""
    strict = current_config().strict if strict is None and _plan is not None else bool(strict)
    version = installed_version() or "unknown"
    current = _plan or _installed_plan()
    failed = [t.path for t, hook in _registered if not _applied(t.path, hook)]
    lacking = [c for c in current.unavailable() if c.feature.required]
    absent = [t.path for c in lacking for t in c.feature.covering(current.release)]
    if failed or absent:
        causes = "; ".join(f"{path} ({_cause(path)})" for path in failed + absent)
        line = f"{DISTRIBUTION} {__version__} could not patch {causes} in sglang {version}"
        if strict:
            raise SystemExit(f"{line}; REGISTRAR_STRICT=1: stopping")
        logger.error(
            "%s; those parts are inactive and SGLang's own behaviour stands there "
            "(REGISTRAR_STRICT=1 stops the server instead)",
            line,
        )
    else:
        around = any(t.hook == "capture_registration" for t in current.taken())
        lost = current.lost()
        cannot = "; ".join(f"{c.feature.name} ({c.reason})" for c in lost if not c.mode)
        moded = "; ".join(f"{c.feature.name} ({c.feature.rust_server})" for c in lost if c.mode)
        if moded and strict:
            raise SystemExit(
                f"{DISTRIBUTION} {__version__} cannot run with {_targets.RUST_MODE}: {moded}; "
                "REGISTRAR_STRICT=1: stopping"
            )
        logger.info(
            "%s %s (pid %d): %d of %d targets this sglang has applied, prefill ranks register in "
            "the background%s%s%s (tested on sglang %s)",
            ACTIVE,
            version,
            os.getpid(),
            len(_registered),
            len(_registered),
            " (captured from register_to_bootstrap)" if around else "",
            f"; not on this release: {cannot}" if cannot else "",
            f"; not with {_targets.RUST_MODE}: {moded}" if moded else "",
            ", ".join(SUPPORTED_VERSIONS),
        )
    lacking = [c for c in current.unexpected() if not c.feature.required]
    if lacking:
        which = ""
        if current.release is None:
            which = " (a release the plugin cannot read)"
        elif current.newer():
            newest = _targets.release_text(_targets.NEWEST_KNOWN)
            which = f" (newer than {newest}, the newest release the plugin knows)"
        logger.warning(
            "%s %s: sglang %s%s lacks targets the plugin looks for: %s; the rest is applied",
            DISTRIBUTION,
            __version__,
            version,
            which,
            "; ".join(_why(c.feature, current.release) for c in lacking),
        )
    unexpected = [t.path for c in current.unexpected() for t in c.feature.covering(current.release)]
    return list(dict.fromkeys(failed + unexpected))


def _why(feature: _targets.Feature, release: _targets.Release | None) -> str:
    """`feature`, each target `release` should have for it, and why that is not usable."""
    covering = ", ".join(f"{t.path} ({_cause(t.path)})" for t in feature.covering(release))
    return f"{feature.name} ({feature.without}: {covering})"


def load() -> None:
    """The entry point. A bad or refused variable ends the process with one line naming it
    (SystemExit's message, printed once by the interpreter)."""
    global _plan
    hold()  # until SGLang configures its logging, which it does after loading plugins
    try:
        config = read_config()
    except ConfigError as exc:
        raise SystemExit(f"{DISTRIBUTION}'s SGLang plugin: {exc}") from None
    configure(config)
    for warning in config.warnings:
        logger.warning("%s: %s", DISTRIBUTION, warning)
    hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
    _plan = _installed_plan()
    for target in _plan.taken():
        original = pkgutil.resolve_name(target.path) if target.kind == "REPLACE" else None
        hook = guarded(HOOKS[target.hook], target.kind, target.path, original)
        hooks.HookRegistry.register(target.path, hook, hooks.HookType[target.kind])
        _registered.append((target, hook))
    # verify() right after SGLang's next `HookRegistry.apply_hooks()` (load_plugins calls it once
    # every plugin has registered), which then is SGLang's own again.
    registry = hooks.HookRegistry
    apply_hooks = registry.__dict__["apply_hooks"]
    if getattr(apply_hooks.__func__, "_registrar_verifies", False):
        return

    def apply_then_verify(cls: Any) -> None:
        try:
            apply_hooks.__func__(cls)
        finally:
            registry.apply_hooks = apply_hooks
        verify()

    apply_then_verify._registrar_verifies = True  # type: ignore[attr-defined]
    registry.apply_hooks = classmethod(apply_then_verify)
