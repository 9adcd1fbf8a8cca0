"""The values of one HTTP exchange, and the parsers of what a server or a user hands in.

An `HttpResult` is what `HttpTransport.send` returns (an answer, or the error that stopped
it); `parse_retry_after` reads a `Retry-After` header and `validate_token` checks a bearer token
a provider answered.
"""

from __future__ import annotations

import http
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import mktime_tz, parsedate_tz
from urllib.parse import urlencode

from ..core import rules
from .resolver import Unresolved

RETRY_AFTER_CEILING = 365 * 24 * 3600.0
"""A year: no Retry-After is read as longer (the registrar's own cap is far smaller)."""
_DELTA_SECONDS = re.compile("[0-9]+")
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024
"""A successful answer is read and decoded up to this many bytes (SGLang's are under 200)."""


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` header asks to wait, parsed as urllib3 does: ASCII digits or an
    HTTP-date; None when it is neither. Never raises: `str.isdigit()` accepts `²`, which
    `float()` refuses, and a date may overflow. Anything beyond `RETRY_AFTER_CEILING` is that
    ceiling (the registrar applies its own, smaller cap: `max_retry_after`)."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELTA_SECONDS.fullmatch(text):
        # Compare digit counts before converting: int() refuses over 4300 digits.
        if len(text.lstrip("0")) > len(str(int(RETRY_AFTER_CEILING))):
            return RETRY_AFTER_CEILING
        return min(float(int(text)), RETRY_AFTER_CEILING)
    seconds = _seconds_until(text, now)
    if seconds is None or not math.isfinite(seconds):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_CEILING)


def _seconds_until(date: str, now: float) -> float | None:
    """Seconds from `now` to an HTTP-date, None when it is not one (or overflows)."""
    try:
        moment = parsedate_tz(date)
        if moment is None:
            return None
        return float(mktime_tz(moment)) - now
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


@dataclass(frozen=True)
class HttpResult:
    """One HTTP exchange: an answer, or the exception that stopped it."""

    status_code: int | None
    headers: Mapping[str, str]
    text: str
    error: BaseException | None
    reconnected: bool
    """The kept-alive connection to the server had to be opened again for this request, or
    broke under it."""
    refused: bool = False
    """The connection was refused: nothing listens there."""
    complete: bool = True
    """The whole body was read and decoded; False when it was cut at the cap."""

    @property
    def unsent(self) -> bool:
        """Nothing of the request left this side: its host name did not resolve."""
        return isinstance(self.error, Unresolved)


class TokenUnavailable(RuntimeError):
    """The token provider failed (say, the token file is missing mid-rotation): the request is
    not sent and is retried like a network failure."""


def validate_token(token: object, source: str = "token") -> str | None:
    """`token` (None or empty: no token), or `ConfigError` naming its source but never its
    value (the rule: `registrar.core.rules.header_token`)."""
    kept: str | None = rules.applied(source, token, rules.header_token)
    return kept


def with_query(path: str, params: Mapping[str, str | int] | None) -> str:
    """`path` with `params` as its query (`HttpTransport.send` takes the two as one)."""
    return f"{path}?{urlencode(params)}" if params else path


def phrase(code: int) -> str:
    try:
        return http.HTTPStatus(code).phrase
    except ValueError:
        return "Unknown Status"
