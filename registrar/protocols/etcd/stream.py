"""The watch stream: one `POST /v3/watch` read from a plain (or TLS) socket, its chunked body of
newline-separated JSON messages decoded as the pieces arrive.

A plain socket, not a buffered HTTP client, so that `select()` sees exactly the bytes not yet
read (a buffered client hides some from it), and so that each piece is bounded as it arrives: a
head over 16 KiB, a chunk-size line over 1 KiB or a message over its limit is a `StreamError`,
never a growing buffer."""

from __future__ import annotations

import contextlib
import selectors
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...core.errors import ConfigError
from ...core.redact import clean
from ...core.untrusted import load_json
from ...core.waker import Waker
from ..resolver import RESOLVER, connect

MAX_WATCH_MESSAGE = 1024 * 1024
"""Bytes one watch message may take (an event carries our value and maybe a previous one)."""
_MAX_HEAD = 16 * 1024
_MAX_SIZE_LINE = 1024
_READ = 64 * 1024


def message_limit(value: object) -> int:
    """`max_message_bytes` checked: a whole number of bytes, 1 KiB or more."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1024:
        return value
    raise ConfigError(f"max_message_bytes must be an integer >= 1024, got {value!r}")


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


@dataclass(frozen=True)
class Dial:
    """How a watch stream reaches its member: the TLS context (None for http://) and the
    connect timeout, the same as the unary calls'."""

    context: ssl.SSLContext | None
    timeout: float


class WatchStream:
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
    def open(cls, endpoint: str, index: int, request: bytes, dial: Dial, limit: int) -> WatchStream:
        parts = urlsplit(endpoint)
        host = parts.hostname or "127.0.0.1"
        port = parts.port or (443 if parts.scheme == "https" else 80)
        # Resolved within the connect timeout (a stalled resolver must not hold the watch).
        resolved = RESOLVER.resolve(host, port, dial.timeout)
        sock = connect(resolved, dial.timeout)
        try:
            if dial.context is not None:
                sock = dial.context.wrap_socket(sock, server_hostname=host)
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

    def wait_readable(self, waker: Waker, limit: float) -> bool | None:
        """Wait for the stream to be readable: True when it is, False when the waker is set (or
        closed: the registrar is ending), None when `limit` seconds passed."""
        with selectors.DefaultSelector() as selector:
            selector.register(self.sock, selectors.EVENT_READ)
            try:
                selector.register(waker.fileno(), selectors.EVENT_READ, "waker")
            except (ValueError, OSError):
                return False
            ready = selector.select(limit)
        if any(key.data == "waker" for key, _ in ready):
            return False
        return True if ready else None

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
