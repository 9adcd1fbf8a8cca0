"""The `registrar` command (docs/cli.md): its command line (the `register` flags drawn from the
options table, each parsed and checked as its variable is) and what its commands share: the exit
statuses, one-line usage errors, logging, signals, writing to a reader that may have gone."""

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

from ..._version import __version__
from ...core import _rules as rules
from ...core._board import mermaid_diagram
from ...core._errors import ConfigError, describe_exception
from ...core._settings import EXIT_CODE
from .._options import ENV_PREFIX, METAVARS, OPTIONS, Option, parse_flag, parse_port

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


_REGISTER_EXITS = exit_text(
    {
        EXIT_OK: "stopped cleanly on SIGTERM/SIGINT",
        EXIT_USAGE: EXIT_STATUSES[EXIT_USAGE],
        EXIT_CODE: "--on-failure exit: the startup budget was spent",
        EXIT_INTERRUPTED: EXIT_STATUSES[EXIT_INTERRUPTED],
    }
)
_STATUS_EXITS = exit_text(
    {
        EXIT_OK: "the agent is registered",
        EXIT_NOT_REGISTERED: "the agent answered, and is not registered",
        EXIT_USAGE: "usage error: a bad flag or URL",
        EXIT_UNREACHABLE: "the agent cannot be reached, or is not a registrar",
    }
)

EXAMPLES_REGISTER = """\
examples:
  registrar register --url http://127.0.0.1:8998 --payload @rank0.json --health-port 8081
  registrar register --url http://127.0.0.1:8998 --payload @rank0.json --rank-ip-env POD_IP \\
      --token-file /var/run/secrets/bootstrap/token --on-failure exit --max-elapsed 120
  REGISTRAR_URL=http://bootstrap:8998 REGISTRAR_PAYLOAD=@/etc/rank0.json registrar register -v
  registrar register --etcd http://127.0.0.1:2379 --key /services/prefill/rank0 --ttl 10 \\
      --payload @rank0.json    # etcd instead of a bootstrap server: docs/etcd.md
  registrar register --gateway http://127.0.0.1:30000 --worker-url http://10.0.0.5:30001 \\
      --worker-type prefill --bootstrap-port 8998 --ready-url http://127.0.0.1:30001/ready \\
      --gateway-key-file /var/run/secrets/smg/key   # SGLang's model gateway: docs/gateway.md
"""

EXAMPLES_MAIN = """\
examples:
  registrar demo                                  # the whole story in {duration}, on 127.0.0.1
  registrar bootstrap --port 8998                 # a reference bootstrap server (dev/test)
  registrar register --url http://127.0.0.1:8998 --payload @rank0.json --health-port 8081
  registrar status --health-url http://127.0.0.1:8081
  registrar doctor --url http://127.0.0.1:8998 --expect 2   # is the deployment right?
  registrar diagram > state.mmd
"""


def _typed(
    parse: Callable[[str], Any], expected: str | None = None, good: str = ""
) -> Callable[[str], Any]:
    """An argparse `type`: `parse`; its error (or `expected`), the text given, then `good`."""

    def typed(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            if expected is None and getattr(exc, "secret", False):  # a token: never shown
                message = str(exc)
            elif expected is None and getattr(exc, "shown", None) is not None:
                message = f"{text!r} {exc}"
            else:
                message = f"{expected or exc}, got {text!r}"
            raise argparse.ArgumentTypeError(message + good) from None

    return typed


_count = _typed(lambda text: rules.count(int(text)), "must be a positive integer")
_seconds = _typed(lambda text: rules.seconds(float(text)), "must be a positive number of seconds")
_port = _typed(parse_port)


def _add_option(group: Any, option: Option) -> None:
    """`option`'s flag: the same parser (and rule) as its variable, the settings' default."""
    names = [option.flag_name] + (["-v"] if option.name == "VERBOSE" else [])
    default = option.default_text()
    help = f"{option.help} (default: {default})" if default else option.help
    kwargs: dict[str, Any] = {"dest": option.key, "help": help}
    if option.parse is parse_flag:  # on/off: --name and --no-name
        kwargs["action"] = argparse.BooleanOptionalAction
    else:
        good = f"; e.g. {option.flag_name} {option.example}"
        # A repeated flag's values are checked once joined.
        kwargs["type"] = _typed(option.parse if option.repeat else option.read, good=good)
        kwargs["metavar"] = option.metavar or METAVARS.get(option.parse, option.name.split("_")[-1])
        if option.repeat:
            kwargs["action"] = "append"
    group.add_argument(*names, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="registrar",
        description="Register a service with a bootstrap server and keep it registered.",
        epilog=f"{EXAMPLES_MAIN.format(duration=DEMO_DURATION)}\n{exit_text(EXIT_STATUSES)}\n",
    )
    parser.add_argument("--version", action="version", version=f"registrar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    variables = "\n".join(
        f"  {ENV_PREFIX + o.name:<28} {o.help}{'' if o.flag else '  [no flag]'}" for o in OPTIONS
    )
    reg = sub.add_parser(
        "register",
        help="run as a sidecar agent until SIGTERM/SIGINT",
        description="Register PAYLOAD with the bootstrap server at URL, keep it registered, "
        "and serve /livez /readyz /health (and /metrics with the extra) when --health-port "
        "is given. Stops cleanly with exit 0 on SIGTERM or SIGINT; a second one ends it at "
        "once. Every option can also be set by a REGISTRAR_* variable (below).",
        epilog=f"{EXAMPLES_REGISTER}\nenvironment (the flag wins; every option has a flag but "
        f"those marked):\n{variables}\n\n{_REGISTER_EXITS}\n",
        argument_default=argparse.SUPPRESS,  # unset flags stay unset: the environment may say
    )
    for option in OPTIONS:
        if option.flag:
            _add_option(reg, option)
    status = sub.add_parser(
        "status",
        help="read a running agent's /health",
        description="Print a running agent's health for a person, or as JSON. Exit 0 when "
        f"registered, {EXIT_NOT_REGISTERED} otherwise, {EXIT_UNREACHABLE} when the agent "
        f"cannot be reached, {EXIT_USAGE} on bad input.",
        epilog="examples:\n  registrar status --health-url http://127.0.0.1:8081\n"
        "  registrar status --health-url http://127.0.0.1:8081 --json | jq .status\n\n"
        f"{_STATUS_EXITS}\n",
    )
    status.add_argument("--health-url", required=True, help="the agent's health server URL")
    status.add_argument("--timeout", type=_seconds, default=5.0, metavar="S", help="(default: 5)")
    status.add_argument(
        "--json", action="store_true", help="print the agent's health+json document as it is"
    )
    doc = sub.add_parser(
        "doctor",
        help="check a deployment: bootstrap server, gateways, etcd",
        description="Check that each URL resolves, listens and speaks the protocol expected, "
        "how many rows the bootstrap server holds against the topology and which ranks are "
        "missing, and whether a gateway lists a worker twice or as unhealthy. Exit 0 only "
        f"when every check passed, {EXIT_NOT_REGISTERED} otherwise, {EXIT_USAGE} on bad input.",
        epilog="examples:\n  registrar doctor --url http://10.0.0.5:8998 --expect 8\n"
        "  registrar doctor --url http://10.0.0.5:8998 --http-port 30000 "
        "--gateway http://10.0.0.9:30000\n"
        "  registrar doctor --etcd http://10.0.0.7:2379 --json | jq .healthy\n",
    )
    doc.add_argument("--url", help="the bootstrap server's URL (SGLang's protocol)")
    doc.add_argument("--expect", type=_count, metavar="N", help="rows the topology should have")
    doc.add_argument(
        "--http-port", type=_port, metavar="PORT", help="the prefill's HTTP port (compared)"
    )
    doc.add_argument("--gateway", action="append", metavar="URL", help="an smg gateway (repeat)")
    doc.add_argument("--etcd", action="append", metavar="URL", help="an etcd endpoint (repeat)")
    doc.add_argument(
        "--gateway-key-file", metavar="FILE", help="the gateways' control-plane key, in a file"
    )
    doc.add_argument(
        "--sglang",
        action="store_true",
        help="this environment's SGLang: its release and what the plugin does there",
    )
    doc.add_argument("--timeout", type=_seconds, default=2.0, metavar="S", help="(default: 2)")
    doc.add_argument("--json", action="store_true", help="the report as JSON (docs/cli.md)")
    sub.add_parser(
        "diagram",
        help="print the state diagram (mermaid) from the transition table",
        description="Print the state diagram as mermaid text, drawn from the transition table.",
        epilog="examples:\n  registrar diagram > state.mmd\n"
        "  registrar diagram | mmdc -i - -o state.svg   # with mermaid-cli",
    )
    boot = sub.add_parser(
        "bootstrap",
        help="run the reference bootstrap server (development and tests only)",
        description="An in-memory bootstrap server with SGLang's HTTP semantics, for "
        "development and tests. Production keeps SGLang's own server.",
        epilog="examples:\n  registrar bootstrap --host 127.0.0.1 --port 8998\n"
        "  registrar bootstrap --port 8998 --token s3cret -v   # log each request",
    )
    boot.add_argument("--host", default="127.0.0.1")
    boot.add_argument("--port", type=_port, default=8998)
    boot.add_argument("--token", help="require Authorization: Bearer TOKEN on PUT /route")
    boot.add_argument("--max-body-bytes", type=int, default=1024 * 1024, metavar="N")
    boot.add_argument("-v", "--verbose", action="store_true", help="log each request")
    sub.add_parser(
        "demo",
        help=f"the whole story on embedded defaults, narrated ({DEMO_DURATION})",
        description="A bootstrap server that starts late, a registrar with its health server, "
        "the server restarting and forgetting, the route registered again; all on 127.0.0.1.",
        epilog="example:\n  registrar demo",
    )
    check = sub.add_parser(
        "sglang",
        help="what the SGLang plugin will do in this environment's SGLang",
        description="Read the installed SGLang without starting it (its version, whether it "
        "has the plugin system, which hook targets its source has) and print what the plugin "
        "does there, with the upgrade advice.",
        epilog="examples:\n  registrar sglang\n  registrar sglang --json | jq .features",
    )
    check.add_argument("--json", action="store_true", help="print the report as JSON")
    return parser


_MODULES = {"register": "_register", "status": "_status", "doctor": "_doctor", "sglang": "_doctor"}
"""The module of each command not defined here, imported only when it runs (the register
command never loads the status reader's HTTP client, nor the devtools)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    args = build_parser().parse_args(argv)
    try:
        module = importlib.import_module(f".{_MODULES.get(args.command, '')}", __name__)
        code: int = getattr(module, f"cmd_{args.command}")(args)
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
