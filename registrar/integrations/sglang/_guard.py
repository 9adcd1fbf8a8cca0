"""No hook may raise into SGLang's code: an unexpected exception is logged once per hook and
target, with its traceback, and SGLang's own behaviour goes on: BEFORE/AFTER skip the hook's
effect; REPLACE calls SGLang's original; AROUND calls SGLang's function if the hook failed before
calling it, else returns its result, and lets SGLang's own exception through. `SystemExit`
passes: the plugin refusing a bad setting on purpose, with one line."""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("registrar.integrations.sglang.guard")

# Keyed by hook and target: two hooks on one target (the stand-in /ready and the gateway both
# run before `_setup_and_run_http_server` on 0.5.11-0.5.19) each get their line.
_reported: set[tuple[str, str]] = set()
_reported_lock = threading.Lock()


def _report(hook: str, target: str) -> None:
    with _reported_lock:
        first = (hook, target) not in _reported
        _reported.add((hook, target))
    if first:
        logger.exception(
            "sglang-registrar: the hook on %s failed (%s); SGLang's own behaviour goes on there "
            "(logged once)",
            target,
            hook,
        )


class _Original:
    """SGLang's function as an AROUND hook sees it, remembering whether it ran and its result."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.__wrapped__ = original  # inspect.unwrap reaches SGLang's function through it
        self.called = self.raised = False
        self.result: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.called = True
        try:
            self.result = self.__wrapped__(*args, **kwargs)
        except BaseException:
            self.raised = True
            raise
        return self._awaited(self.result) if inspect.isawaitable(self.result) else self.result

    async def _awaited(self, pending: Any) -> Any:
        try:
            self.result = await pending
        except BaseException:
            self.raised = True
            raise
        return self.result


def guarded(
    hook: Callable[..., Any],
    kind: str,
    target: str,
    original: Callable[..., Any] | None = None,
) -> Callable[..., Any]:
    """`hook` as registered at `target`; `original`: SGLang's function, needed for a REPLACE."""
    if kind == "AROUND":
        return _around(hook, target)
    if kind == "REPLACE" and original is None:
        raise ValueError(f"a REPLACE on {target} needs SGLang's original function")

    @functools.wraps(hook)
    def safe(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            _report(hook.__name__, target)
        # REPLACE: SGLang's own function; BEFORE: its own arguments; AFTER: its own result
        return original(*args, **kwargs) if original is not None else None

    return safe


def _around(hook: Callable[..., Any], target: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(hook):

        @functools.wraps(hook)
        async def safe_async(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            tracked = _Original(original)
            try:
                return await hook(tracked, *args, **kwargs)
            except Exception:
                if tracked.raised:
                    raise
                _report(hook.__name__, target)
                return tracked.result if tracked.called else await original(*args, **kwargs)

        return safe_async

    @functools.wraps(hook)
    def safe(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tracked = _Original(original)
        try:
            return hook(tracked, *args, **kwargs)
        except Exception:
            if tracked.raised:
                raise
            _report(hook.__name__, target)
            return tracked.result if tracked.called else original(*args, **kwargs)

    return safe
