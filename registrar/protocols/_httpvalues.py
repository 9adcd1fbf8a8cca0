"""The values of one HTTP exchange: its endpoint, result, credential and `Retry-After`."""

from __future__ import annotations

import re
from base64 import b64encode
from collections.abc import Mapping
from dataclasses import dataclass
from email.utils import mktime_tz, parsedate_tz
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from ..core import _rules as rules
from ..core._errors import ConfigError
from ..core._redact import Secrets, json_object
from ..core._transport import Token
from ._resolver import Unresolved

RETRY_AFTER_CEILING = 365 * 24 * 3600.0  # a year (the registrar's own cap is far smaller)
_DELTA_SECONDS = re.compile("[0-9]+")
DEFAULT_MAX_ANSWER_BYTES = 64 * 1024  # of a successful answer (SGLang's are under 200)


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds a `Retry-After` asks to wait (ASCII digits or an HTTP-date), else None; never raises
    (`str.isdigit()` accepts `²`, which `float()` refuses; a date may overflow)."""
    if value is None:
        return None
    text = value.strip(" \t")
    if _DELTA_SECONDS.fullmatch(text):  # float(), not int(): int() refuses over 4300 digits
        return min(float(text), RETRY_AFTER_CEILING)
    date = parsedate_tz(text)
    if date is None:
        return None
    try:
        seconds = float(mktime_tz(date)) - now
    except (ValueError, OverflowError, IndexError):
        return None
    return min(max(0.0, seconds), RETRY_AFTER_CEILING)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    prefix: str  # the URL's path, without its trailing slash
    tls: bool

    @classmethod
    def of(cls, url: str) -> Endpoint:
        parts = urlsplit(url)
        host, tls = parts.hostname or "", parts.scheme == "https"
        return cls(host, parts.port or (443 if tls else 80), parts.path.rstrip("/"), tls)


@dataclass(frozen=True)
class HttpResult:
    status_code: int | None
    headers: Mapping[str, str]
    text: str
    error: BaseException | None
    reconnected: bool  # the kept-alive connection was re-opened for it, or broke under it
    refused: bool = False
    complete: bool = True  # False: the body was cut at the cap

    def json_object(self) -> dict[str, Any] | None:
        """The answer's JSON object, when it was read whole and is one."""
        return json_object(self.text) if self.complete else None

    @property
    def unsent(self) -> bool:
        """Nothing of the request left this side: its host name did not resolve."""
        return isinstance(self.error, Unresolved)


class TokenUnavailable(RuntimeError):
    """The token provider failed: the request is not sent, and is retried like a network one."""


def with_query(path: str, params: Mapping[str, str | int] | None) -> str:
    return f"{path}?{urlencode(params)}" if params else path


class Credentials:
    """One credential, never two: a bearer token (`source` names it in messages; a provider is
    asked before each request) or the URL's `user:password@` as basic auth."""

    def __init__(self, url: str, token: Token | None, source: str) -> None:
        parts = urlsplit(url)
        userinfo = parts.username is not None or parts.password is not None
        if token and userinfo:
            raise ConfigError(
                f"url carries credentials (user:password@) and {source} sets a bearer token; "
                "give one of them (a request carries one Authorization header)"
            )
        self.source = source
        self.has_token = bool(token)
        self._provider = token if callable(token) else None
        self._seen: set[str] = set() if callable(token) or not token else {token}
        self._basic = (parts.username or "", parts.password or "") if userinfo else None
        self.secrets = Secrets.of(self._seen, basic=self._basic)
        self.fixed: dict[str, str] = {}  # the Authorization every request carries
        if isinstance(token, str) and token:
            self.fixed["Authorization"] = f"Bearer {token}"
        elif self._basic is not None:
            user, password = (unquote(part) for part in self._basic)
            basic = b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()
            self.fixed["Authorization"] = f"Basic {basic}"

    def asked(self) -> dict[str, str] | None:
        """The provider's header (if it raises, that request fails); its tokens join the secrets."""
        if self._provider is None:
            return None
        token = self._provider()
        if not token:
            return None
        # The same rule as a fixed token; the error names the provider, never the token.
        token = rules.applied(f"the token from {self.source}", token, rules.header_token)
        if token not in self._seen:
            self._seen.add(token)
            self.secrets = Secrets.of(self._seen, basic=self._basic)
        return {"Authorization": f"Bearer {token}"}

    def hint(self, token_hint: str, token_how: str) -> str:
        if self.has_token:
            return f"{token_hint} (from {self.source})"
        if self._basic is not None:
            return "check the user name and password in the URL (sent as basic auth)"
        return f"the server wants credentials and none were sent; {token_how}"
