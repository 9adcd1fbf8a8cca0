"""The development commands: `registrar bootstrap` (the reference server), `registrar demo`
and `registrar diagram`. The devtools are imported inside the commands that need them, so a
production `registrar register` never loads the reference server."""

from __future__ import annotations

import argparse
import logging
import sys

from ...core.errors import describe_exception
from ...core.machine import mermaid_diagram
from .common import EXIT_OK, Signals, UsageError, log_setup

logger = logging.getLogger(__name__)


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from ...devtools.bootstrap_server import BootstrapServer  # noqa: PLC0415 - this command only

    # -v: the server logs each request (method, path, status) at DEBUG.
    log_setup(args.verbose, quiet=("registrar.devtools.bootstrap_server",))
    server = BootstrapServer(
        args.host, args.port, token=args.token, max_body_bytes=args.max_body_bytes
    )
    try:
        server.start()
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {describe_exception(exc)}"
        ) from None
    logger.info("reference bootstrap server on %s (development and test tool)", server.url)
    signals = Signals().install()
    try:
        signals.wait()
    finally:
        server.close()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from ...devtools.demo import run_demo  # noqa: PLC0415 - only the demo needs it

    return run_demo(sys.stdout)


def cmd_diagram(args: argparse.Namespace) -> int:
    sys.stdout.write(mermaid_diagram())
    return EXIT_OK
