"""`EtcdTransport`: the payload under a key, held by a lease this process keeps alive (the
model: the package's docstring). The requests go through `.client` (failover, auth, TLS); what
etcd's answers mean for the registration is decided here."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...core.errors import ConfigError
from ...core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from ...core.redact import clean
from ...core.waker import Waker
from .answer import EtcdAnswer, Grpc, b64, header_revision, int64, unb64
from .client import EtcdClient
from .settings import DEFAULT_KEEPALIVE_FRACTION, EtcdSettings
from .stream import MAX_WATCH_MESSAGE, message_limit
from .verdicts import key_check, not_renewed, not_written, unread
from .watch import KeyWatch

logger = logging.getLogger(__name__)


# The loop's first wait after a registration is up to 1.5 watch intervals (a fleet spreads its
# checks over a whole interval), so this many intervals fit in one keep-alive period.
_LONGEST_WAIT = 1.5


def watch_interval_for(ttl: float, keepalive_fraction: float = DEFAULT_KEEPALIVE_FRACTION) -> float:
    """The registrar's watch interval that renews a lease of `ttl` seconds at least every
    `keepalive_fraction * ttl`: each check renews it, and the loop waits at most 1.5 intervals
    between checks."""
    return ttl * keepalive_fraction / _LONGEST_WAIT


class EtcdTransport:
    """Keeps `payload` (as compact JSON) under the settings' `key` in etcd, held by a lease
    renewed every `keepalive_fraction * ttl` seconds (`EtcdSettings` says what each option
    means). Requests go to the member that answered last and fail over to the next when one
    does not answer or says it cannot (no leader, timed out, unavailable); etcd's auth token is
    fetched again when etcd says it is invalid. `max_message_bytes` caps one watch message,
    `rng` is for tests.
    """

    def __init__(
        self,
        settings: EtcdSettings,
        *,
        max_message_bytes: int = MAX_WATCH_MESSAGE,
        rng: Callable[[], float] | None = None,
    ) -> None:
        self._key = settings.key.encode()
        self._key_text = settings.key
        self._ttl, self._fraction = settings.lease_seconds, settings.keepalive_fraction
        self._client = EtcdClient(settings)
        limit = message_limit(max_message_bytes)
        self._watch = KeyWatch(
            self._client, self._key, limit, rng if rng is not None else random.random
        )
        self._value = b""
        self._lease = 0
        self._granted_ttl = float(self._ttl)
        self._renewed_at: float | None = None
        """When the latest renewal (or grant) was acknowledged."""

    # ----------------------------------------------------------------- properties

    @property
    def display_url(self) -> str:
        return f"{','.join(self._client.shown)} key {clean(self._key_text, 200)}"

    @property
    def endpoints(self) -> tuple[str, ...]:
        """The endpoints, credentials redacted, in failover order."""
        return tuple(self._client.shown)

    @property
    def ttl(self) -> int:
        """The lease TTL asked for, in whole seconds."""
        return self._ttl

    @property
    def watch_interval(self) -> float:
        """The registrar watch interval that keeps the lease renewed in time."""
        return watch_interval_for(self._ttl, self._fraction)

    def fit_watch_interval(self, given: float | None) -> float:
        """`given`, or the longest interval that renews the lease in time (None); a longer one
        is a `ConfigError` (each check renews the lease)."""
        longest = self.watch_interval
        if given is None:
            return longest
        if (
            isinstance(given, bool)
            or not isinstance(given, int | float)
            or not 0 < given <= longest
        ):
            self.close()
            raise ConfigError(
                f"watch_interval must be within (0, {longest:g}] s for ttl={self._ttl} and "
                f"keepalive_fraction={self._fraction:g}: each check renews the lease, "
                f"got {given!r}"
            )
        return given

    @property
    def lease(self) -> int:
        """The current lease ID (0 before the first grant)."""
        return self._lease

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
            if answer.code != Grpc.NOT_FOUND:
                return self._not_written(answer, failures, "put")
            logger.info("etcd: lease %x is gone; granting a new one", self._lease)
            self._lease = 0
        answer, failures = self._client.call("/v3/lease/grant", {"TTL": str(self._ttl)})
        if not answer.ok:
            return self._not_written(answer, failures, "lease grant")
        assert answer.body is not None
        self._lease = int64(answer.body.get("ID"))
        self._granted_ttl = float(int64(answer.body.get("TTL"), self._ttl) or self._ttl)
        self._renewed_at = time.monotonic()
        if not self._lease:
            return RegisterOutcome(
                Verdict.RETRY, status_code=answer.status_code, error="lease grant without an ID"
            )
        answer, failures = self._put()
        if answer.ok:
            return self._accepted(answer)
        return self._not_written(answer, failures, "put")

    def _not_written(self, answer: EtcdAnswer, failures: list[str], what: str) -> RegisterOutcome:
        return not_written(answer, failures, what, self._client, self._key_text)

    def _put(self) -> tuple[EtcdAnswer, list[str]]:
        body = {
            "key": b64(self._key),
            "value": b64(self._value),
            "lease": str(self._lease),
            "prev_kv": True,
        }
        return self._client.call("/v3/kv/put", body)

    def _accepted(self, answer: EtcdAnswer) -> RegisterOutcome:
        assert answer.body is not None
        self._watch.seen_revision = header_revision(answer.body)
        if self._renewed_at is None:
            self._renewed_at = time.monotonic()
        previous = answer.body.get("prev_kv")
        if isinstance(previous, Mapping):
            old_lease = int64(previous.get("lease"))
            if old_lease and old_lease != self._lease:
                same = unb64(previous.get("value")) == self._value
                logger.info(
                    "etcd: key %s was held by lease %x (%s); now by ours, %x",
                    clean(self._key_text, 200),
                    old_lease,
                    "same value: a previous life of this process?" if same else "another value",
                    self._lease,
                )
        return RegisterOutcome(Verdict.ACCEPTED, status_code=answer.status_code)

    # ----------------------------------------------------------------- check

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """Renew the lease, then read the key back."""
        if not self._lease:
            return RouteCheck(Route.MISSING, evidence="no lease yet")
        answer, failures = self._client.call("/v3/lease/keepalive", {"ID": str(self._lease)})
        if answer.ok:
            assert answer.body is not None
            ttl = int64(answer.body.get("TTL"))
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
        answer, failures = self._client.call("/v3/kv/range", {"key": b64(self._key)})
        if not answer.ok:
            return unread(answer, self._client.failure_text(answer, failures))
        assert answer.body is not None
        check, self._watch.seen_revision = key_check(
            answer.body, answer.status_code, self._value, self._lease
        )
        return check

    def _not_renewed(self, answer: EtcdAnswer, failures: list[str]) -> RouteCheck:
        text = self._client.failure_text(answer, failures)
        since = None if self._renewed_at is None else time.monotonic() - self._renewed_at
        return not_renewed(answer, text, since, self._granted_ttl, self._client.all_refused)

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
            changed = self._watch.wait(self._value, self._lease, waker, now, limit)
            if changed is not None:
                return changed

    def _renewal_due(self) -> float | None:
        if not self._lease or self._renewed_at is None:
            return None
        # A little past the schedule the loop keeps (watch_interval): this only fires when the
        # registrar was given a longer watch interval than the TTL allows.
        return self._renewed_at + self._fraction * self._granted_ttl * 1.1

    # ----------------------------------------------------------------- the end

    def resolution(self) -> str | None:
        """What the resolver does to the members' names (`Status.resolution`)."""
        return self._client.resolution()

    def abort(self) -> None:
        """End the request in flight (from `stop()`); no failover after it. The revoke that
        `close()` sends is not cut: the registrar's thread may already be sending it."""
        self._client.abort()

    def close(self) -> None:
        """Revoke the lease, so the key disappears now rather than a TTL later; release
        everything."""
        self._client.closing()
        self._watch.close()
        if self._lease:
            answer, failures = self._client.call("/v3/lease/revoke", {"ID": str(self._lease)})
            if answer.ok or answer.code == Grpc.NOT_FOUND:
                logger.info("etcd: revoked lease %x; key %s removed", self._lease, self._key_text)
            else:
                logger.warning(
                    "etcd: could not revoke lease %x (%s); the key expires within %g s",
                    self._lease,
                    self._client.failure_text(answer, failures),
                    self._granted_ttl,
                )
            self._lease = 0
        self._client.close()


def _encode_value(payload: Mapping[str, Any]) -> bytes:
    """The stored value: compact JSON with sorted keys, so the same payload is the same bytes
    in every life of the process (readers comparing values see no change)."""
    return json.dumps(dict(payload), separators=(",", ":"), sort_keys=True).encode()
