"""registrar: register a service with a bootstrap server and keep it registered.

Start it in the background, never block on it, and ask it where it stands::

    reg = Registrar("http://127.0.0.1:8998", payload).start()
    reg.status().to_dict()
"""

from __future__ import annotations

__version__ = "0.1.0"

from .backoff import Backoff
from .clock import Clock, SystemClock
from .errors import ConfigError, RegistrarError, StateError, root_cause
from .machine import TRANSITIONS, State, Trigger, mermaid_diagram
from .outcome import RegisterOutcome, Route, RouteCheck, Verdict
from .registrar import (
    DEFAULT_BACKOFF,
    EXIT_CODE,
    Listener,
    OnFailure,
    Registrar,
    RequestEvent,
    RequestListener,
)
from .sglang import SGLangTransport, make_payload, rank_of, validate_payload
from .status import Status
from .transport import HttpTransport, Transport

__all__ = [
    "DEFAULT_BACKOFF",
    "EXIT_CODE",
    "TRANSITIONS",
    "Backoff",
    "Clock",
    "ConfigError",
    "HttpTransport",
    "Listener",
    "OnFailure",
    "RegisterOutcome",
    "Registrar",
    "RegistrarError",
    "RequestEvent",
    "RequestListener",
    "Route",
    "RouteCheck",
    "SGLangTransport",
    "State",
    "StateError",
    "Status",
    "SystemClock",
    "Transport",
    "Trigger",
    "Verdict",
    "__version__",
    "make_payload",
    "mermaid_diagram",
    "rank_of",
    "root_cause",
    "validate_payload",
]
