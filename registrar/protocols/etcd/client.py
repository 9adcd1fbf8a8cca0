"""The cluster as one client: every request goes to the member that answered last, and fails
over to the next while a member does not answer or says it cannot (no leader, timed out,
unavailable); etcd's auth token is fetched, and fetched again when etcd says it is invalid; the
same TLS files serve the unary calls and the watch.

One `HttpTransport` per member (`POST /v3/...` on etcd's JSON gateway): no gRPC stack."""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.errors import ConfigError
from ...core.redact import Secrets, clean, redact_url
from ...core.transport import Timeout, validate_url
from ..http import HttpTransport, TlsFiles
from .answer import EtcdAnswer, Grpc, parse_answer

__all__ = ["EtcdClient", "check_cert", "check_credentials", "endpoint_urls"]

logger = logging.getLogger(__name__)


def endpoint_urls(value: object) -> list[str]:
    """The members' client URLs (one string, comma-separated, or a sequence), or ConfigError."""
    if isinstance(value, str):
        items: list[object] = [part.strip() for part in value.split(",") if part.strip()]
    elif isinstance(value, Sequence):
        items = list(value)
    else:
        items = []
    if not items:
        raise ConfigError(
            "endpoints must name at least one etcd client URL, e.g. http://127.0.0.1:2379"
        )
    urls = [validate_url(item, "etcd endpoint") for item in items]
    if len(set(urls)) != len(urls):
        raise ConfigError("endpoints must not repeat an etcd URL")
    return urls


def check_credentials(username: object, password: object) -> None:
    """Both or neither, each a non-empty string, or ConfigError."""
    if (username is None) != (password is None):
        raise ConfigError("username and password go together: give both or neither")
    for name, value in (("username", username), ("password", password)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string")


def check_cert(cert: object) -> tuple[str, str] | None:
    """A (certificate file, key file) pair of existing files, or None, or ConfigError."""
    if cert is None:
        return None
    if (
        isinstance(cert, tuple)
        and len(cert) == 2
        and all(isinstance(path, str) and os.path.isfile(path) for path in cert)
    ):
        return (cert[0], cert[1])
    raise ConfigError(
        f"cert must be a (certificate file, key file) pair of readable files, got {cert!r}"
    )


class EtcdClient:
    """Sends to a cluster's members with failover, auth and TLS. Its arguments arrive checked
    (by the functions above, called by `EtcdTransport` among its own checks)."""

    def __init__(
        self,
        urls: list[str],
        *,
        username: str | None,
        password: str | None,
        timeout: Timeout,
        verify: bool | str,
        cert: tuple[str, str] | None,
    ) -> None:
        self._urls = urls
        self.shown = [redact_url(url) for url in urls]
        """The endpoints, credentials redacted, in failover order."""
        self._http = [
            HttpTransport(url, path="/", timeout=timeout, verify=verify, cert=cert) for url in urls
        ]
        self._timeout = timeout
        self.current = 0
        """The member that answered last: the first one asked."""
        self.all_refused = False
        """Every member refused the connection in the last call (nothing listens anywhere)."""
        self._tls = TlsFiles(verify, cert)
        self.cert = cert
        self._username = username
        self._password = password
        self.secrets = Secrets.of((password,))
        self.token: str | None = None
        self._auth_off = False
        self._aborted = False
        self._closing = False
        self._abort_lock = threading.Lock()

    @property
    def username(self) -> str | None:
        return self._username

    def url(self, index: int) -> str:
        return self._urls[index]

    def ssl_context(self, index: int) -> ssl.SSLContext | None:
        """The same TLS context the unary calls' transport uses (built from the same files)."""
        if not self._urls[index].startswith("https://"):
            return None
        return self._tls.context()

    def connect_timeout(self) -> float:
        return self._timeout[0] if isinstance(self._timeout, tuple) else self._timeout

    def _headers(self) -> dict[str, str] | None:
        return {"Authorization": self.token} if self.token else None

    def _send(self, index: int, path: str, body: Mapping[str, Any]) -> EtcdAnswer:
        transport = self._http[index]
        result = transport.send("POST", path, json=dict(body), headers=self._headers())
        answer = parse_answer(self.shown[index], result, transport.describe_error)
        if answer.error is not None and self.token and answer.status_code is None:
            # A simple token names a raft index; a member that lost its data waits for that
            # index to come (until our deadline). Authenticate again next time.
            self.token = None
        return answer

    def _authenticate(self, index: int) -> EtcdAnswer | None:
        """Fetch a token from member `index`; None when done (or auth is off), else the failed
        answer."""
        if self._username is None or self.token or self._auth_off:
            return None
        answer = self._send(
            index, "/v3/auth/authenticate", {"name": self._username, "password": self._password}
        )
        if answer.ok:
            token = answer.body.get("token") if answer.body else None
            if isinstance(token, str) and token and "\n" not in token and "\r" not in token:
                self.token = token
                return None
            return EtcdAnswer(answer.endpoint, answer.status_code, message="no token in answer")
        if answer.code == Grpc.PRECONDITION and "not enabled" in answer.message:
            logger.warning(
                "etcd at %s has authentication disabled; going on without a token",
                answer.endpoint,
            )
            self._auth_off = True
            return None
        return answer

    def call(self, path: str, body: Mapping[str, Any]) -> tuple[EtcdAnswer, list[str]]:
        """Send to the current endpoint, failing over to the others in turn while a member is
        in trouble; the final answer and what each failed member said. `all_refused` tells
        whether every member refused the connection (nothing listens anywhere)."""
        failures: list[str] = []
        refusals = 0
        count = len(self._urls)
        answer: EtcdAnswer | None = None
        for step in range(count):
            index = (self.current + step) % count
            if self._aborted:
                break
            failed = self._authenticate(index)
            if failed is None:
                answer = self._send(index, path, body)
                if answer.code == Grpc.UNAUTHENTICATED and self._username is not None:
                    self.token = None  # expired, or forgotten by a restarted member
                    failed = self._authenticate(index)
                    if failed is None:
                        answer = self._send(index, path, body)
            else:
                answer = failed
            if answer.member_trouble:
                failures.append(f"{answer.endpoint}: {answer.message}")
                refusals += answer.refused
                continue
            if index != self.current:
                logger.info("etcd: now using %s", answer.endpoint)
                self.current = index
            return answer, failures
        if answer is None:
            answer = EtcdAnswer(self.shown[self.current], None, message="stopping")
        self.all_refused = refusals == count
        return answer, failures

    def failure_text(self, answer: EtcdAnswer, failures: list[str]) -> str:
        """What went wrong, for a log line or a status: every member's answer when several
        failed, secrets left out."""
        if len(failures) > 1:
            text = "no etcd endpoint answered: " + "; ".join(failures)
        else:
            text = f"{answer.endpoint}: {answer.message}"
        return self.clean(text)

    def clean(self, text: str) -> str:
        return clean(text, 400, self.secrets)

    def abort(self) -> None:
        """End the request in flight; no failover after it. Nothing once `closing()` began."""
        with self._abort_lock:
            if self._closing:
                return
            self._aborted = True
            for transport in self._http:
                transport.abort()

    def closing(self) -> None:
        """The last requests (the revoke) follow: `abort()` no longer cuts them."""
        with self._abort_lock:
            self._closing = True
            self._aborted = False

    def close(self) -> None:
        for transport in self._http:
            transport.close()
