"""What an HTTP request carries to prove who sends it, and the secrets kept out of every text.

One credential, never two: a bearer token (fixed, or a provider asked before each request so a
rotated token is used from the next one on), or the URL's `user:password@` sent as basic auth.
Every token a provider answers joins the secrets, so no error text or excerpt can show it."""

from __future__ import annotations

from base64 import b64encode
from urllib.parse import unquote, urlsplit

from ..core.errors import ConfigError
from ..core.redact import Secrets
from ..core.transport import Token
from .httpvalues import validate_token


class Credentials:
    """The credential of the server at `url`: `token` (checked by `HttpSettings`) named by
    `source` in messages, or the URL's user and password."""

    def __init__(self, url: str, token: Token | None, source: str) -> None:
        parts = urlsplit(url)
        self.userinfo = parts.username is not None or parts.password is not None
        if token and self.userinfo:
            raise ConfigError(
                f"url carries credentials (user:password@) and {source} sets a bearer token; "
                "give one of them (a request carries one Authorization header)"
            )
        self.source = source
        self.has_token = bool(token)
        self._provider = token if callable(token) else None
        self._seen: set[str] = set() if callable(token) or not token else {token}
        self._basic = (parts.username or "", parts.password or "") if self.userinfo else None
        self.secrets = Secrets.of(self._seen, basic=self._basic)
        self.fixed: dict[str, str] = {}
        """The Authorization header every request carries (a fixed token, or basic auth)."""
        if isinstance(token, str) and token:
            self.fixed["Authorization"] = f"Bearer {token}"
        elif self._basic is not None:
            user, password = (unquote(part) for part in self._basic)
            basic = b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode()
            self.fixed["Authorization"] = f"Basic {basic}"

    def asked(self) -> dict[str, str] | None:
        """The Authorization header from the token provider, if there is one (it may raise:
        that request fails); every token it answers joins the secrets."""
        if self._provider is None:
            return None
        token = self._provider()
        if not token:
            return None
        # The same rule as a fixed token; the error names the provider, never the token.
        token = validate_token(token, f"the token from {self.source}")
        assert token is not None
        if token not in self._seen:
            self._seen.add(token)
            self.secrets = Secrets.of(self._seen, basic=self._basic)
        return {"Authorization": f"Bearer {token}"}

    def hint(self, token_hint: str, token_how: str) -> str:
        """What to check after a 401/403: the credential that was actually sent."""
        if self.has_token:
            return f"{token_hint} (from {self.source})"
        if self.userinfo:
            return "check the user name and password in the URL (sent as basic auth)"
        return f"the server wants credentials and none were sent; {token_how}"
