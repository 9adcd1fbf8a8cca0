"""The payload under a key, held by a lease this process keeps alive (docs/etcd.md, "The
model"): retry what one member or a passing state caused, stop on what only a person can fix,
and never call a key lost before its lease has surely run out."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from ...core._clock import Waker
from ...core._errors import ConfigError
from ...core._redact import clean
from ...core._transport import RegisterOutcome, Route, RouteCheck, Verdict
from .._httpconn import TlsError
from .client import EtcdAnswer, EtcdClient, Grpc, b64, header_revision, int64, unb64
from .settings import EtcdSettings
from .watch import KeyWatch

logger = logging.getLogger("registrar.protocols.etcd.transport")


class EtcdTransport(EtcdClient):
    def __init__(self, settings: EtcdSettings) -> None:
        super().__init__(settings)
        self._key = settings.key.encode()
        self._ttl, self._fraction = settings.lease_seconds, settings.keepalive_fraction
        self.display_url = f"{','.join(self.shown)} key {clean(settings.key, 200)}"
        self._watch = KeyWatch(self, self._key)
        self._value = b""
        self.lease = 0  # before the first grant
        self._granted_ttl = float(self._ttl)
        self._renewed_at = 0.0  # the latest renewal (or grant) acknowledged: set with a lease

    def fit_watch_interval(self, given: float | None, chosen: bool) -> float:
        """`given` if chosen, else the longest renewing the lease each `keepalive_fraction*ttl`."""
        # The loop's first wait after a registration is up to 1.5 watch intervals (a fleet
        # spreads its checks over a whole interval): 1.5 of them fit in one keep-alive period.
        longest = self._ttl * self._fraction / 1.5
        if given is None or not chosen:
            return longest
        if given > longest:
            self.close()
            raise ConfigError(
                f"watch_interval must be within (0, {longest:g}] s for ttl={self._ttl} and "
                f"keepalive_fraction={self._fraction:g}: each check renews the lease, got {given!r}"
            )
        return given

    def register(self, payload: Mapping[str, Any]) -> RegisterOutcome:
        """Put the key with the lease we hold if etcd still has it, else a new one. A key with
        our value under another lease is overwritten, not adopted (docs/etcd.md, "The model")."""
        # Compact, keys sorted: the same payload is the same bytes in every life of the process.
        self._value = json.dumps(dict(payload), separators=(",", ":"), sort_keys=True).encode()
        answer = self._put() if self.lease else None
        if answer is None or answer.code == Grpc.NOT_FOUND:
            if answer is not None:
                logger.info("etcd: lease %x is gone; granting a new one", self.lease)
                self.lease = 0
            answer = self.call("/v3/lease/grant", {"TTL": str(self._ttl)})
            if answer.body is None:
                return self._not_written(answer, "lease grant")
            self.lease = int64(answer.body.get("ID"))
            self._granted_ttl = float(int64(answer.body.get("TTL")) or self._ttl)
            self._renewed_at = time.monotonic()
            if not self.lease:
                error = "lease grant without an ID"
                return RegisterOutcome(Verdict.RETRY, answer.status_code, error)
            answer = self._put()
        if answer.body is None:
            return self._not_written(answer, "put")
        self._watch.seen_revision = header_revision(answer.body)
        previous = answer.body.get("prev_kv")
        previous = previous if isinstance(previous, Mapping) else {}
        old_lease = int64(previous.get("lease"))
        if old_lease and old_lease != self.lease:
            same = unb64(previous.get("value")) == self._value
            logger.info(
                "etcd: key %s was held by lease %x (%s); now by ours, %x",
                clean(self.settings.key, 200),
                old_lease,
                "same value: a previous life of this process?" if same else "another value",
                self.lease,
            )
        return RegisterOutcome(Verdict.ACCEPTED, status_code=answer.status_code)

    def _put(self) -> EtcdAnswer:
        value, lease = b64(self._value), str(self.lease)
        body = {"key": b64(self._key), "value": value, "lease": lease, "prev_kv": True}
        return self.call("/v3/kv/put", body)

    def _not_written(self, answer: EtcdAnswer, what: str) -> RegisterOutcome:
        """A failed grant or put: retried unless only a person can fix it."""
        text = answer.failure
        if answer.status_code is None:
            fatal = isinstance(answer.error, TlsError)
            alert = answer.message.upper()
            if fatal and ("ALERT_BAD_CERTIFICATE" in alert or "CERTIFICATE_REQUIRED" in alert):
                # The server's alert is about our certificate, not its own.
                given = "was refused" if self.settings.cert else "is required, and none was given"
                found = f"a TLS client certificate {given} ({answer.message})"
                fix = "pass cert=(certificate file, key file) signed by a CA the cluster trusts"
                text = self.clean(f"{answer.endpoint}: {found}; {fix}")
            verdict = Verdict.FATAL if fatal else Verdict.RETRY
            return RegisterOutcome(verdict, error=text, refused=not fatal and self.all_refused)
        if answer.member_trouble or answer.code == Grpc.EXHAUSTED or answer.status_code == 429:
            return RegisterOutcome(Verdict.RETRY, answer.status_code, f"{what}: {text}")
        code, message = answer.code, answer.message
        if code == Grpc.UNAUTHENTICATED or (code == Grpc.INVALID and "authentication" in message):
            hint = "check the etcd user and password"
        elif code == Grpc.PERMISSION:
            user, key = self.settings.username, clean(self.settings.key, 200)
            hint = f"etcd user {user!r} may not write {key!r}; grant its role readwrite on the key"
        elif code == Grpc.INVALID and "user name is empty" in message:
            hint = "etcd requires authentication: give a username and password"
        else:
            hint = "check the key, the value and the TTL"
        return RegisterOutcome(Verdict.FATAL, answer.status_code, f"{what}: {text}; {hint}")

    def check(self, payload: Mapping[str, Any]) -> RouteCheck | None:
        """Renew the lease, then read the key back."""
        if not self.lease:
            return RouteCheck(Route.MISSING, evidence="no lease yet")
        answer = self.call("/v3/lease/keepalive", {"ID": str(self.lease)})
        if answer.body is None:  # not lost until no renewal was acknowledged for the TTL
            since = time.monotonic() - self._renewed_at
            if since > self._granted_ttl:
                expired = f"over the lease TTL of {self._granted_ttl:g} s: the key has expired"
                text = f"no renewal acknowledged for {since:.1f} s, {expired} ({answer.failure})"
                return RouteCheck(Route.MISSING, answer.status_code, text)
            route = _unanswered(answer)
            refused = route is Route.UNREACHABLE and self.all_refused
            return RouteCheck(route, answer.status_code, answer.failure, refused=refused)
        ttl = int64(answer.body.get("TTL"))
        if ttl <= 0:
            text = f"lease {self.lease:x} has expired or was revoked"
            return RouteCheck(Route.MISSING, answer.status_code, text)
        self._granted_ttl = float(ttl)
        self._renewed_at = time.monotonic()
        answer = self.call("/v3/kv/range", {"key": b64(self._key)})
        if answer.body is None:
            return RouteCheck(_unanswered(answer), answer.status_code, answer.failure)
        check, self._watch.seen_revision = key_check(
            answer.body, answer.status_code, self._value, self.lease
        )
        return check

    def wait_idle(self, timeout: float, waker: Waker) -> bool:
        """Wait on the watch, the waker and the renewal schedule; True: news, or a renewal due."""
        end = time.monotonic() + max(0.0, timeout)
        # A little past the schedule the loop keeps (watch_interval): this only fires when the
        # registrar was given a longer watch interval than the TTL allows.
        renewal = self._fraction * self._granted_ttl * 1.1
        due = self._renewed_at + renewal if self.lease else math.inf
        while True:
            if waker.is_set():
                return False
            now = time.monotonic()
            if now >= due:
                return True
            if now >= end:
                return False
            changed = self._watch.wait(self._value, self.lease, waker, now, min(end, due) - now)
            if changed is not None:
                return changed

    def close(self) -> None:
        """Revoke the lease, so the key disappears now rather than a TTL later."""
        self.closing()
        self._watch.close()
        if self.lease:
            answer = self.call("/v3/lease/revoke", {"ID": str(self.lease)})
            if answer.ok or answer.code == Grpc.NOT_FOUND:
                logger.info("etcd: revoked lease %x; key %s removed", self.lease, self.settings.key)
            else:
                logger.warning(
                    "etcd: could not revoke lease %x (%s); the key expires within %g s",
                    self.lease,
                    answer.failure,
                    self._granted_ttl,
                )
            self.lease = 0
        super().close()


def _unanswered(answer: EtcdAnswer) -> Route:
    if answer.status_code is None or answer.member_trouble:
        return Route.UNREACHABLE
    return Route.UNDETERMINED


def key_check(
    body: Mapping[str, Any], status: int | None, value: bytes, lease: int
) -> tuple[RouteCheck, int]:
    """What a range answer says of our `value` under our `lease`, and the revision now known."""
    kvs = body.get("kvs")
    kv = kvs[0] if isinstance(kvs, list) and kvs and isinstance(kvs[0], Mapping) else None
    if kv is None:
        return RouteCheck(Route.MISSING, status, "the key is not there"), header_revision(body)
    # The answer's revision, not the key's own older one: the watch reports only later changes,
    # and keeps clear of history that compaction removed.
    seen = max(int64(kv.get("mod_revision")), header_revision(body))
    holder = int64(kv.get("lease"))
    ours = unb64(kv.get("value")) == value
    if ours and holder == lease:
        route, evidence = Route.PRESENT, f"lease {holder:x}"
    elif ours and holder:
        # A twin with our value: the key is right and will not outlive its holder; taking
        # it over would only make the twin take it back.
        route, evidence = Route.PRESENT, f"our value, held by another lease ({holder:x})"
    elif not holder:
        route, evidence = Route.MISSING, "the key was overwritten without a lease"
    elif holder == lease:
        route, evidence = Route.MISSING, "another value under our lease"
    else:
        # Another live registrant holds the key with its own value: fighting over it would
        # flip readers between the two; take it back only once its lease ends.
        route, evidence = Route.CONFLICT, f"the key holds another value under lease {holder:x}"
    return RouteCheck(route, status, evidence), seen
