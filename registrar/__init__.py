"""registrar: register a service with a bootstrap server and keep it registered.

Start it in the background, never block on it, and ask it where it stands::

    reg = Registrar("http://127.0.0.1:8998", payload).start()
    reg.status().to_dict()
"""

from __future__ import annotations

from ._version import __version__
from .assembly import (
    etcd_registrar,
    etcd_registrar_from,
    smg_registrar,
    smg_registrars,
    smg_registrars_from,
)
from .core.aio import in_loop
from .core.backoff import Backoff
from .core.clock import Clock, SystemClock
from .core.errors import ConfigError, RegistrarError, StateError, root_cause
from .core.group import RegistrarGroup
from .core.machine import TRANSITIONS, State, Trigger, mermaid_diagram
from .core.outcome import RegisterOutcome, Route, RouteCheck, Verdict
from .core.registrar import (
    DEFAULT_BACKOFF,
    EXIT_CODE,
    Listener,
    OnFailure,
    Registrar,
    RequestEvent,
    RequestListener,
)
from .core.registry import TransportOptions, protocol_names, register_protocol
from .core.settings import Hooks, HttpSettings, LoopSettings
from .core.status import Status
from .core.transport import IdleWatcher, Transport
from .core.waker import Waker
from .moved import install as _install_moved
from .protocols.etcd import EtcdTransport
from .protocols.etcd.settings import EtcdSettings
from .protocols.http import HttpTransport
from .protocols.sglang import SGLangTransport, make_payload, rank_of, validate_payload
from .protocols.smg import SmgTransport
from .protocols.smg.settings import SmgSettings

__all__ = [
    "DEFAULT_BACKOFF",
    "EXIT_CODE",
    "TRANSITIONS",
    "Backoff",
    "Clock",
    "ConfigError",
    "EtcdSettings",
    "EtcdTransport",
    "Hooks",
    "HttpSettings",
    "HttpTransport",
    "IdleWatcher",
    "Listener",
    "LoopSettings",
    "OnFailure",
    "RegisterOutcome",
    "Registrar",
    "RegistrarError",
    "RegistrarGroup",
    "RequestEvent",
    "RequestListener",
    "Route",
    "RouteCheck",
    "SGLangTransport",
    "SmgSettings",
    "SmgTransport",
    "State",
    "StateError",
    "Status",
    "SystemClock",
    "Transport",
    "TransportOptions",
    "Trigger",
    "Verdict",
    "Waker",
    "__version__",
    "etcd_registrar",
    "etcd_registrar_from",
    "in_loop",
    "make_payload",
    "mermaid_diagram",
    "protocol_names",
    "rank_of",
    "register_protocol",
    "root_cause",
    "smg_registrar",
    "smg_registrars",
    "smg_registrars_from",
    "validate_payload",
]

_install_moved()  # the 0.1.0 import paths, deprecated (registrar/moved.py)
