"""Protocol names and the factories that build their transports.

`Registrar(url, payload, protocol="sglang")` resolves the name here, so the loop never imports a
protocol. A name is found, in this order: registered at run time (`register_protocol`), declared
in the `registrar.protocols` entry-point group by any installed distribution
(`[project.entry-points."registrar.protocols"] myproto = "mypkg.module:factory"`), or one of the
built-in ones (named here by module path, imported only when chosen). Nothing registers itself
by being imported.
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from .errors import ConfigError
from .transport import Timeout, Token, Transport

__all__ = [
    "ENTRY_POINT_GROUP",
    "ProtocolFactory",
    "TransportOptions",
    "make_transport",
    "protocol_names",
    "register_protocol",
]


@dataclass(frozen=True)
class TransportOptions:
    """What every built-in protocol is configured with, already validated by the registrar."""

    url: str
    token: Token | None = None
    timeout: Timeout = 5.0
    verify: bool | str = True
    """True (system CAs), False, or the path of a CA bundle."""


ProtocolFactory = Callable[[Mapping[str, Any], TransportOptions], tuple[Transport, dict[str, Any]]]
"""Builds a transport and returns it with the payload it will send (validated and normalised by
the protocol; raise `ConfigError` naming the field for a payload the protocol cannot use)."""

ENTRY_POINT_GROUP = "registrar.protocols"
_BUILTIN = {
    "sglang": "registrar.protocols:sglang_protocol",
    "http": "registrar.protocols:http_protocol",
    "smg": "registrar.protocols:smg_protocol",
}
"""The built-in protocols, by the factory's import path (also declared as entry points)."""

logger = logging.getLogger(__name__)
_factories: dict[str, ProtocolFactory] = {}
_lock = threading.Lock()


def _declared() -> dict[str, str]:
    """Every protocol name known without importing it: the built-in ones, then the entry-point
    group's (an installed distribution may add or replace one)."""
    found = dict(_BUILTIN)
    for point in entry_points(group=ENTRY_POINT_GROUP):
        found[point.name] = point.value
    return found


def _load(name: str, target: str) -> ProtocolFactory:
    module, _, attribute = target.partition(":")
    try:
        factory: ProtocolFactory = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"protocol {name!r} cannot be loaded from {target!r}: {exc}") from None
    if not callable(factory):
        raise ConfigError(f"protocol {name!r} at {target!r} is not callable")
    return factory


def register_protocol(name: str, factory: ProtocolFactory) -> None:
    """Make `protocol=name` available; registering a name again replaces its factory."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"protocol name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ConfigError(f"protocol factory for {name!r} must be callable, got {factory!r}")
    with _lock:
        _factories[name] = factory


def protocol_names() -> tuple[str, ...]:
    """Every protocol name that can be chosen, sorted."""
    with _lock:
        registered = set(_factories)
    return tuple(sorted(registered | set(_declared())))


def make_transport(
    name: object, payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    """The transport for protocol `name` and the payload it will send, or `ConfigError`."""
    with _lock:
        factory = _factories.get(name) if isinstance(name, str) else None
    if factory is None:
        declared = _declared()
        target = declared.get(name) if isinstance(name, str) else None
        if target is None:
            known = ", ".join(repr(n) for n in protocol_names())
            raise ConfigError(f"protocol must be one of {known}, got {name!r}")
        assert isinstance(name, str)
        factory = _load(name, target)
    return factory(payload, options)
