"""etcd v3 as the registry: the payload under a key, held by a lease this process keeps alive.

Registered means "the key holds our value under a live lease". `register` grants a lease (or
reuses ours while etcd still has it) and puts the key with it; `check` keeps the lease alive and
reads the key back; between checks `wait_idle` follows a watch on the key, so a key deleted or
overwritten by someone else is seen at once rather than at the next check; `close` revokes the
lease, so the key disappears the moment the registrar stops, while a crashed process's key
disappears when its lease runs out (the TTL).

Everything goes through etcd's JSON gateway (`POST /v3/...`, keys and values base64, int64 as
strings) with `requests`, one `HttpTransport` per endpoint: no gRPC stack, no new dependency.
The watch is a streaming POST whose chunked body carries one JSON message per line; it is read
here from a plain socket, so that `select()` sees exactly the bytes not yet read (a buffered
HTTP client hides some from it), and so that each piece is bounded as it arrives.

See docs/etcd.md for the model, the settings and the figures.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import os
import random
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .._version import __version__
from ..core.errors import ConfigError, describe_exception
from ..core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from ..core.redact import Secrets, clean, redact_url
from ..core.transport import Timeout, Waker, validate_timeout, validate_url
from ..core.untrusted import load_json
from .http import HttpResult, HttpTransport, TlsError, TlsFiles

__all__ = [
    "DEFAULT_KEEPALIVE_FRACTION",
    "DEFAULT_TIMEOUT",
    "DEFAULT_TTL",
    "ChunkedLines",
    "EtcdAnswer",
    "EtcdTransport",
    "StreamError",
    "watch_change",
    "watch_interval_for",
]

logger = logging.getLogger(__name__)

DEFAULT_TTL = 10.0
"""Seconds a crashed process's key outlives it. etcd rounds a TTL up to whole seconds and to
its own minimum (about 2 s on a default single member)."""
DEFAULT_KEEPALIVE_FRACTION = 1 / 3
"""The lease is renewed every TTL/3 (as etcd's own Go client does): two renewals may be lost
before the key expires."""
DEFAULT_TIMEOUT = 2.0
"""Deadline of one request to one endpoint: a stopped member costs this before failing over.
A renewal through a member waiting for a new leader can take one election (about 1 s)."""
MAX_WATCH_MESSAGE = 1024 * 1024
"""Bytes one watch message may take (an event carries our value and maybe a previous one)."""
_MAX_HEAD = 16 * 1024
_MAX_SIZE_LINE = 1024
_WATCH_RETRY = 1.0
"""Seconds between attempts to re-open a broken watch (jittered by +-50 %)."""
_READ = 64 * 1024
# The loop's first wait after a registration is up to 1.5 watch intervals (a fleet spreads its
# checks over a whole interval), so this many intervals fit in one keep-alive period.
_LONGEST_WAIT = 1.5

# gRPC status codes the gateway passes on in its error bodies.
_CANCELLED, _UNKNOWN, _INVALID, _DEADLINE, _NOT_FOUND = 1, 2, 3, 4, 5
_PERMISSION, _EXHAUSTED, _PRECONDITION, _ABORTED = 7, 8, 9, 10
_INTERNAL, _UNAVAILABLE, _UNAUTHENTICATED = 13, 14, 16
# Answers that speak for one member only (it has no leader, is shutting down, timed out):
# another member may do better.
_MEMBER_TROUBLE = frozenset({_CANCELLED, _UNKNOWN, _DEADLINE, _ABORTED, _INTERNAL, _UNAVAILABLE})


def watch_interval_for(ttl: float, keepalive_fraction: float = DEFAULT_KEEPALIVE_FRACTION) -> float:
    """The registrar's watch interval that renews a lease of `ttl` seconds at least every
    `keepalive_fraction * ttl`: each check renews it, and the loop waits at most 1.5 intervals
    between checks."""
    return ttl * keepalive_fraction / _LONGEST_WAIT


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes | None:
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def _int(value: object, default: int = 0) -> int:
    """An int64 the gateway sent as a string (or omitted, meaning 0)."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 20:
        return int(value)
    return default


@dataclass(frozen=True)
class EtcdAnswer:
    """One gateway call, parsed: the message on success, the gRPC error otherwise."""

    endpoint: str
    status_code: int | None
    body: Mapping[str, Any] | None = None
    """The message (a streaming call's `result` unwrapped) on success."""
    code: int | None = None
    """The gRPC status code of an error answer."""
    message: str = ""
    """Error text: etcd's message or the root cause of a failed exchange, cleaned."""
    error: BaseException | None = None
    refused: bool = False
    """The connection was refused: nothing listens at this endpoint."""

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
    """Classify one exchange with the gateway (pure: unit-tested without a server)."""
    if result.error is not None:
        return EtcdAnswer(
            endpoint,
            None,
            message=describe(result.error),
            error=result.error,
            refused=result.refused,
        )
    status = result.status_code
    try:
        document = load_json(result.text) if result.complete else None
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("result"), dict):
        document = document["result"]  # a streaming call's one message
    elif isinstance(document, dict) and isinstance(document.get("error"), dict):
        inner = document["error"]  # a streaming call's error: {"error": {"grpc_code": ...}}
        document = {"code": inner.get("grpc_code"), "message": inner.get("message")}
    if status == 200 and isinstance(document, dict) and "code" not in document:
        return EtcdAnswer(endpoint, status, body=document)
    code = document.get("code") if isinstance(document, dict) else None
    message = document.get("message") if isinstance(document, dict) else None
    if not isinstance(message, str) or not message:
        message = f"HTTP {status}: {' '.join(result.text.split())}"
    return EtcdAnswer(
        endpoint,
        status,
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        message=clean(message, 200),
    )


def watch_change(
    message: Mapping[str, Any], key: bytes, value: bytes, lease: int, from_revision: int
) -> str | None:
    """Why a watch message means our registration may have changed, or None (pure)."""
    result = message.get("result", message)
    if not isinstance(result, Mapping):
        return "the watch sent an unreadable message"
    if isinstance(message.get("error"), Mapping):
        return "the watch ended with an error"
    if result.get("canceled"):
        return _cancelled(result)
    events = result.get("events")
    if not isinstance(events, list):
        return None
    return _event_change(events, key, value, lease, from_revision)


def _cancelled(result: Mapping[str, Any]) -> str:
    reason = clean(result.get("cancel_reason") or "", 120)
    if _int(result.get("compact_revision")):
        reason = f"history compacted up to {_int(result.get('compact_revision'))}"
    return f"the watch was cancelled ({reason or 'no reason given'})"


def _event_change(
    events: list[Any], key: bytes, value: bytes, lease: int, from_revision: int
) -> str | None:
    """Why one of `events` changed our key since `from_revision`, or None."""
    for event in events:
        kv = event.get("kv") if isinstance(event, Mapping) else None
        if not isinstance(kv, Mapping) or _unb64(kv.get("key")) != key:
            continue
        revision = _int(kv.get("mod_revision"))
        if revision < from_revision:
            continue  # before (or at) the state we last saw: already accounted for
        if event.get("type") == "DELETE":
            return f"the key was deleted (revision {revision})"
        if _unb64(kv.get("value")) != value or _int(kv.get("lease")) != lease:
            return f"the key was overwritten (revision {revision})"
    return None


def _lease_options(ttl: object, keepalive_fraction: object) -> tuple[int, float]:
    """The lease's TTL in whole seconds (rounded up, as etcd takes them) and the fraction of it
    after which it is renewed, or ConfigError."""
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not 1 <= ttl <= 9_000_000_000
    ):
        raise ConfigError(f"ttl must be a number of seconds >= 1, got {ttl!r}")
    if (
        isinstance(keepalive_fraction, bool)
        or not isinstance(keepalive_fraction, int | float)
        or not 0.05 <= keepalive_fraction <= 0.5
    ):
        raise ConfigError(
            f"keepalive_fraction must be within [0.05, 0.5] (of the TTL), "
            f"got {keepalive_fraction!r}"
        )
    return int(-(-ttl // 1)), float(keepalive_fraction)


def _check_credentials(username: object, password: object) -> None:
    if (username is None) != (password is None):
        raise ConfigError("username and password go together: give both or neither")
    for name, value in (("username", username), ("password", password)):
        if value is not None and (not isinstance(value, str) or not value):
            raise ConfigError(f"{name} must be a non-empty string")


def _stream_ready(stream: _WatchStream, waker: Waker, limit: float) -> bool | None:
    """Wait for the stream to be readable: True when it is, False when the waker is set (or
    closed: the registrar is ending), None when `limit` seconds passed."""
    with selectors.DefaultSelector() as selector:
        selector.register(stream.sock, selectors.EVENT_READ)
        try:
            selector.register(waker.fileno(), selectors.EVENT_READ, "waker")
        except (ValueError, OSError):
            return False
        ready = selector.select(limit)
    if any(key.data == "waker" for key, _ in ready):
        return False
    return True if ready else None


class StreamError(ValueError):
    """The watch stream broke its framing or a bound."""


class ChunkedLines:
    """Decodes an HTTP/1.1 chunked body of newline-separated JSON messages, fed in pieces of
    any size (a message may span chunks, a chunk may hold several). Bounded: a chunk-size line
    over 1 KiB or a message over `limit` bytes is a `StreamError`, not a growing buffer."""

    def __init__(self, limit: int = MAX_WATCH_MESSAGE) -> None:
        self._limit = limit
        self._raw = bytearray()
        self._line = bytearray()
        self._left = 0
        self._state = "size"
        self.ended = False
        """The zero-size chunk arrived: the server ended the stream."""

    def feed(self, data: bytes) -> list[Any]:
        """The complete messages `data` finishes, in order."""
        self._raw += data
        messages: list[Any] = []
        steps = {"size": self._size, "data": self._data, "crlf": self._crlf}
        while self._raw and not self.ended:
            if not steps[self._state](messages):
                break
        return messages

    def _size(self, messages: list[Any]) -> bool:
        """Read a chunk-size line; False when more bytes are needed (or the stream ended)."""
        end = self._raw.find(b"\r\n")
        if end < 0:
            if len(self._raw) > _MAX_SIZE_LINE:
                raise StreamError("chunk-size line too long")
            return False
        text = bytes(self._raw[:end]).split(b";", 1)[0].strip()
        del self._raw[: end + 2]
        try:
            size = int(text, 16)
        except ValueError:
            raise StreamError(f"bad chunk size {clean(text, 40)!r}") from None
        if size < 0:
            raise StreamError("negative chunk size")
        if size == 0:
            self.ended = True
            return False
        self._left, self._state = size, "data"
        return True

    def _data(self, messages: list[Any]) -> bool:
        take = min(self._left, len(self._raw))
        self._line += self._raw[:take]
        del self._raw[:take]
        self._left -= take
        if self._left == 0:
            self._state = "crlf"
        messages.extend(self._messages())
        return True

    def _crlf(self, messages: list[Any]) -> bool:
        if len(self._raw) < 2:
            return False
        if self._raw[:2] != b"\r\n":
            raise StreamError("chunk not followed by CRLF")
        del self._raw[:2]
        self._state = "size"
        return True

    def _messages(self) -> list[Any]:
        found = []
        while True:
            end = self._line.find(b"\n")
            if end < 0:
                break
            line = bytes(self._line[:end]).strip()
            del self._line[: end + 1]
            if line:
                try:
                    found.append(load_json(line))
                except ValueError as exc:
                    raise StreamError(f"unreadable watch message: {exc}") from None
        if len(self._line) > self._limit:
            raise StreamError(f"watch message over {self._limit} bytes")
        return found


class _WatchStream:
    """One `POST /v3/watch` on a plain (or TLS) socket, read without blocking."""

    def __init__(self, endpoint: str, index: int, sock: socket.socket, limit: int) -> None:
        self.endpoint = endpoint
        self.index = index
        self.sock = sock
        self.created = False
        self._head = bytearray()
        self._body: ChunkedLines | None = None
        self._limit = limit

    @classmethod
    def open(
        cls,
        endpoint: str,
        index: int,
        request: bytes,
        context: ssl.SSLContext | None,
        timeout: float,
        limit: int,
    ) -> _WatchStream:
        parts = urlsplit(endpoint)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            if context is not None:
                sock = context.wrap_socket(sock, server_hostname=host)
            sock.sendall(request)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        return cls(endpoint, index, sock, limit)

    def fileno(self) -> int:
        return self.sock.fileno()

    def buffered(self) -> bool:
        """TLS may hold decrypted bytes that `select()` cannot see."""
        return isinstance(self.sock, ssl.SSLSocket) and self.sock.pending() > 0

    def read(self) -> list[Any]:
        """The messages that arrived; `StreamError` or `OSError` when the stream is over."""
        try:
            data = self.sock.recv(_READ)
        except (ssl.SSLWantReadError, BlockingIOError):
            return []
        if not data:
            raise StreamError("the server closed the watch stream")
        if self._body is None:
            self._head += data
            end = self._head.find(b"\r\n\r\n")
            if end < 0:
                if len(self._head) > _MAX_HEAD:
                    raise StreamError("watch answer head too long")
                return []
            head = bytes(self._head[:end]).decode("latin-1")
            data = bytes(self._head[end + 4 :])
            self._head.clear()
            lines = head.split("\r\n")
            status = lines[0].split(" ", 2)
            if len(status) < 2 or status[1] != "200":
                raise StreamError(f"watch refused: {clean(lines[0], 80)}")
            fields = {
                name.strip().lower(): value.strip().lower()
                for name, _, value in (line.partition(":") for line in lines[1:])
            }
            if "chunked" not in fields.get("transfer-encoding", ""):
                raise StreamError("watch answer is not a stream")
            self._body = ChunkedLines(self._limit)
        messages = self._body.feed(data)
        if self._body.ended:
            raise StreamError("the server ended the watch stream")
        return messages

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class EtcdTransport:
    """Keeps `payload` (as compact JSON) under `key` in etcd, held by a lease renewed every
    `keepalive_fraction * ttl` seconds.

    `endpoints` are the cluster's client URLs (one string, comma-separated, or a sequence):
    requests go to the last one that answered and fail over to the next when a member does
    not answer or says it cannot (no leader, timed out, unavailable). `username`/`password`
    enable etcd's auth: the token is fetched with `/v3/auth/authenticate` and fetched again when
    etcd says it is invalid (expired, or the member restarted). `verify` is True (system CAs),
    False, or the path of a CA bundle for `https://` endpoints; `cert` a (certificate, key)
    pair of files for clusters that require client certificates (`--client-cert-auth`).
    `timeout` is one request's deadline on one endpoint.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        key: str,
        *,
        ttl: float = DEFAULT_TTL,
        keepalive_fraction: float = DEFAULT_KEEPALIVE_FRACTION,
        username: str | None = None,
        password: str | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        verify: bool | str = True,
        cert: tuple[str, str] | None = None,
        max_message_bytes: int = MAX_WATCH_MESSAGE,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self._endpoints = _endpoints(endpoints)
        if not isinstance(key, str) or not key or "\n" in key or "\r" in key:
            raise ConfigError(f"key must be a non-empty single-line string, got {key!r}")
        self._key = key.encode()
        self._key_text = key
        self._ttl, self._fraction = _lease_options(ttl, keepalive_fraction)
        _check_credentials(username, password)
        self._username = username
        self._password = password
        self._timeout = validate_timeout(timeout)
        deadline = sum(self._timeout) if isinstance(self._timeout, tuple) else self._timeout
        if deadline >= self._ttl * (1 - self._fraction):
            raise ConfigError(
                f"timeout ({deadline:g} s per request) must be shorter than the part of the TTL "
                f"left after a renewal is due ({self._ttl * (1 - self._fraction):g} s of "
                f"ttl={self._ttl}): a member that never answers would cost the lease before "
                "the next one is asked; raise ttl or lower timeout"
            )
        if isinstance(verify, str) and not verify:
            raise ConfigError("verify must be True, False or the path of a CA bundle")
        self._verify = verify
        self._cert = _check_cert(cert)
        self._secrets = Secrets.of((password,))
        self._http = [
            HttpTransport(url, path="/", timeout=self._timeout, verify=verify, cert=cert)
            for url in self._endpoints
        ]
        self._shown = [redact_url(url) for url in self._endpoints]
        self._current = 0
        self._token: str | None = None
        self._auth_off = False
        self._aborted = False
        self._all_refused = False
        self._closing = False
        self._abort_lock = threading.Lock()
        self._rng = rng if rng is not None else random.random
        if (
            isinstance(max_message_bytes, bool)
            or not isinstance(max_message_bytes, int)
            or max_message_bytes < 1024
        ):
            raise ConfigError(
                f"max_message_bytes must be an integer >= 1024, got {max_message_bytes!r}"
            )
        self._limit = max_message_bytes
        self._value = b""
        self._lease = 0
        self._granted_ttl = float(self._ttl)
        self._renewed_at: float | None = None
        """When the latest renewal (or grant) was acknowledged."""
        self._seen_revision = 0
        """The key's last revision we know of: the watch reports only later changes."""
        self._stream: _WatchStream | None = None
        self._stream_broken = False
        self._watch_denied = False
        self._next_stream_try = 0.0
        self._tls = TlsFiles(verify, self._cert)

    # ----------------------------------------------------------------- properties

    @property
    def display_url(self) -> str:
        return f"{','.join(self._shown)} key {clean(self._key_text, 200)}"

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints, credentials redacted, in failover order."""
        return tuple(self._shown)

    @property
    def ttl(self) -> int:
        """The lease TTL asked for, in whole seconds."""
        return self._ttl

    @property
    def watch_interval(self) -> float:
        """The registrar watch interval that keeps the lease renewed in time."""
        return watch_interval_for(self._ttl, self._fraction)

    @property
    def lease(self) -> int:
        """The current lease ID (0 before the first grant)."""
        return self._lease

    # ----------------------------------------------------------------- requests

    def _headers(self) -> dict[str, str] | None:
        return {"Authorization": self._token} if self._token else None

    def _send(self, index: int, path: str, body: Mapping[str, Any]) -> EtcdAnswer:
        transport = self._http[index]
        result = transport.send("POST", path, json=dict(body), headers=self._headers())
        answer = parse_answer(self._shown[index], result, transport.describe_error)
        if answer.error is not None and self._token and answer.status_code is None:
            # A simple token names a raft index; a member that lost its data waits for that
            # index to come (until our deadline). Authenticate again next time.
            self._token = None
        return answer

    def _authenticate(self, index: int) -> EtcdAnswer | None:
        """Fetch a token from member `index`; None when done (or auth is off), else the failed
        answer."""
        if self._username is None or self._token or self._auth_off:
            return None
        answer = self._send(
            index, "/v3/auth/authenticate", {"name": self._username, "password": self._password}
        )
        if answer.ok:
            token = answer.body.get("token") if answer.body else None
            if isinstance(token, str) and token and "\n" not in token and "\r" not in token:
                self._token = token
                return None
            return EtcdAnswer(answer.endpoint, answer.status_code, message="no token in answer")
        if answer.code == _PRECONDITION and "not enabled" in answer.message:
            logger.warning(
                "etcd at %s has authentication disabled; going on without a token",
                answer.endpoint,
            )
            self._auth_off = True
            return None
        return answer

    def _call(self, path: str, body: Mapping[str, Any]) -> tuple[EtcdAnswer, list[str]]:
        """Send to the current endpoint, failing over to the others in turn while a member is
        in trouble; the final answer and what each failed member said. `self._all_refused`
        tells whether every member refused the connection (nothing listens anywhere)."""
        failures: list[str] = []
        refusals = 0
        count = len(self._endpoints)
        answer: EtcdAnswer | None = None
        for step in range(count):
            index = (self._current + step) % count
            if self._aborted:
                break
            failed = self._authenticate(index)
            if failed is None:
                answer = self._send(index, path, body)
                if answer.code == _UNAUTHENTICATED and self._username is not None:
                    self._token = None  # expired, or forgotten by a restarted member
                    failed = self._authenticate(index)
                    if failed is None:
                        answer = self._send(index, path, body)
            else:
                answer = failed
            if answer.member_trouble:
                failures.append(f"{answer.endpoint}: {answer.message}")
                refusals += answer.refused
                continue
            if index != self._current:
                logger.info("etcd: now using %s", answer.endpoint)
                self._current = index
            return answer, failures
        if answer is None:
            answer = EtcdAnswer(self._shown[self._current], None, message="stopping")
        self._all_refused = refusals == count
        return answer, failures

    def _failure_text(self, answer: EtcdAnswer, failures: list[str]) -> str:
        if len(failures) > 1:
            text = "no etcd endpoint answered: " + "; ".join(failures)
        else:
            text = f"{answer.endpoint}: {answer.message}"
        return clean(text, 400, self._secrets)

    # ----------------------------------------------------------------- register

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        """Put the key with our lease: the lease we hold if etcd still has it, else a new one.

        A key already holding our value under another lease (a previous life of this process,
        within its TTL) is overwritten, not adopted: that lease may hold other keys of a dead
        process, which keeping it alive would keep for ever, and revoking it at our stop could
        delete keys that are not ours. The put moves the key to our lease; the old one expires
        on its own."""
        self._value = _encode_value(payload)
        if self._lease:
            answer, failures = self._put()
            if answer.ok:
                return self._accepted(answer)
            if answer.code != _NOT_FOUND:
                return self._refused(answer, failures, "put")
            logger.info("etcd: lease %x is gone; granting a new one", self._lease)
            self._lease = 0
        answer, failures = self._call("/v3/lease/grant", {"TTL": str(self._ttl)})
        if not answer.ok:
            return self._refused(answer, failures, "lease grant")
        assert answer.body is not None
        self._lease = _int(answer.body.get("ID"))
        self._granted_ttl = float(_int(answer.body.get("TTL"), self._ttl) or self._ttl)
        self._renewed_at = time.monotonic()
        if not self._lease:
            return RegisterOutcome(
                Verdict.RETRY, status_code=answer.status_code, error="lease grant without an ID"
            )
        answer, failures = self._put()
        if answer.ok:
            return self._accepted(answer)
        return self._refused(answer, failures, "put")

    def _put(self) -> tuple[EtcdAnswer, list[str]]:
        body = {
            "key": _b64(self._key),
            "value": _b64(self._value),
            "lease": str(self._lease),
            "prev_kv": True,
        }
        return self._call("/v3/kv/put", body)

    def _accepted(self, answer: EtcdAnswer) -> RegisterOutcome:
        assert answer.body is not None
        header = answer.body.get("header")
        revision = _int(header.get("revision")) if isinstance(header, Mapping) else 0
        self._seen_revision = revision
        if self._renewed_at is None:
            self._renewed_at = time.monotonic()
        previous = answer.body.get("prev_kv")
        if isinstance(previous, Mapping):
            old_lease = _int(previous.get("lease"))
            if old_lease and old_lease != self._lease:
                same = _unb64(previous.get("value")) == self._value
                logger.info(
                    "etcd: key %s was held by lease %x (%s); now by ours, %x",
                    clean(self._key_text, 200),
                    old_lease,
                    "same value: a previous life of this process?" if same else "another value",
                    self._lease,
                )
        return RegisterOutcome(Verdict.ACCEPTED, status_code=answer.status_code)

    def _refused(self, answer: EtcdAnswer, failures: list[str], what: str) -> RegisterOutcome:
        text = self._failure_text(answer, failures)
        code = answer.code
        if answer.status_code is None:
            fatal = isinstance(answer.error, TlsError)
            alert = answer.message.upper()
            if fatal and ("ALERT_BAD_CERTIFICATE" in alert or "CERTIFICATE_REQUIRED" in alert):
                # The server's alert is about our certificate, not its own.
                given = "was refused" if self._cert else "is required, and none was given"
                text = clean(
                    f"{answer.endpoint}: a TLS client certificate {given} ({answer.message}); "
                    "pass cert=(certificate file, key file) signed by a CA the cluster trusts",
                    400,
                    self._secrets,
                )
            return RegisterOutcome(
                Verdict.FATAL if fatal else Verdict.RETRY,
                error=text,
                refused=not fatal and self._all_refused,
            )
        if answer.member_trouble or code == _EXHAUSTED or answer.status_code == 429:
            return RegisterOutcome(
                Verdict.RETRY, status_code=answer.status_code, error=f"{what}: {text}"
            )
        if code == _UNAUTHENTICATED or (code == _INVALID and "authentication" in answer.message):
            hint = "check the etcd user and password"
        elif code == _PERMISSION:
            hint = (
                f"etcd user {self._username!r} may not write {clean(self._key_text, 200)!r}; "
                "grant its role readwrite on the key"
            )
        elif code == _INVALID and "user name is empty" in answer.message:
            hint = "etcd requires authentication: give a username and password"
        else:
            hint = "check the key, the value and the TTL"
        return RegisterOutcome(
            Verdict.FATAL, status_code=answer.status_code, error=f"{what}: {text}; {hint}"
        )

    # ----------------------------------------------------------------- check

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """Renew the lease, then read the key back."""
        if not self._lease:
            return RouteCheck(Route.MISSING, evidence="no lease yet")
        answer, failures = self._call("/v3/lease/keepalive", {"ID": str(self._lease)})
        if answer.ok:
            assert answer.body is not None
            ttl = _int(answer.body.get("TTL"))
            if ttl <= 0:
                return RouteCheck(
                    Route.MISSING,
                    status_code=answer.status_code,
                    evidence=f"lease {self._lease:x} has expired or was revoked",
                )
            self._granted_ttl = float(ttl)
            self._renewed_at = time.monotonic()
        else:
            return self._not_renewed(answer, failures)
        answer, failures = self._call("/v3/kv/range", {"key": _b64(self._key)})
        if not answer.ok:
            if answer.status_code is None or answer.member_trouble:
                return RouteCheck(
                    Route.UNREACHABLE,
                    status_code=answer.status_code,
                    evidence=self._failure_text(answer, failures),
                )
            return RouteCheck(
                Route.UNDETERMINED,
                status_code=answer.status_code,
                evidence=self._failure_text(answer, failures),
            )
        assert answer.body is not None
        return self._classify_key(answer.body, answer.status_code)

    def _not_renewed(self, answer: EtcdAnswer, failures: list[str]) -> RouteCheck:
        """No renewal: not lost until the lease has surely run out since the last one."""
        text = self._failure_text(answer, failures)
        since = None if self._renewed_at is None else time.monotonic() - self._renewed_at
        if since is not None and since > self._granted_ttl:
            return RouteCheck(
                Route.MISSING,
                status_code=answer.status_code,
                evidence=(
                    f"no renewal acknowledged for {since:.1f} s, over the lease TTL of "
                    f"{self._granted_ttl:g} s: the key has expired ({text})"
                ),
            )
        route = Route.UNREACHABLE if answer.status_code is None else Route.UNDETERMINED
        if answer.member_trouble:
            route = Route.UNREACHABLE
        refused = route is Route.UNREACHABLE and self._all_refused
        return RouteCheck(route, status_code=answer.status_code, evidence=text, refused=refused)

    def _classify_key(self, body: Mapping[str, Any], status: int | None) -> RouteCheck:
        header = body.get("header")
        kvs = body.get("kvs")
        kv = kvs[0] if isinstance(kvs, list) and kvs and isinstance(kvs[0], Mapping) else None
        if kv is None:
            revision = _int(header.get("revision")) if isinstance(header, Mapping) else 0
            self._seen_revision = revision
            return RouteCheck(Route.MISSING, status_code=status, evidence="the key is not there")
        # The key as of the answer's revision: later changes are what the watch must report
        # (watching from there, not from the key's own older revision, also keeps clear of
        # history that compaction removed).
        revision = _int(header.get("revision")) if isinstance(header, Mapping) else 0
        self._seen_revision = max(_int(kv.get("mod_revision")), revision)
        lease = _int(kv.get("lease"))
        ours = _unb64(kv.get("value")) == self._value
        if ours and lease == self._lease:
            return RouteCheck(Route.PRESENT, status_code=status, evidence=f"lease {lease:x}")
        if ours and lease:
            # A twin with our value: the key is right and will not outlive its holder; taking
            # it over would only make the twin take it back.
            return RouteCheck(
                Route.PRESENT,
                status_code=status,
                evidence=f"our value, held by another lease ({lease:x})",
            )
        if not lease:
            return RouteCheck(
                Route.MISSING,
                status_code=status,
                evidence="the key was overwritten without a lease",
            )
        if lease == self._lease:
            return RouteCheck(
                Route.MISSING, status_code=status, evidence="another value under our lease"
            )
        # Another live registrant holds the key with its own value: fighting over it would
        # flip readers between the two; take it back only once its lease ends.
        return RouteCheck(
            Route.CONFLICT,
            status_code=status,
            evidence=f"the key holds another value under lease {lease:x}",
        )

    # ----------------------------------------------------------------- the watch

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait on the watch stream, the waker and the renewal schedule; True when the key
        changed, the watch broke or came back after a break, or the lease is due for renewal."""
        end = time.monotonic() + max(0.0, timeout)
        while True:
            if waker.is_set():
                return False
            now = time.monotonic()
            due = self._renewal_due()
            if due is not None and now >= due:
                return True
            if now >= end:
                return False
            limit = end - now if due is None else min(end, due) - now
            stream = self._ensure_stream(now)
            if stream is None:
                if self._lease and self._stream_broken:
                    limit = min(limit, max(0.0, self._next_stream_try - now))
                if waker.wait(limit):
                    return False
                continue
            changed = self._wait_stream(stream, waker, limit)
            if changed is not None:
                return changed

    def _renewal_due(self) -> float | None:
        if not self._lease or self._renewed_at is None:
            return None
        # A little past the schedule the loop keeps (watch_interval): this only fires when the
        # registrar was given a longer watch interval than the TTL allows.
        return self._renewed_at + self._fraction * self._granted_ttl * 1.1

    def _ensure_stream(self, now: float) -> _WatchStream | None:
        if not self._lease or not self._value or self._watch_denied:
            return None
        if self._stream is not None and self._stream.index != self._current:
            self._drop_stream(broken=False)  # follow the failover
        if self._stream is not None:
            return self._stream
        if now < self._next_stream_try:
            return None
        index = self._current
        request = self._watch_request(index)
        try:
            self._stream = _WatchStream.open(
                self._endpoints[index],
                index,
                request,
                self._ssl_context(),
                self._connect_timeout(),
                self._limit,
            )
        except (OSError, ValueError) as exc:
            logger.debug("etcd watch at %s not opened: %s", self._shown[index], exc)
            self._stream_broken = True
            self._next_stream_try = now + _WATCH_RETRY * (0.5 + self._rng())
            return None
        return self._stream

    def _wait_stream(self, stream: _WatchStream, waker: Waker, limit: float) -> bool | None:
        """One wait on the stream; True/False to return, None to keep waiting."""
        if not stream.buffered():
            ready = _stream_ready(stream, waker, limit)
            if ready is not True:
                return ready
        try:
            messages = stream.read()
        except (OSError, StreamError) as exc:
            was_created = stream.created
            self._drop_stream(broken=True)
            logger.info("etcd watch at %s ended: %s", stream.endpoint, describe_exception(exc))
            # An established watch that breaks may mean the member restarted, perhaps without
            # its data: check now. One that never got going only waits for its next try.
            return True if was_created else None
        for message in messages:
            if isinstance(message, Mapping):
                done, answer = self._on_message(stream, message)
                if done:
                    return answer
        return None

    def _on_message(
        self, stream: _WatchStream, message: Mapping[str, Any]
    ) -> tuple[bool, bool | None]:
        """What one watch message means: (done, what `_wait_stream` answers when done)."""
        result = message.get("result")
        result = result if isinstance(result, Mapping) else {}
        compacted = _int(result.get("compact_revision"))
        if compacted:
            # History before it is gone: the next watch starts there (the check that follows
            # reads the key as it is now).
            self._seen_revision = max(self._seen_revision, compacted - 1)
        reason = watch_change(message, self._key, self._value, self._lease, self._seen_revision + 1)
        if reason is not None and "permission denied" in reason:
            # Checks still renew the lease and read the key; only the early notice is lost.
            logger.warning(
                "etcd watch at %s: %s; the key is checked every watch interval only",
                stream.endpoint,
                reason,
            )
            self._drop_stream(broken=False)
            self._watch_denied = True
            return True, None
        if reason is not None:
            logger.info("etcd watch at %s: %s", stream.endpoint, reason)
            if reason.startswith("the watch"):  # cancelled or failed: open a new one
                self._drop_stream(broken=True)
            return True, True
        if result.get("created") and not stream.created:
            stream.created = True
            if self._stream_broken:
                self._stream_broken = False
                logger.info("etcd watch at %s is back; checking now", stream.endpoint)
                return True, True
        return False, None

    def _watch_request(self, index: int) -> bytes:
        body = json.dumps(
            {
                "create_request": {
                    "key": _b64(self._key),
                    "start_revision": str(self._seen_revision + 1),
                }
            }
        ).encode()
        parts = urlsplit(self._endpoints[index])
        lines = [
            "POST /v3/watch HTTP/1.1",
            f"Host: {parts.netloc.rpartition('@')[2]}",
            f"User-Agent: registrar/{__version__}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if self._token:
            lines.append(f"Authorization: {self._token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _ssl_context(self) -> ssl.SSLContext | None:
        """The same TLS context the unary calls' transport uses (built from the same files)."""
        if not self._endpoints[self._current].startswith("https://"):
            return None
        return self._tls.context()

    def _connect_timeout(self) -> float:
        return self._timeout[0] if isinstance(self._timeout, tuple) else self._timeout

    def _drop_stream(self, broken: bool) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if broken:
            self._stream_broken = True
            self._next_stream_try = time.monotonic() + _WATCH_RETRY * (0.5 + self._rng())

    # ----------------------------------------------------------------- the end

    def abort(self) -> None:
        """End the request in flight (from `stop()`); no failover after it. The revoke that
        `close()` sends is not cut: the registrar's thread may already be sending it."""
        with self._abort_lock:
            if self._closing:
                return
            self._aborted = True
            for transport in self._http:
                transport.abort()

    def close(self) -> None:
        """Revoke the lease, so the key disappears now rather than a TTL later; release
        everything."""
        with self._abort_lock:
            self._closing = True
            self._aborted = False
        self._drop_stream(broken=False)
        if self._lease:
            answer, failures = self._call("/v3/lease/revoke", {"ID": str(self._lease)})
            if answer.ok or answer.code == _NOT_FOUND:
                logger.info("etcd: revoked lease %x; key %s removed", self._lease, self._key_text)
            else:
                logger.warning(
                    "etcd: could not revoke lease %x (%s); the key expires within %g s",
                    self._lease,
                    self._failure_text(answer, failures),
                    self._granted_ttl,
                )
            self._lease = 0
        for transport in self._http:
            transport.close()


def _endpoints(value: object) -> list[str]:
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


def _check_cert(cert: object) -> tuple[str, str] | None:
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


def _encode_value(payload: Mapping[str, Any]) -> bytes:
    """The stored value: compact JSON with sorted keys, so the same payload is the same bytes
    in every life of the process (readers comparing values see no change)."""
    return json.dumps(dict(payload), separators=(",", ":"), sort_keys=True).encode()
