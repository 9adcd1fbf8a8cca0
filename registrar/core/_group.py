"""Several registrars that stand for one service: one registration per registry (an HA pair of
gateways, a mesh), each with its own thread, state and status, started and stopped together."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator

from ._board import State, Status
from ._errors import ConfigError
from ._registrar import Registrar


class RegistrarGroup:
    """One service's registrars: `stop()` drains them all at once (a gateway's DELETE and wait)."""

    def __init__(self, registrars: Iterable[Registrar], *, stop_timeout: float = 5.0) -> None:
        self._members = tuple(registrars)
        self.stop_timeout = float(stop_timeout)  # stop()'s default: long enough for the drains
        if not self._members or not all(isinstance(r, Registrar) for r in self._members):
            raise ConfigError("a RegistrarGroup needs one or more Registrar objects")
        urls = [r.status().url for r in self._members]
        if len(set(urls)) != len(urls):
            raise ConfigError("a RegistrarGroup registers once per registry: a URL is repeated")

    def members(self) -> tuple[Registrar, ...]:
        return self._members

    def __iter__(self) -> Iterator[Registrar]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    def statuses(self) -> tuple[Status, ...]:
        return tuple(r.status() for r in self._members)

    @property
    def running(self) -> bool:
        return any(r.running for r in self._members)

    def start(self) -> RegistrarGroup:
        for registrar in self._members:
            registrar.start()
        return self

    def stop(self, timeout: float | None = None) -> bool:
        """Ask every member to stop at once, then wait for them within `timeout` seconds in
        all (default: `stop_timeout`); whether every thread has ended."""
        deadline = time.monotonic() + max(0.0, self.stop_timeout if timeout is None else timeout)
        for registrar in self._members:
            registrar.stop(timeout=0)
        return all([r.stop(timeout=max(0.0, deadline - time.monotonic())) for r in self._members])

    def wait_for(self, state: State, timeout: float | None = None) -> bool:
        """Block until every member is in `state`; False if `timeout` seconds pass first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return all(
            r.wait_for(state, None if deadline is None else max(0.0, deadline - time.monotonic()))
            for r in self._members
        )

    def __enter__(self) -> RegistrarGroup:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
