"""The cluster as one client on etcd's JSON gateway (`POST /v3/...`, no gRPC stack): failover,
the auth token, and the gateway's answers (base64 bytes, int64 as strings), never trusted."""

from __future__ import annotations

import base64
import logging
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import IntEnum
from functools import partial
from typing import Any

from ...core._redact import Secrets, clean, redact_url
from ...core._settings import HttpSettings
from .._http import HttpTransport
from .._httpconn import TlsError, TlsFiles
from .._httpvalues import HttpResult
from .settings import EtcdSettings

logger = logging.getLogger("registrar.protocols.etcd.client")


class Grpc(IntEnum):
    """The gRPC status codes the gateway passes on in its error bodies."""

    CANCELLED = 1
    UNKNOWN = 2
    INVALID = 3
    DEADLINE = 4
    NOT_FOUND = 5
    PERMISSION = 7
    EXHAUSTED = 8
    PRECONDITION = 9
    ABORTED = 10
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


# Answers that speak for one member only: it has no leader, is shutting down, timed out.
_MEMBER_TROUBLE = frozenset(
    {Grpc.CANCELLED, Grpc.UNKNOWN, Grpc.DEADLINE, Grpc.ABORTED, Grpc.INTERNAL, Grpc.UNAVAILABLE}
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes | None:
    """Bytes the gateway sent, or None for anything that is not base64 text."""
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:  # binascii.Error among them
        return None


def int64(value: object) -> int:
    """An int64 the gateway sent as a string (omitted or unreadable: 0). ASCII digits only:
    `str.isdigit` also takes "²", which `int` refuses, so a hostile answer could raise."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value):
        return int(value)
    return 0


def header_revision(body: Mapping[str, Any]) -> int:
    header = body.get("header")
    return int64(header.get("revision")) if isinstance(header, Mapping) else 0


@dataclass(frozen=True)
class EtcdAnswer:
    """One gateway call, parsed: the message on success, the gRPC error otherwise."""

    endpoint: str
    status_code: int | None
    body: Mapping[str, Any] | None = None  # a streaming call's `result` unwrapped
    code: int | None = None
    message: str = ""  # etcd's message or the root cause of a failed exchange, cleaned
    error: BaseException | None = None
    refused: bool = False
    failure: str = ""  # what went wrong across the members asked, secrets left out

    @property
    def ok(self) -> bool:
        return self.body is not None

    @property
    def member_trouble(self) -> bool:
        """No answer, or one that speaks for this member only: try another."""
        if self.ok:
            return False
        if self.status_code is None:
            return not isinstance(self.error, TlsError)
        if self.code is not None:
            return self.code in _MEMBER_TROUBLE
        return self.status_code >= 500


def parse_answer(
    endpoint: str, result: HttpResult, describe: Callable[[BaseException], str]
) -> EtcdAnswer:
    if result.error is not None:
        text = describe(result.error)
        return EtcdAnswer(endpoint, None, message=text, error=result.error, refused=result.refused)
    status = result.status_code
    document = result.json_object()
    if isinstance(document, dict) and isinstance(document.get("result"), dict):
        document = document["result"]  # a streaming call's one message
    elif isinstance(document, dict) and isinstance(document.get("error"), dict):
        inner = document["error"]  # a streaming call's error: {"error": {"grpc_code": ...}}
        document = {"code": inner.get("grpc_code"), "message": inner.get("message")}
    if status == 200 and isinstance(document, dict) and "code" not in document:
        return EtcdAnswer(endpoint, status, body=document)
    code = document.get("code") if isinstance(document, dict) else None
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    message = document.get("message") if isinstance(document, dict) else None
    if not isinstance(message, str) or not message:
        message = f"HTTP {status}: {' '.join(result.text.split())}"
    return EtcdAnswer(endpoint, status, code=code, message=clean(message, 200))


class EtcdClient:
    """Sends to the member that answered last, failing over while one does not answer or cannot."""

    def __init__(self, settings: EtcdSettings) -> None:
        self.settings = settings
        self.urls = list(settings.endpoints)
        self.shown = [redact_url(url) for url in self.urls]
        member = partial(HttpSettings, timeout=settings.timeout, verify=settings.verify)
        self._http = [HttpTransport(member(url), path="/", cert=settings.cert) for url in self.urls]
        self.current = 0  # the member that answered last: the first one asked
        self.all_refused = False  # in the last call (nothing listens anywhere)
        self.tls = TlsFiles(settings.verify, settings.cert)  # the watch's (as the transports')
        self.secrets = Secrets.of((settings.password,))
        self.token: str | None = None
        self._auth_off = False
        self._aborted = False
        self._closing = False
        self._abort_lock = threading.Lock()

    def _send(self, index: int, path: str, body: Mapping[str, Any]) -> EtcdAnswer:
        transport = self._http[index]
        headers = {"Authorization": self.token} if self.token else None
        result = transport.send("POST", path, json=dict(body), headers=headers)
        answer = parse_answer(self.shown[index], result, transport.describe_error)
        if answer.error is not None and self.token and answer.status_code is None:
            # A simple token names a raft index; a member that lost its data waits for that
            # index to come (until our deadline). Authenticate again next time.
            self.token = None
        return answer

    def _authenticate(self, index: int) -> EtcdAnswer | None:
        """None when a token is held (or auth is off), else the failed answer."""
        username = self.settings.username
        if username is None or self.token or self._auth_off:
            return None
        body = {"name": username, "password": self.settings.password}
        answer = self._send(index, "/v3/auth/authenticate", body)
        if answer.body is not None:
            token = answer.body.get("token")
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

    def _ask(self, index: int, path: str, body: Mapping[str, Any]) -> EtcdAnswer:
        """One member's answer, authenticating first, and again once on an invalid token."""
        failed = self._authenticate(index)
        if failed is not None:
            return failed
        answer = self._send(index, path, body)
        if answer.code == Grpc.UNAUTHENTICATED and self.settings.username is not None:
            self.token = None  # expired, or forgotten by a restarted member
            if self._authenticate(index) is None:
                answer = self._send(index, path, body)
        return answer

    def call(self, path: str, body: Mapping[str, Any]) -> EtcdAnswer:
        """The final answer, failing over while a member is in trouble (a failed one: `failure`)."""
        failures: list[str] = []
        refusals = 0
        count = len(self.urls)
        answer = EtcdAnswer(self.shown[self.current], None, message="stopping")
        for step in range(count):
            index = (self.current + step) % count
            if self._aborted:
                break
            answer = self._ask(index, path, body)
            if not answer.member_trouble:
                if index != self.current:
                    logger.info("etcd: now using %s", answer.endpoint)
                    self.current = index
                break
            failures.append(f"{answer.endpoint}: {answer.message}")
            refusals += answer.refused
        if answer.ok:
            return answer
        if answer.member_trouble:  # no member left to ask (or stopping)
            self.all_refused = refusals == count
        text = f"{answer.endpoint}: {answer.message}"
        if len(failures) > 1:
            text = "no etcd endpoint answered: " + "; ".join(failures)
        return replace(answer, failure=self.clean(text))

    def clean(self, text: str) -> str:
        return clean(text, 400, self.secrets)

    def resolution(self) -> str | None:
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
