"""Test-only, inside SGLang's processes: every hook the plugin installs is made to raise.

With `E2E_HOOKS_RAISE=1` in a launched server's environment, boot/sitecustomize.py (through
inside.py) patches the plugin's guard module right after it is imported, before the plugin binds
`guarded`: each hook the plugin hands to the guard is swapped for one that raises, so the guard
and SGLang's `HookRegistry` see a hook that fails on every call. Nothing of the package changes.

Each step leaves one marker line on stderr (the server's log), for the test to read:
`hook NAME at TARGET installed in pid N` when the plugin registers it, `hook NAME at TARGET
raised in pid N` at every call. The exception says `made to raise in pid N`, so the guard's
traceback in the log is matched to the process it was raised in.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

__all__ = ["GUARD", "INSTALLED", "RAISED", "InjectedFailure", "failure_text", "patch_guard"]

GUARD = "registrar.integrations.sglang._guard"
INSTALLED = "e2e-raising: hook {hook} at {target} installed in pid {pid}"
RAISED = "e2e-raising: hook {hook} at {target} raised in pid {pid}"


class InjectedFailure(RuntimeError):
    """The failure the test injects into a hook."""


def failure_text(hook: str, target: str, pid: int | str) -> str:
    """The exception's message, as the guard's traceback ends with it."""
    return f"e2e: the hook {hook} at {target} made to raise in pid {pid}"


def _say(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] {text}", file=sys.stderr, flush=True)


def _raiser(hook: Callable[..., Any], target: str) -> Callable[..., Any]:
    """A stand-in for `hook` (same name, sync or async like it) that raises on every call."""
    name = getattr(hook, "__name__", repr(hook))

    def fail() -> None:
        pid = os.getpid()
        _say(RAISED.format(hook=name, target=target, pid=pid))
        raise InjectedFailure(failure_text(name, target, pid))

    if inspect.iscoroutinefunction(hook):

        @functools.wraps(hook)
        async def raises_async(*args: Any, **kwargs: Any) -> Any:
            fail()

        return raises_async

    @functools.wraps(hook)
    def raises(*args: Any, **kwargs: Any) -> Any:
        fail()

    return raises


def patch_guard(module: ModuleType) -> None:
    """Wrap the guard's `guarded` so that what it guards is a hook that raises."""
    original = getattr(module, "guarded", None)
    if original is None:
        raise RuntimeError(
            f"e2e suite: {GUARD}.guarded is gone; the hooks-raise test injects through it"
        )

    @functools.wraps(original)
    def guarded(hook: Callable[..., Any], kind: str, target: str, *args: Any, **kw: Any) -> Any:
        name = getattr(hook, "__name__", repr(hook))
        _say(INSTALLED.format(hook=name, target=target, pid=os.getpid()))
        return original(_raiser(hook, target), kind, target, *args, **kw)

    module.guarded = guarded  # type: ignore[attr-defined]
