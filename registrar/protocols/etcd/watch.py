"""The watch on our key: between checks, a `POST /v3/watch` stream tells at once when the key is
deleted or overwritten by someone else, rather than at the next check.

`watch_change` says what one watch message means (pure); `KeyWatch` keeps one stream open on the
member the client uses (following its failover), re-opens a broken one after a jittered second,
and says when the registration may have changed, or the watch came back after a break (a
member that restarted may have lost its data: check now)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ..._version import __version__
from ...core.errors import describe_exception
from ...core.redact import clean
from ...core.waker import Waker
from .answer import b64, int64, unb64
from .client import EtcdClient
from .stream import StreamError, WatchStream

logger = logging.getLogger(__name__)

_WATCH_RETRY = 1.0
"""Seconds between attempts to re-open a broken watch (jittered by +-50 %)."""


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
    if int64(result.get("compact_revision")):
        reason = f"history compacted up to {int64(result.get('compact_revision'))}"
    return f"the watch was cancelled ({reason or 'no reason given'})"


def _event_change(
    events: list[Any], key: bytes, value: bytes, lease: int, from_revision: int
) -> str | None:
    """Why one of `events` changed our key since `from_revision`, or None."""
    for event in events:
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
    """Follows `key` on the member `client` uses; `seen_revision` is the key's last revision
    the registration knows of (the watch reports only later changes)."""

    def __init__(
        self, client: EtcdClient, key: bytes, limit: int, rng: Callable[[], float]
    ) -> None:
        self._client = client
        self._key = key
        self._limit = limit
        self._rng = rng
        self.seen_revision = 0
        self._stream: WatchStream | None = None
        self._broken = False
        self._denied = False
        self._next_try = 0.0

    def wait(self, value: bytes, lease: int, waker: Waker, now: float, limit: float) -> bool | None:
        """Wait up to `limit` seconds for news of `value` under `lease`: True when the key
        changed, the watch broke or came back after a break; False when the waker is set;
        None when nothing happened (wait again)."""
        stream = self._ensure_stream(now, value, lease)
        if stream is None:
            if lease and self._broken:
                limit = min(limit, max(0.0, self._next_try - now))
            return False if waker.wait(limit) else None
        return self._wait_stream(stream, waker, limit, value, lease)

    def close(self) -> None:
        self._drop_stream(broken=False)

    def _ensure_stream(self, now: float, value: bytes, lease: int) -> WatchStream | None:
        if not lease or not value or self._denied:
            return None
        if self._stream is not None and self._stream.index != self._client.current:
            self._drop_stream(broken=False)  # follow the failover
        if self._stream is not None:
            return self._stream
        if now < self._next_try:
            return None
        index = self._client.current
        request = self._watch_request(index)
        try:
            self._stream = WatchStream.open(
                self._client.url(index), index, request, self._client.dial(index), self._limit
            )
        except (OSError, ValueError) as exc:
            logger.debug("etcd watch at %s not opened: %s", self._client.shown[index], exc)
            self._broken = True
            self._next_try = now + _WATCH_RETRY * (0.5 + self._rng())
            return None
        return self._stream

    def _wait_stream(
        self, stream: WatchStream, waker: Waker, limit: float, value: bytes, lease: int
    ) -> bool | None:
        """One wait on the stream; True/False to return, None to keep waiting."""
        if not stream.buffered():
            ready = stream.wait_readable(waker, limit)
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
                done, answer = self._on_message(stream, message, value, lease)
                if done:
                    return answer
        return None

    def _on_message(
        self, stream: WatchStream, message: Mapping[str, Any], value: bytes, lease: int
    ) -> tuple[bool, bool | None]:
        """What one watch message means: (done, what `_wait_stream` answers when done)."""
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
            self._drop_stream(broken=False)
            self._denied = True
            return True, None
        if reason is not None:
            logger.info("etcd watch at %s: %s", stream.endpoint, reason)
            if reason.startswith("the watch"):  # cancelled or failed: open a new one
                self._drop_stream(broken=True)
            return True, True
        if result.get("created") and not stream.created:
            stream.created = True
            if self._broken:
                self._broken = False
                logger.info("etcd watch at %s is back; checking now", stream.endpoint)
                return True, True
        return False, None

    def _watch_request(self, index: int) -> bytes:
        body = json.dumps(
            {
                "create_request": {
                    "key": b64(self._key),
                    "start_revision": str(self.seen_revision + 1),
                }
            }
        ).encode()
        parts = urlsplit(self._client.url(index))
        lines = [
            "POST /v3/watch HTTP/1.1",
            f"Host: {parts.netloc.rpartition('@')[2]}",
            f"User-Agent: registrar/{__version__}",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if self._client.token:
            lines.append(f"Authorization: {self._client.token}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + body

    def _drop_stream(self, broken: bool) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
        if broken:
            self._broken = True
            self._next_try = time.monotonic() + _WATCH_RETRY * (0.5 + self._rng())
