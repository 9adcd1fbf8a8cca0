"""Protocols by name, each a factory of its transport: registered at run time (`register_protocol`),
declared in the `registrar.protocols` entry-point group, or built in (imported only when chosen).
None registers itself by being imported (docs/architecture.md, "Adding a protocol in one file")."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass
from importlib.metadata import entry_points
from typing import Any

from ._errors import ConfigError
from ._settings import HttpSettings
from ._transport import Transport

Build = Callable[[Mapping[str, Any], Any], tuple[Transport, dict[str, Any]]]
"""`build(payload, settings)`: the transport and the payload it will send, as the protocol
normalised it (`ConfigError` naming the field for a payload it cannot use)."""


@dataclass(frozen=True)
class ProtocolFactory:
    """A protocol: the function building its transport from its settings class (the registrar's
    URL as its first field, and the options that are its fields)."""

    build: Build
    settings: type = HttpSettings


ENTRY_POINT_GROUP = "registrar.protocols"
_BUILTIN = {
    name: f"registrar.protocols:{name}_protocol" for name in ("sglang", "http", "etcd", "smg")
}
"""The built-in protocols, by the factory's import path (also declared as entry points)."""

_factories: dict[str, ProtocolFactory] = {}
_lock = threading.Lock()


def _declared() -> dict[str, str]:
    """The protocol names known without importing them; an entry point may add or replace one."""
    return _BUILTIN | {point.name: point.value for point in entry_points(group=ENTRY_POINT_GROUP)}


def register_protocol(name: str, build: Build, settings: type = HttpSettings) -> None:
    """Make `protocol=name` available (see `ProtocolFactory`), replacing one of that name."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"protocol name must be a non-empty string, got {name!r}")
    if not callable(build):
        raise ConfigError(f"protocol factory for {name!r} must be callable, got {build!r}")
    if not is_dataclass(settings):
        raise ConfigError(f"protocol settings for {name!r} must be a dataclass, got {settings!r}")
    with _lock:
        _factories[name] = ProtocolFactory(build, settings)


def protocol_names() -> tuple[str, ...]:
    with _lock:
        registered = set(_factories)
    return tuple(sorted(registered | set(_declared())))


def protocol_factory(name: object) -> ProtocolFactory:
    """The factory of protocol `name`, or `ConfigError` listing the known names."""
    with _lock:
        factory = _factories.get(name) if isinstance(name, str) else None
    if factory is not None:
        return factory
    target = _declared().get(name) if isinstance(name, str) else None
    if target is None:
        known = ", ".join(repr(n) for n in protocol_names())
        raise ConfigError(f"protocol must be one of {known}, got {name!r}")
    # A `ProtocolFactory` there, or a plain `build` function (its settings `HttpSettings`).
    module, _, attribute = target.partition(":")
    try:
        found = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"protocol {name!r} cannot be loaded from {target!r}: {exc}") from None
    if isinstance(found, ProtocolFactory):
        return found
    if not callable(found):
        raise ConfigError(f"protocol {name!r} at {target!r} is not callable")
    return ProtocolFactory(found)
