"""Host names resolved inside a request's deadline (`getaddrinfo` cannot be interrupted, so it
runs on a worker thread, one in flight per name), and the last good address kept while the
resolver fails or stalls: docs/reliability.md, "A resolver that stalls, fails or moves"."""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core._errors import describe_exception
from ..core._redact import clean
from ._deadline import Watchdog

logger = logging.getLogger("registrar")

FRESH = 0.5  # seconds an answer (or a failure) is reused: a fleet asks twice a second at most
STALE_WAIT = 0.5  # with a last good answer, how long to wait for a lookup in flight first
STALLED_AFTER = 1.0  # a lookup in flight longer shows in the status ("resolving NAME")
QUIET = 60.0  # after a warning about a name, its next outage is logged at DEBUG this long

Address = tuple[int, int, int, tuple[Any, ...]]  # family, type, protocol, socket address
Lookup = Callable[..., Sequence[tuple[Any, ...]]]  # `socket.getaddrinfo`'s (a fake in tests)
SocketOptions = Sequence[tuple[int, int, int | bytes]]  # `setsockopt` arguments


class Unresolved(OSError):
    """No address within the deadline, or none at all: retried like a failed connection."""


@dataclass(frozen=True)
class Resolved:
    addresses: tuple[Address, ...]
    stale: bool = False  # the last good answer, used because the resolver fails or stalls

    @property
    def hosts(self) -> frozenset[str]:
        return frozenset(str(address[3][0]) for address in self.addresses)


@dataclass
class _Pending:
    started: float
    waiters: set[threading.Event] = field(default_factory=set)


@dataclass
class _Name:
    good: tuple[Address, ...] | None = None  # the last good answer (port 0)
    asked_at: float | None = None  # when the last lookup ended
    error: str | None = None  # why the last lookup failed; None after an answer
    pending: _Pending | None = None
    stale_said: int = 0  # the level the stale answer was logged at in this outage (0: not)
    warned_at: float | None = None


def seconds(value: float) -> str:
    """A duration as messages show it: `1.0`, `0.25`, `12.0`."""
    text = f"{value:g}"
    return text if "." in text or "e" in text else f"{text}.0"


def is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@functools.lru_cache(maxsize=1024)
def _numeric(host: str, port: int) -> Resolved:
    """An IP literal's address, without a lookup (cached: a request to one asks every time)."""
    answer = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    return Resolved(tuple((f, t, p, tuple(a)) for f, t, p, _, a in answer))


def _shown(addresses: tuple[Address, ...]) -> str:
    return ", ".join(dict.fromkeys(str(a[3][0]) for a in addresses))


class Resolver:
    """The process's lookups, at most one in flight per name, and each name's last answer."""

    def __init__(
        self, lookup: Lookup | None = None, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._lookup = lookup  # None: `socket.getaddrinfo`, looked up at each call
        self._monotonic = monotonic
        self._reset()

    def _reset(self) -> None:
        """After a fork: a new lock, and no lookup in flight (the parent's workers are not here)."""
        self._lock = threading.Lock()
        names: dict[str, _Name] = getattr(self, "_names", {})
        for name in names.values():
            name.pending = None
        self._names = names

    def resolve(
        self, host: str, port: int, timeout: float, abandon: Watchdog | None = None
    ) -> Resolved:
        """The addresses of `host` within `timeout` (or before `abandon`'s request ends): the
        last good answer when the resolver fails or stalls, else `Unresolved`."""
        host = host.strip("[]")
        if is_ip_literal(host):
            return _numeric(host, port)
        now = self._monotonic()
        with self._lock:
            name = self._names.setdefault(host.rstrip(".").lower(), _Name())
            if name.asked_at is not None and now - name.asked_at < FRESH and name.pending is None:
                return self._known(name, host, port, timeout)
            pending = name.pending or self._start(name, host, now)
            wait = timeout
            if name.good is not None:
                wait = min(timeout, max(0.0, STALE_WAIT - (now - pending.started)))
            wake = threading.Event()
            pending.waiters.add(wake)
        if abandon is not None:
            abandon.track(wake)  # set at once if that request has ended
        try:
            wake.wait(wait)
        finally:
            if abandon is not None:
                abandon.untrack(wake)
            with self._lock:
                pending.waiters.discard(wake)
        with self._lock:
            return self._known(name, host, port, timeout, pending)

    def _known(
        self, name: _Name, host: str, port: int, timeout: float, pending: _Pending | None = None
    ) -> Resolved:
        """What the caller gets from what is known now (the lock held)."""
        in_flight = pending is not None and name.pending is pending  # else its lookup ended
        if name.good is not None:
            stale = in_flight or name.error is not None
            started = pending.started if pending is not None else 0.0
            # Said once a lookup fails, or stalls (not while it is merely slow).
            if stale and (not in_flight or self._monotonic() - started >= STALLED_AFTER):
                self._say_stale(name, host, "no answer" if in_flight else name.error)
            found = tuple((f, t, p, (a[0], port, *a[2:])) for f, t, p, a in name.good)
            return Resolved(found, stale=stale)
        why = f" within {seconds(timeout)} s" if in_flight else f": {name.error}"
        raise Unresolved(f"could not resolve {clean(host, 200)}{why}")

    def _say_stale(self, name: _Name, host: str, why: str | None) -> None:
        """Log once per outage (a minute apart at most) that the last good answer is in use."""
        if name.stale_said:
            return
        now = self._monotonic()
        quiet = name.warned_at is not None and now - name.warned_at < QUIET
        if not quiet:
            name.warned_at = now
        name.stale_said = logging.DEBUG if quiet else logging.WARNING
        assert name.good is not None
        logger.log(
            name.stale_said,
            "%s did not resolve (%s); using its last good address %s until the resolver "
            "answers again",
            clean(host, 200),
            why,
            _shown(name.good),
        )

    def _start(self, name: _Name, host: str, now: float) -> _Pending:
        pending = name.pending = _Pending(now)
        threading.Thread(
            target=self._run, args=(name, pending, host), name="registrar-resolve", daemon=True
        ).start()
        return pending

    def _run(self, name: _Name, pending: _Pending, host: str) -> None:
        """The lookup, on its own thread: nobody waits for it past their deadline."""
        error: str | None = None
        found: tuple[Address, ...] = ()
        try:
            answer = (self._lookup or socket.getaddrinfo)(host, None, 0, socket.SOCK_STREAM)
            found = tuple((f, t, p, tuple(a)) for f, t, p, _, a in answer)
            if not found:
                error = "no address"
        except (OSError, UnicodeError) as exc:
            error = describe_exception(exc)
        except Exception as exc:  # a lookup must never kill its waiters' requests
            error = f"{type(exc).__name__}: {describe_exception(exc)}"
        with self._lock:
            self._settle(name, host, found, error)
            if name.pending is pending:
                name.pending = None
            for wake in pending.waiters:
                wake.set()

    def _settle(
        self, name: _Name, host: str, found: tuple[Address, ...], error: str | None
    ) -> None:
        """Keep what the lookup found (the lock held), and log what changed."""
        name.asked_at = self._monotonic()
        name.error = error
        if error is not None:
            return
        if name.good is not None and {a[3][0] for a in found} != {a[3][0] for a in name.good}:
            was = _shown(name.good)
            logger.warning("%s now resolves to %s (was %s)", clean(host, 200), _shown(found), was)
        elif name.stale_said:
            level = logging.INFO if name.stale_said == logging.WARNING else logging.DEBUG
            logger.log(level, "%s resolves again: %s", clean(host, 200), _shown(found))
        name.stale_said = 0
        name.good = found

    def describe(self, host: str) -> str | None:
        """For the status: a lookup stalled ("resolving NAME"), or the last good address in use."""
        with self._lock:
            name = self._names.get(host.strip("[]").rstrip(".").lower())
            if name is None:
                return None
            good = f"; using its last good address {_shown(name.good)}" if name.good else ""
            if name.pending is not None:
                age = self._monotonic() - name.pending.started
                if age >= STALLED_AFTER:
                    return f"resolving {clean(host, 200)} (no answer for {age:.0f} s){good}"
            if name.error is not None and name.good is not None:
                return f"{clean(host, 200)} did not resolve ({name.error}){good}"
        return None


RESOLVER = Resolver()  # the process's: every transport's lookups go through it
os.register_at_fork(after_in_child=RESOLVER._reset)


def connect(
    resolved: Resolved,
    timeout: float | None,
    prefer: str | None = None,
    options: SocketOptions = (),
) -> socket.socket:
    """A socket connected to one of `resolved`'s addresses, tried in turn (`prefer`, the address
    in use, first), each within `timeout`; else the last error."""
    error: OSError = OSError("no address to connect to")
    for family, kind, proto, address in sorted(resolved.addresses, key=lambda a: a[3][0] != prefer):
        sock = socket.socket(family, kind, proto)
        try:
            for option in options:
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error
