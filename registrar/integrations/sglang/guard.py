"""No hook may raise into SGLang's code: each is wrapped so that an unexpected exception is
logged (once per target, with its traceback) and SGLang's own behaviour goes on as if the
plugin were not there.

- BEFORE / AFTER: the hook's effect is skipped (SGLang's arguments, SGLang's result).
- AROUND: if the hook failed before calling SGLang's function, that function is called; if it
  failed after, SGLang's result is returned; an exception raised by SGLang's own function
  passes through untouched, as it would without the plugin.
- REPLACE: SGLang's original function (resolved before the hooks were applied) is called.

`SystemExit` passes: it is the plugin refusing a bad setting on purpose, with one line.
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["guarded"]

logger = logging.getLogger(__name__)

_reported: set[str] = set()
_reported_lock = threading.Lock()


def _report(target: str) -> None:
    with _reported_lock:
        first = target not in _reported
        _reported.add(target)
    if first:
        logger.exception(
            "sglang-registrar: the hook on %s failed; SGLang's own behaviour goes on there "
            "(logged once)",
            target,
        )


class _Original:
    """SGLang's function as an AROUND hook sees it, remembering whether it ran and its result."""

    def __init__(self, original: Callable[..., Any]) -> None:
        self.original = original
        self.__wrapped__ = original  # inspect.unwrap reaches SGLang's function through it
        self.called = False
        self.raised = False
        self.result: Any = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.called = True
        try:
            self.result = self.original(*args, **kwargs)
        except BaseException:
            self.raised = True
            raise
        return self.result


class _AsyncOriginal(_Original):
    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.called = True
        try:
            self.result = await self.original(*args, **kwargs)
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
    """`hook` as registered at `target`, never raising an unexpected exception into SGLang.
    `original`: SGLang's function, needed for a REPLACE."""
    if kind == "AROUND":
        return _around(hook, target)
    if kind == "REPLACE":
        if original is None:
            raise ValueError(f"a REPLACE on {target} needs SGLang's original function")
        return _replace(hook, target, original)

    @functools.wraps(hook)
    def safe(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            _report(target)
            return None  # BEFORE: SGLang's own arguments; AFTER: SGLang's own result

    return safe


def _replace(
    hook: Callable[..., Any], target: str, original: Callable[..., Any]
) -> Callable[..., Any]:
    @functools.wraps(hook)
    def safe(*args: Any, **kwargs: Any) -> Any:
        try:
            return hook(*args, **kwargs)
        except Exception:
            _report(target)
        return original(*args, **kwargs)

    return safe


def _around(hook: Callable[..., Any], target: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(hook):

        @functools.wraps(hook)
        async def safe_async(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            tracked = _AsyncOriginal(original)
            try:
                return await hook(tracked, *args, **kwargs)
            except Exception:
                if tracked.raised:
                    raise
                _report(target)
                if tracked.called:
                    return tracked.result
                return await original(*args, **kwargs)

        return safe_async

    @functools.wraps(hook)
    def safe(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        tracked = _Original(original)
        try:
            return hook(tracked, *args, **kwargs)
        except Exception:
            if tracked.raised:
                raise
            _report(target)
            if tracked.called:
                return tracked.result
            return original(*args, **kwargs)

    return safe
