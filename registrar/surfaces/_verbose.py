"""Verbose logging (`registrar register -v`, `REGISTRAR_VERBOSE=1` in the SGLang plugin): one
DEBUG line per request with its result, status and time, the same from every surface."""

from __future__ import annotations

import logging

from ..core._board import RequestEvent
from ..core._registrar import Registrar

logger = logging.getLogger("registrar.surfaces.verbose")


def log_request(event: RequestEvent) -> None:
    """A request listener: `registration: accepted (200) in 10.0 ms`."""
    code = event.status_code if event.status_code is not None else "no answer"
    what = "registration" if event.kind == "register" else "route check"
    logger.debug("%s: %s (%s) in %.1f ms", what, event.result, code, event.duration * 1000)


def make_verbose(registrar: Registrar) -> None:
    """Log each of `registrar`'s requests, whatever the root's level (its handlers still decide)."""
    logging.getLogger("registrar").setLevel(logging.DEBUG)
    registrar.add_request_listener(log_request)
