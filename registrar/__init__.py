"""registrar: register a service with a bootstrap server and keep it registered.

Start it in the background, never block on it, and ask it where it stands::

    reg = Registrar("http://127.0.0.1:8998", payload).start()
    reg.status().to_dict()
"""

from __future__ import annotations

from ._version import __version__
from .assembly import etcd_registrar, smg_registrar, smg_registrars
from .core.aio import in_loop
from .core.backoff import Backoff
from .core.errors import ConfigError, RegistrarError, StateError
from .core.group import RegistrarGroup
from .core.machine import State
from .core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from .core.registrar import Registrar
from .core.registry import register_protocol
from .core.settings import HttpSettings
from .core.status import Status
from .core.transport import Transport
from .protocols.http import HttpTransport
from .protocols.sglang import make_payload

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
