"""What etcd's answers mean for the registration: the outcome of a grant or put that failed, and
the route check of a renewal or read that failed, or of the key as read.

Apart from the requests (`.transport` sends them), so that each rule reads on its own: retry
what one member or a passing state caused, stop on what only a person can fix (credentials,
permissions, a TLS certificate), and never call a key lost before its lease has surely run out."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from ...core.redact import clean
from ..httpconn import TlsError
from .answer import EtcdAnswer, Grpc, header_revision, int64, unb64
from .client import EtcdClient


def not_written(
    answer: EtcdAnswer, failures: list[str], what: str, client: EtcdClient, key: str
) -> RegisterOutcome:
    """The outcome of a `what` (grant or put) that failed: retried unless only a person can
    fix it; `key` is named in the hint about permissions."""
    text = client.failure_text(answer, failures)
    code = answer.code
    if answer.status_code is None:
        fatal = isinstance(answer.error, TlsError)
        alert = answer.message.upper()
        if fatal and ("ALERT_BAD_CERTIFICATE" in alert or "CERTIFICATE_REQUIRED" in alert):
            # The server's alert is about our certificate, not its own.
            given = "was refused" if client.cert else "is required, and none was given"
            text = client.clean(
                f"{answer.endpoint}: a TLS client certificate {given} ({answer.message}); "
                "pass cert=(certificate file, key file) signed by a CA the cluster trusts"
            )
        return RegisterOutcome(
            Verdict.FATAL if fatal else Verdict.RETRY,
            error=text,
            refused=not fatal and client.all_refused,
        )
    if answer.member_trouble or code == Grpc.EXHAUSTED or answer.status_code == 429:
        return RegisterOutcome(
            Verdict.RETRY, status_code=answer.status_code, error=f"{what}: {text}"
        )
    if code == Grpc.UNAUTHENTICATED or (
        code == Grpc.INVALID and "authentication" in answer.message
    ):
        hint = "check the etcd user and password"
    elif code == Grpc.PERMISSION:
        hint = (
            f"etcd user {client.username!r} may not write {clean(key, 200)!r}; "
            "grant its role readwrite on the key"
        )
    elif code == Grpc.INVALID and "user name is empty" in answer.message:
        hint = "etcd requires authentication: give a username and password"
    else:
        hint = "check the key, the value and the TTL"
    return RegisterOutcome(
        Verdict.FATAL, status_code=answer.status_code, error=f"{what}: {text}; {hint}"
    )


def not_renewed(
    answer: EtcdAnswer, text: str, since: float | None, granted_ttl: float, all_refused: bool
) -> RouteCheck:
    """No renewal (`since` seconds after the last one): not lost until the lease has surely
    run out."""
    if since is not None and since > granted_ttl:
        return RouteCheck(
            Route.MISSING,
            status_code=answer.status_code,
            evidence=(
                f"no renewal acknowledged for {since:.1f} s, over the lease TTL of "
                f"{granted_ttl:g} s: the key has expired ({text})"
            ),
        )
    route = Route.UNREACHABLE if answer.status_code is None else Route.UNDETERMINED
    if answer.member_trouble:
        route = Route.UNREACHABLE
    refused = route is Route.UNREACHABLE and all_refused
    return RouteCheck(route, status_code=answer.status_code, evidence=text, refused=refused)


def unread(answer: EtcdAnswer, text: str) -> RouteCheck:
    """The key could not be read: unreachable when no member answered, else undetermined."""
    route = (
        Route.UNREACHABLE
        if answer.status_code is None or answer.member_trouble
        else Route.UNDETERMINED
    )
    return RouteCheck(route, status_code=answer.status_code, evidence=text)


def key_check(
    body: Mapping[str, Any], status: int | None, value: bytes, lease: int
) -> tuple[RouteCheck, int]:
    """What a range answer says of our `value` under our `lease`, and the revision the
    registration now knows of (the watch reports only later changes)."""
    kvs = body.get("kvs")
    kv = kvs[0] if isinstance(kvs, list) and kvs and isinstance(kvs[0], Mapping) else None
    if kv is None:
        missing = RouteCheck(Route.MISSING, status_code=status, evidence="the key is not there")
        return missing, header_revision(body)
    # The key as of the answer's revision: later changes are what the watch must report
    # (watching from there, not from the key's own older revision, also keeps clear of
    # history that compaction removed).
    seen = max(int64(kv.get("mod_revision")), header_revision(body))
    holder = int64(kv.get("lease"))
    ours = unb64(kv.get("value")) == value
    if ours and holder == lease:
        return RouteCheck(Route.PRESENT, status_code=status, evidence=f"lease {holder:x}"), seen
    if ours and holder:
        # A twin with our value: the key is right and will not outlive its holder; taking
        # it over would only make the twin take it back.
        evidence = f"our value, held by another lease ({holder:x})"
        return RouteCheck(Route.PRESENT, status_code=status, evidence=evidence), seen
    if not holder:
        evidence = "the key was overwritten without a lease"
        return RouteCheck(Route.MISSING, status_code=status, evidence=evidence), seen
    if holder == lease:
        evidence = "another value under our lease"
        return RouteCheck(Route.MISSING, status_code=status, evidence=evidence), seen
    # Another live registrant holds the key with its own value: fighting over it would
    # flip readers between the two; take it back only once its lease ends.
    evidence = f"the key holds another value under lease {holder:x}"
    return RouteCheck(Route.CONFLICT, status_code=status, evidence=evidence), seen
