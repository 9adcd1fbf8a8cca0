"""Protocol names and the factories that build their transports.

`Registrar(url, payload, protocol="sglang")` resolves the name here, so the core never imports a
protocol: `registrar.protocols` registers the built-in ones when the package is imported, and a
third-party protocol registers itself the same way (or is passed as `transport=`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .transport import Timeout, Token, Transport

__all__ = [
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

_factories: dict[str, ProtocolFactory] = {}
_lock = threading.Lock()


def register_protocol(name: str, factory: ProtocolFactory) -> None:
    """Make `protocol=name` available; registering a name again replaces its factory."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"protocol name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ConfigError(f"protocol factory for {name!r} must be callable, got {factory!r}")
    with _lock:
        _factories[name] = factory


def protocol_names() -> tuple[str, ...]:
    """The registered protocol names, sorted."""
    with _lock:
        return tuple(sorted(_factories))


def make_transport(
    name: object, payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    """The transport for protocol `name` and the payload it will send, or `ConfigError`."""
    with _lock:
        factory = _factories.get(name) if isinstance(name, str) else None
        known = ", ".join(repr(n) for n in sorted(_factories))
    if factory is None:
        raise ConfigError(f"protocol must be one of {known}, got {name!r}")
    return factory(payload, options)
