"""The `registrar` command (docs/cli.md), and what its commands share: the exit statuses,
one-line usage errors, logging, signals, and writing an answer to a reader that may have gone."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from ...core._errors import ConfigError, describe_exception
from ...core._machine import mermaid_diagram
from ...core._settings import EXIT_CODE

__all__ = ["main"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NOT_REGISTERED = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 4
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
EXIT_STATUSES = {
    EXIT_OK: "success (register: stopped cleanly on SIGTERM/SIGINT; status: registered)",
    EXIT_NOT_REGISTERED: "status: the agent is not registered; doctor: a check failed",
    EXIT_USAGE: "usage error: a bad flag, variable or payload, or a port in use",
    EXIT_CODE: "register --on-failure exit: the startup budget was spent",
    EXIT_UNREACHABLE: "status: the agent cannot be reached, or is not a registrar",
    EXIT_INTERRUPTED: "interrupted a second time while stopping",
    EXIT_BROKEN_PIPE: "the reader of the output went away (128 + SIGPIPE); "
    "status still answers 0, 1 or 4",
}

DEMO_DURATION = "about 15 s"
"""How long `registrar demo` takes (README.md says the same; a test checks both)."""


def exit_text(statuses: dict[int, str]) -> str:
    return "exit status:\n" + "\n".join(f"  {code:<4} {text}" for code, text in statuses.items())


class UsageError(Exception):
    """Bad input on the command line: reported in one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block), and help texts that keep their breaks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def log_setup(verbose: bool, quiet: Sequence[str] = ()) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    )
    # The command says where it listens in its own one startup line: the INFO lines of the
    # servers it starts would repeat it (their DEBUG lines, with -v, still show).
    handler.addFilter(lambda record: not (record.name in quiet and record.levelno == logging.INFO))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


class Signals:
    """SIGTERM/SIGINT: the first asks for a clean stop; another ends the process at once."""

    def __init__(self, exit: Callable[[int], None] = os._exit) -> None:
        self.done = threading.Event()
        self._exit = exit

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.done.is_set():
            print("registrar: interrupted again, exiting now", file=sys.stderr, flush=True)
            self._exit(EXIT_INTERRUPTED)
        self.done.set()

    def install(self) -> Signals:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)
        return self

    def wait(self) -> None:
        while not self.done.wait(0.5):
            pass


def answer(lines: list[str], outcome: int) -> int:
    """Write the answer; a reader that closed early (`registrar status | head -c 400`) cuts
    the output, not the answer: the exit status still says what was found."""
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()
    return outcome


def stdout_to_devnull() -> None:
    """Python's recipe for a reader gone (SIGPIPE, docs of the `signal` module): point stdout
    at devnull, so the interpreter's last flush at exit cannot fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


_MODULES = {"register": "_register", "status": "_status", "doctor": "_doctor", "sglang": "_doctor"}
"""The module of each command not defined here, imported only when it runs (the register
command never loads the status reader's HTTP client, nor the devtools)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    from ._parser import build_parser  # noqa: PLC0415 - it imports what this module defines

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
        # `registrar diagram | head -1`: no traceback, and a shell's status for a SIGPIPE.
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
