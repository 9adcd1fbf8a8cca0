"""The one exception family of registrar, and the root cause of a failure: the wrapper texts
(`HTTPConnectionPool(...): Max retries exceeded ...`) tell an operator nothing, so every log
line and status names the innermost error instead."""

from __future__ import annotations


class RegistrarError(Exception):
    """Base of every exception registrar raises on purpose."""


class ConfigError(RegistrarError, ValueError):
    """An option or the payload is invalid; the message names the option and what is allowed."""


class StateError(RegistrarError, RuntimeError):
    """A method was called when the registrar's lifecycle does not allow it."""


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception behind `exc` (urllib3 reason, cause, wrapped exception, context)."""
    seen = {id(exc)}
    while True:
        wrapped = [a for a in getattr(exc, "args", ()) if isinstance(a, BaseException)]
        # The first there is of: urllib3's reason, the cause, the last wrapped one, the context.
        found = [getattr(exc, "reason", None), exc.__cause__, *wrapped[-1:]]
        found.append(None if exc.__suppress_context__ else exc.__context__)
        nxt = next((e for e in found if isinstance(e, BaseException)), None)
        if nxt is None or id(nxt) in seen:
            return exc
        seen.add(id(nxt))
        exc = nxt


def describe_exception(exc: BaseException) -> str:
    """One operator-readable line for `exc`'s root cause (`[Errno 111] Connection refused`)."""
    cause = root_cause(exc)
    return " ".join(str(cause).split()) or type(cause).__name__
