"""The `registrar` command (docs/cli.md). Bad input gets one line on stderr, never a usage
block, and a distinct exit status (see `EXIT_STATUSES`). This module dispatches and holds the
development commands."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Callable, Sequence

from ...core._errors import ConfigError, describe_exception
from ...core._machine import mermaid_diagram
from ._common import (
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    Signals,
    UsageError,
    log_setup,
    stdout_to_devnull,
)
from ._parser import build_parser

__all__ = ["main"]

logger = logging.getLogger(__name__)

_MODULES = {"register": "_register", "status": "_status", "doctor": "_doctor", "sglang": "_doctor"}
"""The module of each command not defined here, imported only when it runs (the register
command never loads the status reader's HTTP client, nor the devtools)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    args = build_parser().parse_args(argv)
    try:
        module = importlib.import_module(f".{_MODULES.get(args.command, '')}", __name__)
        command: Callable[[argparse.Namespace], int] = getattr(module, f"cmd_{args.command}")
        code = command(args)
        sys.stdout.flush()
    except (UsageError, ConfigError) as exc:
        print(f"registrar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of the output went away (`registrar diagram | head -1`): no traceback;
        # the status a shell reports for a writer ended by SIGPIPE.
        stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    return code


def cmd_bootstrap(args: argparse.Namespace) -> int:
    from ...devtools.bootstrap_server import BootstrapServer  # noqa: PLC0415 - this command only

    # -v: the server logs each request (method, path, status) at DEBUG.
    log_setup(args.verbose, quiet=("registrar.devtools.bootstrap_server",))
    server = BootstrapServer(
        args.host, args.port, token=args.token, max_body_bytes=args.max_body_bytes
    )
    signals = Signals().install()  # before it answers: a SIGTERM from then on stops it cleanly
    try:
        server.start()
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {describe_exception(exc)}"
        ) from None
    logger.info("reference bootstrap server on %s (development and test tool)", server.url)
    try:
        signals.wait()
    finally:
        server.close()
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    from ...devtools._demo import run_demo  # noqa: PLC0415 - only the demo needs it

    return run_demo(sys.stdout)


def cmd_diagram(args: argparse.Namespace) -> int:
    sys.stdout.write(mermaid_diagram())
    return EXIT_OK
