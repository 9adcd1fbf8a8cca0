"""The cluster as one client: every request goes to the member that answered last, and fails
over to the next while a member does not answer or says it cannot (no leader, timed out,
unavailable); etcd's auth token is fetched, and fetched again when etcd says it is invalid; the
same TLS files serve the unary calls and the watch.

One `HttpTransport` per member (`POST /v3/...` on etcd's JSON gateway): no gRPC stack."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any

from ...core.redact import Secrets, clean, redact_url
from ...core.transport import connect_seconds
from ..http import HttpTransport
from ..httpconn import TlsFiles
from .answer import EtcdAnswer, Grpc, parse_answer
from .settings import EtcdSettings
from .stream import Dial

logger = logging.getLogger(__name__)


class EtcdClient:
    """Sends to a cluster's members with failover, auth and TLS, as its settings say (checked
    when they were made)."""

    def __init__(self, settings: EtcdSettings) -> None:
        self._urls = list(settings.endpoints)
        self.shown = [redact_url(url) for url in self._urls]
        """The endpoints, credentials redacted, in failover order."""
        self._http = [
            HttpTransport(
                url, path="/", timeout=settings.timeout, verify=settings.verify, cert=settings.cert
            )
            for url in self._urls
        ]
        self._timeout = settings.timeout
        self.current = 0
        """The member that answered last: the first one asked."""
        self.all_refused = False
        """Every member refused the connection in the last call (nothing listens anywhere)."""
        self._tls = TlsFiles(settings.verify, settings.cert)
        self.cert = settings.cert
        self._username = settings.username
        self._password = settings.password
        self.secrets = Secrets.of((settings.password,))
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

    def dial(self, index: int) -> Dial:
        """How a watch reaches member `index`: the same TLS context the unary calls' transport
        uses (built from the same files) and the same connect timeout."""
        https = self._urls[index].startswith("https://")
        return Dial(self._tls.context() if https else None, connect_seconds(self._timeout))

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

    def resolution(self) -> str | None:
        """The first member whose name stalls or fails in the resolver, said as it says it."""
        found = (transport.resolution() for transport in self._http)
        return next((text for text in found if text is not None), None)

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
