"""registrar: register a service with a bootstrap server and keep it registered, in the
background, never blocking on it (`Registrar(url, payload).start()`; docs/index.md)."""

from __future__ import annotations

from ._assembly import etcd_registrar, smg_registrar, smg_registrars
from ._version import __version__
from .core._backoff import Backoff
from .core._board import State, Status
from .core._errors import ConfigError, RegistrarError, StateError
from .core._group import RegistrarGroup
from .core._registrar import Registrar, in_loop
from .core._registry import register_protocol
from .core._settings import HttpSettings
from .core._transport import RegisterOutcome, Route, RouteCheck, Transport, Verdict
from .protocols._http import HttpTransport
from .protocols._sglang import make_payload

__all__ = [
    "Backoff",
    "ConfigError",
    "HttpSettings",
    "HttpTransport",
    "RegisterOutcome",
    "Registrar",
    "RegistrarError",
    "RegistrarGroup",
    "Route",
    "RouteCheck",
    "State",
    "StateError",
    "Status",
    "Transport",
    "Verdict",
    "__version__",
    "etcd_registrar",
    "in_loop",
    "make_payload",
    "register_protocol",
    "smg_registrar",
    "smg_registrars",
]
