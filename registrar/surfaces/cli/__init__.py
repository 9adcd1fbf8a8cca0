"""The `registrar` command: a sidecar agent, a status reader, the diagram, the reference
bootstrap server, and the demo.

Every option of `registrar register` can also come from a `REGISTRAR_*` variable (the options
table, `registrar/surfaces/options.py`; the flag wins). Bad input gets one line on stderr, never
a usage block, and a distinct exit status (see `EXIT_STATUSES`).

The parser is in `parser`, each command in its own module (`register`, `status`, `dev`); this
module dispatches, and keeps the names users import (`registrar.surfaces.cli:main`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from ...core.errors import ConfigError
from .common import (
    DEMO_DURATION,
    EXIT_BROKEN_PIPE,
    EXIT_INTERRUPTED,
    EXIT_NOT_REGISTERED,
    EXIT_OK,
    EXIT_STATUSES,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    stdout_to_devnull,
)
from .parser import build_parser as _parser

__all__ = [
    "DEMO_DURATION",
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_REGISTERED",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    args = _parser().parse_args(argv)
    try:
        code = _dispatch(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of the output went away (`registrar diagram | head -1`): no traceback;
        # the status a shell reports for a writer ended by SIGPIPE.
        stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    return code


def _command(name: str) -> Callable[[argparse.Namespace], int]:
    """The command's function, its module imported only when it runs (the register command
    never loads the status reader's HTTP client, nor the devtools)."""
    if name == "register":
        from .register import cmd_register  # noqa: PLC0415

        return cmd_register
    if name == "status":
        from .status import cmd_status  # noqa: PLC0415

        return cmd_status
    if name == "sglang":
        from .sglang import cmd_sglang  # noqa: PLC0415

        return cmd_sglang
    from . import dev  # noqa: PLC0415

    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "diagram": dev.cmd_diagram,
        "bootstrap": dev.cmd_bootstrap,
    }
    return commands.get(name, dev.cmd_demo)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return _command(args.command)(args)
    except (UsageError, ConfigError) as exc:
        print(f"registrar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
