"""The watch on our key (`POST /v3/watch`): news at once when it is deleted or overwritten. Read
from a plain (or TLS) socket, not a buffered HTTP client, so that `select()` sees exactly the
bytes not yet read, and each piece is bounded as it arrives (never a growing buffer)."""

from __future__ import annotations

import contextlib
import json
import logging
import random
import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from ..._version import __version__
from ...core._clock import Waker, wait_readable
from ...core._errors import describe_exception
from ...core._redact import clean, load_json
from ...core._transport import connect_read
from .._httpvalues import Endpoint
from .._resolver import RESOLVER, connect
from .client import EtcdClient, b64, int64, unb64

logger = logging.getLogger("registrar.protocols.etcd.watch")

MAX_WATCH_MESSAGE = 1024 * 1024
"""Bytes one watch message may take (an event carries our value and maybe a previous one)."""
_MAX_HEAD = 16 * 1024
_MAX_SIZE_LINE = 1024
_READ = 64 * 1024
_WATCH_RETRY = 1.0  # seconds between attempts to re-open a broken watch (jittered by +-50 %)


class StreamError(ValueError):
    """The watch stream broke its framing or a bound."""


class ChunkedLines:
    """Decodes an HTTP/1.1 chunked body of newline-separated JSON messages, fed in pieces of
    any size (a message may span chunks, a chunk may hold several)."""

    def __init__(self, limit: int = MAX_WATCH_MESSAGE) -> None:
        self._limit = limit
        self._raw = bytearray()
        self._line = bytearray()
        self._left = 0  # bytes of the current chunk's data still to come
        self._after_data = False  # a chunk's data ended: its CRLF comes next
        self.ended = False  # the zero-size chunk arrived: the server ended the stream

    def feed(self, data: bytes) -> list[Any]:
        """The complete messages `data` finishes, in order."""
        self._raw += data
        messages: list[Any] = []
        while self._raw and not self.ended:
            if self._left:
                self._data(messages)
            elif not self._next_chunk():
                break
        return messages

    def _next_chunk(self) -> bool:
        """Past a chunk's CRLF and the next size line; False: more bytes needed (or the end)."""
        if self._after_data:
            if len(self._raw) < 2:
                return False
            if self._raw[:2] != b"\r\n":
                raise StreamError("chunk not followed by CRLF")
            del self._raw[:2]
            self._after_data = False
        end = self._raw.find(b"\r\n")
        if end < 0:
            if len(self._raw) > _MAX_SIZE_LINE:
                raise StreamError("chunk-size line too long")
            return False
        text = bytes(self._raw[:end]).split(b";", 1)[0].strip()
        del self._raw[: end + 2]
        try:
            self._left = int(text, 16)
        except ValueError:
            raise StreamError(f"bad chunk size {clean(text, 40)!r}") from None
        if self._left < 0:
            raise StreamError("negative chunk size")
        self.ended = self._left == 0
        return not self.ended

    def _data(self, messages: list[Any]) -> None:
        take = min(self._left, len(self._raw))
        self._line += self._raw[:take]
        del self._raw[:take]
        self._left -= take
        self._after_data = self._left == 0
        while (end := self._line.find(b"\n")) >= 0:
            line = bytes(self._line[:end]).strip()
            del self._line[: end + 1]
            if line:
                try:
                    messages.append(load_json(line))
                except ValueError as exc:
                    raise StreamError(f"unreadable watch message: {exc}") from None
        if len(self._line) > self._limit:
            raise StreamError(f"watch message over {self._limit} bytes")


class WatchStream:
    """One `POST /v3/watch` of `key` from `revision` on a non-blocking socket, on member `index`."""

    def __init__(self, client: EtcdClient, index: int, key: bytes, revision: int) -> None:
        start = {"key": b64(key), "start_revision": str(revision)}
        body = json.dumps({"create_request": start}).encode()
        lines = [
            "POST /v3/watch HTTP/1.1",
            f"Host: {urlsplit(client.urls[index]).netloc.rpartition('@')[2]}",
            f"User-Agent: registrar/{__version__}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if client.token:
            lines.append(f"Authorization: {client.token}")
        request = ("\r\n".join(lines) + "\r\n\r\n").encode() + body
        where = Endpoint.of(client.urls[index])
        timeout = connect_read(client.settings.timeout)[0]
        # Resolved within the connect timeout (a stalled resolver must not hold the watch).
        sock = connect(RESOLVER.resolve(where.host, where.port, timeout), timeout)
        try:
            if where.tls:
                sock = client.tls.context().wrap_socket(sock, server_hostname=where.host)
            sock.sendall(request)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self.endpoint = client.shown[index]
        self.index = index
        self.sock: socket.socket = sock
        self.created = False
        self._head = bytearray()
        self._body: ChunkedLines | None = None

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
            lines = bytes(self._head[:end]).decode("latin-1").split("\r\n")
            status = lines[0].split(" ", 2)
            if len(status) < 2 or status[1] != "200":
                raise StreamError(f"watch refused: {clean(lines[0], 80)}")
            headers = (line.partition(":") for line in lines[1:])
            fields = {name.strip().lower(): value.strip().lower() for name, _, value in headers}
            if "chunked" not in fields.get("transfer-encoding", ""):
                raise StreamError("watch answer is not a stream")
            data = bytes(self._head[end + 4 :])
            self._body = ChunkedLines()
        messages = self._body.feed(data)
        if self._body.ended:
            raise StreamError("the server ended the watch stream")
        return messages


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
        reason = clean(result.get("cancel_reason") or "", 120)
        if int64(result.get("compact_revision")):
            reason = f"history compacted up to {int64(result.get('compact_revision'))}"
        return f"the watch was cancelled ({reason or 'no reason given'})"
    events = result.get("events")
    for event in events if isinstance(events, list) else ():
        kv = event.get("kv") if isinstance(event, Mapping) else None
        if not isinstance(kv, Mapping) or unb64(kv.get("key")) != key:
            continue
        revision = int64(kv.get("mod_revision"))
        if revision < from_revision:
            continue  # before (or at) the state we last saw: already accounted for
        if event.get("type") == "DELETE":
            return f"the key was deleted (revision {revision})"
        if unb64(kv.get("value")) != value or int64(kv.get("lease")) != lease:
            return f"the key was overwritten (revision {revision})"
    return None


class KeyWatch:
    """Follows `key` on the member `client` uses; `seen_revision`: the key's last known revision."""

    def __init__(self, client: EtcdClient, key: bytes) -> None:
        self._client = client
        self._key = key
        self.seen_revision = 0
        self._stream: WatchStream | None = None
        self._broken = False
        self._denied = False
        self._next_try = 0.0

    def wait(self, value: bytes, lease: int, waker: Waker, now: float, limit: float) -> bool | None:
        """True: the key changed, or the watch broke or is back; False: woken; None: no news."""
        stream = self._ensure_stream(now, value, lease)
        if stream is None:
            if lease and self._broken:
                limit = min(limit, max(0.0, self._next_try - now))
            return False if waker.wait(limit) else None
        # A TLS socket may hold bytes it decrypted already, which poll() cannot see.
        pending = isinstance(stream.sock, ssl.SSLSocket) and stream.sock.pending() > 0
        if not pending and not wait_readable(stream.sock, limit, waker):
            return False if waker.is_set() else None
        try:
            messages = stream.read()
        except (OSError, StreamError) as exc:
            self.close(broken=True)
            logger.info("etcd watch at %s ended: %s", stream.endpoint, describe_exception(exc))
            # An established watch that breaks may mean the member restarted, perhaps without
            # its data: check now. One that never got going only waits for its next try.
            return True if stream.created else None
        for message in messages:
            if isinstance(message, Mapping):
                done, answer = self._on_message(stream, message, value, lease)
                if done:
                    return answer
        return None

    def _ensure_stream(self, now: float, value: bytes, lease: int) -> WatchStream | None:
        if not lease or not value or self._denied:
            return None
        if self._stream is not None and self._stream.index != self._client.current:
            self.close()  # follow the failover
        if self._stream is not None or now < self._next_try:
            return self._stream
        index = self._client.current
        try:
            self._stream = WatchStream(self._client, index, self._key, self.seen_revision + 1)
        except (OSError, ValueError) as exc:
            logger.debug("etcd watch at %s not opened: %s", self._client.shown[index], exc)
            self.close(broken=True)
        return self._stream

    def _on_message(
        self, stream: WatchStream, message: Mapping[str, Any], value: bytes, lease: int
    ) -> tuple[bool, bool | None]:
        """What one watch message means: (done, what `wait` answers when done)."""
        result = message.get("result")
        result = result if isinstance(result, Mapping) else {}
        compacted = int64(result.get("compact_revision"))
        if compacted:
            # History before it is gone: the next watch starts there (the check that follows
            # reads the key as it is now).
            self.seen_revision = max(self.seen_revision, compacted - 1)
        reason = watch_change(message, self._key, value, lease, self.seen_revision + 1)
        if reason is not None and "permission denied" in reason:
            # Checks still renew the lease and read the key; only the early notice is lost.
            logger.warning(
                "etcd watch at %s: %s; the key is checked every watch interval only",
                stream.endpoint,
                reason,
            )
            self.close()
            self._denied = True
            return True, None
        if reason is not None:
            logger.info("etcd watch at %s: %s", stream.endpoint, reason)
            if reason.startswith("the watch"):  # cancelled or failed: open a new one
                self.close(broken=True)
            return True, True
        if result.get("created") and not stream.created:
            stream.created = True
            if self._broken:
                self._broken = False
                logger.info("etcd watch at %s is back; checking now", stream.endpoint)
                return True, True
        return False, None

    def close(self, broken: bool = False) -> None:
        """Drop the stream; `broken`: open a new one after a jittered second."""
        if self._stream is not None:
            with contextlib.suppress(OSError):
                self._stream.sock.close()
            self._stream = None
        if broken:
            self._broken = True
            self._next_try = time.monotonic() + _WATCH_RETRY * (0.5 + random.random())
