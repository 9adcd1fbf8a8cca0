"""The `registrar` command: a sidecar agent, a status reader, the diagram, the reference
bootstrap server, and the demo.

Every option of `registrar register` can also come from a `REGISTRAR_*` variable (the table in
`surfaces/env.py`; the flag wins). Bad input gets one line on stderr, never a usage block, and
a distinct exit status (see `EXIT_STATUSES`)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn
from urllib.parse import urlsplit

from .._version import __version__
from ..core.errors import ConfigError, describe_exception
from ..core.group import RegistrarGroup
from ..core.machine import State, mermaid_diagram
from ..core.redact import clean, redact_url
from ..core.registrar import EXIT_CODE, Registrar
from ..core.registry import protocol_names
from ..core.status import Status
from ..core.transport import file_token
from ..core.untrusted import load_json
from ..devtools.bootstrap_server import BootstrapServer
from ..protocols.http import DEFAULT_MAX_ANSWER_BYTES, HttpTransport
from .env import (
    ENV_PREFIX,
    ENV_VARS,
    command_options_from_env,
    options_from_env,
    parse_port,
)
from .health import start_health_server
from .verbose import log_request

__all__ = [
    "EXIT_BROKEN_PIPE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_REGISTERED",
    "EXIT_OK",
    "EXIT_STATUSES",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "main",
]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_NOT_REGISTERED = 1
"""`registrar status`: the agent answered, and is not registered."""
EXIT_USAGE = 2
"""Bad input: a flag, a variable, the payload, a port in use."""
EXIT_UNREACHABLE = 4
"""`registrar status`: no usable answer from the agent (nothing listens, not a registrar)."""
EXIT_INTERRUPTED = 130
"""A second Ctrl-C (SIGINT) or SIGTERM while stopping: ended at once."""
EXIT_BROKEN_PIPE = 141
"""The reader of the output went away before it was written (`registrar diagram | head -1`),
as a shell reports a writer ended by SIGPIPE. `status` answers what it found instead."""
EXIT_STATUSES = {
    EXIT_OK: "success (register: stopped cleanly on SIGTERM/SIGINT; status: registered)",
    EXIT_NOT_REGISTERED: "status: the agent is not registered",
    EXIT_USAGE: "usage error: a bad flag, variable or payload, or a port in use",
    EXIT_CODE: "register --on-failure exit: the startup budget was spent",
    EXIT_UNREACHABLE: "status: the agent cannot be reached, or is not a registrar",
    EXIT_INTERRUPTED: "interrupted a second time while stopping",
    EXIT_BROKEN_PIPE: "the reader of the output went away (128 + SIGPIPE); "
    "status still answers 0, 1 or 4",
}



def _exit_text(statuses: dict[int, str]) -> str:
    return "exit status:\n" + "\n".join(f"  {code:<4} {text}" for code, text in statuses.items())


_EXIT_TEXT = _exit_text(EXIT_STATUSES)
_REGISTER_EXITS = _exit_text(
    {
        EXIT_OK: "stopped cleanly on SIGTERM/SIGINT",
        EXIT_USAGE: EXIT_STATUSES[EXIT_USAGE],
        EXIT_CODE: "--on-failure exit: the startup budget was spent",
        EXIT_INTERRUPTED: "interrupted a second time while stopping",
    }
)
_STATUS_EXITS = _exit_text(
    {
        EXIT_OK: "the agent is registered",
        EXIT_NOT_REGISTERED: "the agent answered, and is not registered",
        EXIT_USAGE: "usage error: a bad flag or URL",
        EXIT_UNREACHABLE: "the agent cannot be reached, or is not a registrar",
    }
)

DEMO_DURATION = "about 15 s"
"""How long `registrar demo` takes (README.md says the same; a test checks both)."""

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
  registrar diagram > state.mmd
"""

_UNSET: Any = object()


class UsageError(Exception):
    """Bad input on the command line: reported in one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line on stderr (exit 2), not a usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _payload(text: str, source: str = "--payload") -> dict[str, Any]:
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"{source} file {str(path)!r}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        value = load_json(text)  # nesting bounded: 50 000 brackets are one line, not a traceback
    except ValueError as exc:
        hint = ""
        if not text.lstrip().startswith(("{", "[", '"')) and (
            text.endswith(".json") or Path(text).is_file()
        ):
            sep = "=" if source.startswith(ENV_PREFIX) else " "
            hint = f"; to read the file, write {source}{sep}@{text}"  # the @ forgotten
        raise UsageError(f"{source} is {exc}{hint}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object, got {type(value).__name__}")
    return value


def _table(name: str) -> Callable[[str], Any]:
    """The parser of the environment table's variable `name`, for the flag of the same name:
    a flag and its variable accept the same text and mean the same."""
    (var,) = (v for v in ENV_VARS if v.name == name)

    def parse(text: str) -> Any:
        try:
            return var.parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None

    return parse


def _seconds(text: str) -> float:
    parse: Callable[[str], float] = _table("TIMEOUT")
    value = parse(text)
    if isinstance(value, tuple):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        return parse_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, got {text!r}") from None


def _env_help() -> str:
    shared = [v for v in ENV_VARS if not v.option.startswith("cli.")]
    lines = ["environment (the flag wins):"]
    lines += [
        f"  {ENV_PREFIX}{v.name:<18} {v.help}" for v in ENV_VARS if v.option.startswith("cli.")
    ]
    lines += [f"  {ENV_PREFIX}{v.name:<18} {v.help}" for v in shared]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    raw = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="registrar",
        description="Register a service with a bootstrap server and keep it registered.",
        epilog=f"{EXAMPLES_MAIN.format(duration=DEMO_DURATION)}\n{_EXIT_TEXT}\n",
        formatter_class=raw,
    )
    parser.add_argument("--version", action="version", version=f"registrar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    reg = sub.add_parser(
        "register",
        help="run as a sidecar agent until SIGTERM/SIGINT",
        description="Register PAYLOAD with the bootstrap server at URL, keep it registered, "
        "and serve /livez /readyz /health (and /metrics with the extra) when --health-port "
        "is given. Stops cleanly with exit 0 on SIGTERM or SIGINT; a second one ends it at "
        "once. Every option can also be set by a REGISTRAR_* variable (below).",
        epilog=f"{EXAMPLES_REGISTER}\n{_env_help()}\n\n{_REGISTER_EXITS}\n",
        formatter_class=raw,
        argument_default=argparse.SUPPRESS,  # unset flags stay unset: the environment may say
    )
    add = reg.add_argument
    add("--url", metavar="URL", help="bootstrap server, e.g. http://127.0.0.1:8998 (required)")
    add("--payload", metavar="JSON|@FILE", help="the payload, or @FILE to read it (required)")
    add(
        "--protocol",
        choices=protocol_names(),
        help="sglang (default): PUT /route and watch the rank; http: PUT only",
    )
    add(
        "--token",
        help="bearer token (visible in ps: prefer --token-file; "
        "default: $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)",
    )
    add(
        "--token-file",
        metavar="FILE",
        help="file holding the bearer token, read again before each request (rotation)",
    )
    add("--rank-ip", metavar="IP", help="set the payload's rank_ip")
    add(
        "--rank-ip-env",
        metavar="VAR",
        help="set the payload's rank_ip from this variable, e.g. POD_IP",
    )
    add(
        "--max-attempts",
        type=_table("MAX_ATTEMPTS"),
        metavar="N",
        help="startup attempts before --on-failure applies, or 'unlimited' (default: 5)",
    )
    add(
        "--max-elapsed",
        type=_table("MAX_ELAPSED"),
        metavar="S",
        help="startup time budget in seconds before --on-failure applies, or 'off' (default)",
    )
    add(
        "--on-failure",
        type=_table("ON_FAILURE"),
        metavar="retry|stop|exit",
        help="when the startup budget is spent: retry in the background (default), stay "
        f"failed, or exit with status {EXIT_CODE}",
    )
    add(
        "--watch-interval",
        type=_table("WATCH_INTERVAL"),
        metavar="S",
        help="seconds between route checks; 'off' for none (0 is refused) (default: 15)",
    )
    add(
        "--timeout",
        type=_table("TIMEOUT"),
        metavar="S",
        help="each request's deadline in seconds, the whole request, or CONNECT,READ (default: 5)",
    )
    add(
        "--max-retry-after",
        type=_table("MAX_RETRY_AFTER"),
        metavar="S",
        help="longest wait a server's Retry-After may impose, 0 to ignore it (default: 60)",
    )
    add(
        "--etcd",
        metavar="URLS",
        help="instead of --url: etcd client URLs, comma-separated (docs/etcd.md)",
    )
    add("--key", metavar="KEY", help="with --etcd: the key, e.g. /services/prefill/rank0")
    add("--ttl", type=_seconds, metavar="S", help="with --etcd: the lease TTL (default: 10)")
    add(
        "--etcd-user",
        metavar="NAME",
        help="with --etcd: the etcd user; its password from $REGISTRAR_ETCD_PASSWORD",
    )
    add(
        "--etcd-cert",
        metavar="FILE",
        help="with --etcd: a TLS client certificate (clusters with --client-cert-auth)",
    )
    add("--etcd-cert-key", metavar="FILE", help="with --etcd: the client certificate's key")
    add(
        "--gateway",
        action="append",
        metavar="URL",
        help="instead of --url: an smg gateway to keep the worker listed by; repeat for several "
        "(docs/gateway.md)",
    )
    add("--worker-url", metavar="URL", help="with --gateway: the worker, as the gateway reaches it")
    add(
        "--worker-type",
        type=_table("WORKER_TYPE"),
        metavar="prefill|decode|regular",
        help="with --gateway: the worker's role (default: regular)",
    )
    add(
        "--bootstrap-port",
        type=_table("BOOTSTRAP_PORT"),
        metavar="N",
        help="with --gateway: a prefill worker's bootstrap server port",
    )
    add(
        "--ready-url",
        metavar="URL",
        help="with --gateway: offer the worker only while this answers 2xx (SGLang: /ready)",
    )
    add(
        "--ready-grace",
        type=_seconds,
        metavar="S",
        help="with --ready-url: not ready this long, the worker is withdrawn (default: 10)",
    )
    add(
        "--gateway-key-file",
        metavar="FILE",
        help="with --gateway: file holding the control-plane key, read before each request "
        "(default: $REGISTRAR_GATEWAY_KEY)",
    )
    add(
        "--drain-timeout",
        type=_seconds,
        metavar="S",
        help="with --gateway: at stop, wait this long for the gateway to remove the worker "
        "(default: 15)",
    )
    add("--ca-bundle", metavar="FILE", help="CA bundle to verify an https server")
    add("--health-host", metavar="H", help="address for the health server (default: 127.0.0.1)")
    add(
        "--health-port",
        type=_port,
        metavar="P",
        help="serve health endpoints on this port (0: any free port)",
    )
    add("--expose-payload", action="store_true", help="include the payload in /health")
    add(
        "-v",
        "--verbose",
        action="store_true",
        help="debug: each request with its status and time, each route check and its verdict",
    )

    status = sub.add_parser(
        "status",
        help="read a running agent's /health",
        description="Print a running agent's health for a person, or as JSON. Exit 0 when "
        f"registered, {EXIT_NOT_REGISTERED} otherwise, {EXIT_UNREACHABLE} when the agent "
        f"cannot be reached, {EXIT_USAGE} on bad input.",
        epilog="examples:\n  registrar status --health-url http://127.0.0.1:8081\n"
        "  registrar status --health-url http://127.0.0.1:8081 --json | jq .status\n\n"
        f"{_STATUS_EXITS}\n",
        formatter_class=raw,
    )
    status.add_argument("--health-url", required=True, help="the agent's health server URL")
    status.add_argument("--timeout", type=_seconds, default=5.0, metavar="S", help="(default: 5)")
    status.add_argument(
        "--json", action="store_true", help="print the agent's health+json document as it is"
    )

    sub.add_parser(
        "diagram",
        help="print the state diagram (mermaid) from the transition table",
        description="Print the state diagram as mermaid text, drawn from the transition table.",
        epilog="examples:\n  registrar diagram > state.mmd\n"
        "  registrar diagram | mmdc -i - -o state.svg   # with mermaid-cli",
        formatter_class=raw,
    )

    boot = sub.add_parser(
        "bootstrap",
        help="run the reference bootstrap server (development and tests only)",
        description="An in-memory bootstrap server with SGLang's HTTP semantics, for "
        "development and tests. Production keeps SGLang's own server.",
        epilog="examples:\n  registrar bootstrap --host 127.0.0.1 --port 8998\n"
        "  registrar bootstrap --port 8998 --token s3cret -v   # log each request",
        formatter_class=raw,
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
        formatter_class=raw,
    )
    return parser


def _log_setup(verbose: bool, quiet: Sequence[str] = ()) -> None:
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


class _Signals:
    """SIGTERM/SIGINT: the first asks for a clean stop; another while stopping ends the
    process at once (`exit`, injectable for tests)."""

    def __init__(self, exit: Callable[[int], None] = os._exit) -> None:
        self.done = threading.Event()
        self._exit = exit

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.done.is_set():
            print("registrar: interrupted again, exiting now", file=sys.stderr, flush=True)
            self._exit(EXIT_INTERRUPTED)
            return
        self.done.set()

    def install(self) -> _Signals:
        signal.signal(signal.SIGTERM, self.handle)
        signal.signal(signal.SIGINT, self.handle)
        return self

    def wait(self) -> None:
        while not self.done.wait(0.5):
            pass


def _resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The register options: each flag given, else its variable, else nothing (the library's
    default stands). ConfigError names a bad variable; a variable whose flag is given is not
    even read (the flag wins)."""
    flags = vars(args)
    unflagged = [v.name for v in ENV_VARS if v.name.lower() not in flags]
    library = options_from_env(names=unflagged)
    command = command_options_from_env(names=unflagged)
    chosen: dict[str, Any] = {}
    for name in (*library, *command):
        chosen[name] = library.get(name, command.get(name))
    for name, value in flags.items():
        if name != "command":
            chosen[name] = value
    return chosen


def _token(chosen: dict[str, Any], flags: dict[str, Any]) -> Any:
    """A fixed token, a provider reading the token file before each request, or None."""
    if "token" in flags and "token_file" in flags:
        raise UsageError("give --token or --token-file, not both")
    # A flag wins over both variables; between the variables, the file (not visible in ps).
    if "token" in flags:
        return flags["token"]
    path = flags.get("token_file", chosen.get("token_file"))
    if path is None:
        return chosen.get("token")
    try:
        return file_token(path, "--token-file")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _rank_ip(payload: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    if chosen.get("rank_ip") is not None:
        return {**payload, "rank_ip": chosen["rank_ip"]}
    name = chosen.get("rank_ip_env")
    if name is None:
        return payload
    value = os.environ.get(name, "").strip()
    if not value:
        raise UsageError(f"--rank-ip-env {name}: the variable {name} is not set")
    return {**payload, "rank_ip": value}


def _etcd_registrar(
    flags: dict[str, Any], payload: dict[str, Any], token: Any, options: dict[str, Any]
) -> Registrar:
    """`--etcd`: the payload under `--key` in etcd (docs/etcd.md)."""
    from ..assembly import etcd_registrar  # noqa: PLC0415 - only --etcd needs it

    if "url" in flags or "protocol" in flags or token is not None:
        raise UsageError("--etcd replaces --url, --protocol and --token (etcd: --etcd-user)")
    if not flags.get("key"):
        raise UsageError("--etcd needs --key, e.g. --key /services/prefill/rank0")
    user = flags.get("etcd_user")
    password = os.environ.get("REGISTRAR_ETCD_PASSWORD") if user else None
    if user and not password:
        raise UsageError("--etcd-user needs the password in $REGISTRAR_ETCD_PASSWORD")
    options = {k: v for k, v in options.items() if k != "protocol"}
    cert, cert_key = flags.get("etcd_cert"), flags.get("etcd_cert_key")
    if (cert is None) != (cert_key is None):
        raise UsageError("--etcd-cert and --etcd-cert-key go together")
    if cert is not None:
        options["cert"] = (cert, cert_key)
    if "ttl" in flags:
        options["ttl"] = flags["ttl"]
    return etcd_registrar(
        flags["etcd"], flags["key"], payload, username=user, password=password, **options
    )


_GATEWAY_ONLY = (
    "worker_url",
    "worker_type",
    "bootstrap_port",
    "ready_url",
    "ready_grace",
    "gateway_key_file",
    "drain_timeout",
)


def _gateway_group(chosen: dict[str, Any], options: dict[str, Any]) -> RegistrarGroup:
    """`--gateway`: the worker kept listed by each smg gateway (docs/gateway.md)."""
    from ..assembly import smg_registrars  # noqa: PLC0415 - only --gateway needs it

    clash = [
        f"--{name.replace('_', '-')}"
        for name in ("url", "etcd", "payload", "protocol", "token", "token_file", "rank_ip")
        if chosen.get(name) is not None
    ]
    if clash:
        raise UsageError(
            f"--gateway replaces {', '.join(clash)} (the worker: --worker-url, --worker-type; "
            "the key: --gateway-key-file or $REGISTRAR_GATEWAY_KEY)"
        )
    if not chosen.get("worker_url"):
        raise UsageError(f"--gateway needs --worker-url (or set {ENV_PREFIX}WORKER_URL)")
    extra: dict[str, Any] = {
        key: chosen[key] for key in ("bootstrap_port", "drain_timeout") if key in chosen
    }
    if chosen.get("ready_url"):
        extra["ready"] = chosen["ready_url"]
    if "ready_grace" in chosen:
        extra["grace"] = chosen["ready_grace"]
    if chosen.get("gateway_key_file"):
        extra["key_file"] = chosen["gateway_key_file"]
    options = {k: v for k, v in options.items() if k != "protocol"}
    return smg_registrars(
        chosen["gateway"],
        chosen["worker_url"],
        chosen.get("worker_type", "regular"),
        **extra,
        **options,
    )


def _cmd_register(args: argparse.Namespace) -> int:
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    chosen = _resolve(args)
    etcd = chosen.get("etcd") is not None
    gateway = bool(chosen.get("gateway"))
    if not gateway:
        stray = [f"--{k.replace('_', '-')}" for k in _GATEWAY_ONLY if chosen.get(k) is not None]
        if stray:
            raise UsageError(f"{', '.join(stray)} go with --gateway (docs/gateway.md)")
    for required, flag in (("url", "--url"), ("payload", "--payload")):
        if gateway or (etcd and required == "url"):
            continue
        if chosen.get(required) is None:
            variable = f"{ENV_PREFIX}{required.upper()}"
            raise UsageError(f"{flag} is required (or set {variable})")
    verbose = bool(chosen.get("verbose", False))
    options: dict[str, Any] = {
        key: chosen[key]
        for key in (
            "protocol",
            "max_attempts",
            "max_elapsed",
            "on_failure",
            "watch_interval",
            "timeout",
            "max_retry_after",
            "verify",
            "ca_bundle",
            "backoff",
        )
        if key in chosen
    }
    if gateway:
        group = _gateway_group(chosen, options)
        _log_setup(verbose, quiet=("registrar.surfaces.health",))
        return _serve(group, chosen, verbose)
    source = "--payload" if "payload" in flags else f"{ENV_PREFIX}PAYLOAD"
    payload = _rank_ip(_payload(chosen["payload"], source), chosen)
    token = _token(chosen, flags)
    _log_setup(verbose, quiet=("registrar.surfaces.health",))
    if etcd:
        # The etcd options may come from their variables too (REGISTRAR_ETCD, _KEY, ...).
        given: dict[str, Any] = {
            k: chosen[k]
            for k in ("etcd", "key", "ttl", "etcd_user", "etcd_cert", "etcd_cert_key")
            if k in chosen
        }
        reg = _etcd_registrar({**flags, **given}, payload, token, options)
    else:
        reg = Registrar(chosen["url"], payload, token=token, **options)
    return _serve(RegistrarGroup([reg]), chosen, verbose)


def _serve(group: RegistrarGroup, chosen: dict[str, Any], verbose: bool) -> int:
    """Run the registrations (and their health server) until SIGTERM/SIGINT, then stop them
    together, within the longest drain any of them needs."""
    log = logging.getLogger("registrar")
    several = len(group) > 1

    def on_change_of(url: str) -> Callable[[State, State, Status], None]:
        def on_change(old: State, new: State, status: Status) -> None:
            failed = status.last_error and new is State.FAILED
            detail = f" ({status.last_error})" if failed else ""
            where = f"{url}: " if several else ""
            log.info("%sstate %s -> %s%s", where, old.value, new.value, detail)

        return on_change

    for reg in group:
        reg.add_listener(on_change_of(reg.status().url))
        if verbose:
            reg.add_request_listener(log_request)
    source: Any = group if several else group.members()[0]
    health = None
    host = chosen.get("health_host") or "127.0.0.1"
    port = chosen.get("health_port")
    if port is not None:
        try:
            health = start_health_server(
                source, host, port, expose_payload=bool(chosen.get("expose_payload", False))
            )
        except OSError as exc:
            raise UsageError(
                f"cannot serve health on {host}:{port}: {describe_exception(exc)}"
            ) from None
    where = f"; health on {health.url}/readyz" if health is not None else ""
    urls = ", ".join(reg.status().url for reg in group)
    log.info("registrar %s: registering with %s%s", __version__, urls, where)
    signals = _Signals().install()
    group.start()
    try:
        signals.wait()
    finally:
        log.info("stopping")
        # stop() ends a request in flight at once; a gateway's drain takes its own time.
        group.stop()
        if health is not None:
            health.stop()
    return EXIT_OK


def _health_check(document: object) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The document and its registration check's entries (one per registry), or ValueError:
    whatever the agent (or whatever answers in its place) sent, only a health document of the
    expected shape is read."""
    checks = document.get("checks") if isinstance(document, dict) else None
    entries = checks.get("registration:state") if isinstance(checks, dict) else None
    if not isinstance(document, dict) or not isinstance(entries, list) or not entries:
        raise ValueError("no registration:state check")
    if not all(isinstance(entry, dict) for entry in entries):
        raise ValueError("a registration:state entry is not an object")
    return document, entries


def _cmd_status(args: argparse.Namespace) -> int:
    url = args.health_url.rstrip("/")
    shown = clean(redact_url(url), 200)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise UsageError(f"--health-url {shown!r} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--health-url must be an http(s) URL, got {shown!r}")
    path = parts.path if parts.path not in ("", "/") else "/health"
    # The agent's answer within --timeout in all (not per read) and read up to a cap, like
    # every request registrar sends.
    transport = HttpTransport(f"{parts.scheme}://{parts.netloc}", timeout=args.timeout, verify=True)
    try:
        result = transport.send("GET", path, limit=DEFAULT_MAX_ANSWER_BYTES)
    finally:
        transport.close()
    shown = clean(redact_url(f"{parts.scheme}://{parts.netloc}{path}"), 200)
    if result.error is not None:
        print(
            f"registrar: cannot reach {shown}: {transport.describe_error(result.error)}",
            file=sys.stderr,
        )
        return EXIT_UNREACHABLE
    try:
        if not result.complete:
            raise ValueError("answer too large")
        document, entries = _health_check(load_json(result.text))
    except ValueError:
        print(f"registrar: {shown} is not a registrar health endpoint", file=sys.stderr)
        return EXIT_UNREACHABLE
    registered = all(e.get("observedValue") == State.REGISTERED.value for e in entries)
    outcome = EXIT_OK if registered else EXIT_NOT_REGISTERED
    if args.json:
        # The document as the agent sent it (parsed and re-encoded: valid JSON, one line).
        return _answer([json.dumps(document, sort_keys=False)], outcome)
    lines: list[str] = []
    for number, check in enumerate(entries):
        if number:
            lines.append("")
        lines.extend(_registration_lines(document, check))
    if document.get("output"):
        lines.append(f"problem:      {_field(document, 'output')}")
    return _answer(lines, outcome)


def _field(source: dict[str, Any], name: str, default: str = "") -> str:
    # The agent's text, escaped and capped: a health document is no licence to draw on the
    # terminal.
    value = source.get(name)
    return clean(value, 200) if value not in (None, "") else default


def _registration_lines(document: dict[str, Any], check: dict[str, Any]) -> list[str]:
    """One registration (of one registry) for a person."""
    lines = [
        f"registration: {_field(check, 'observedValue')} ({_field(document, 'status')})"
        f" since {_field(check, 'since')}",
        f"bootstrap:    {_field(check, 'url')}",
        f"route:        {_field(check, 'route', 'not checked yet')}"
        f" (last check {_field(check, 'lastCheckAt', 'never')},"
        f" server reachable: {_field(check, 'serverReachable')})",
        f"attempts:     {_field(check, 'attemptsTotal')} sent, "
        f"{_field(check, 'registrations')} accepted, "
        f"{_plural(_field(check, 'reregistrations'), 're-registration')}",
        f"last success: {_field(check, 'lastSuccessAt', 'never')}",
    ]
    if check.get("nextAttemptAt"):
        lines.append(f"next attempt: {_field(check, 'nextAttemptAt')}")
    return lines


def _plural(count: str, noun: str) -> str:
    return f"{count} {noun}" if count == "1" else f"{count} {noun}s"


def _answer(lines: list[str], outcome: int) -> int:
    """Write the answer; a reader that closed early (`registrar status | head -c 400`) cuts
    the output, not the answer: the exit status still says what was found."""
    try:
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _stdout_to_devnull()
    return outcome


def _stdout_to_devnull() -> None:
    """Python's recipe for a reader gone (SIGPIPE, docs of the `signal` module): point stdout
    at devnull, so the interpreter's last flush at exit cannot fail again with a traceback."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    # -v: the server logs each request (method, path, status) at DEBUG.
    _log_setup(args.verbose, quiet=("registrar.devtools.bootstrap_server",))
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
    signals = _Signals().install()
    try:
        signals.wait()
    finally:
        server.close()
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..devtools.demo import run_demo  # noqa: PLC0415 - only the demo needs it

    return run_demo(sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    args = _parser().parse_args(argv)
    try:
        code = _dispatch(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader of the output went away (`registrar diagram | head -1`): no traceback;
        # the status a shell reports for a writer ended by SIGPIPE.
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE
    return code


def _cmd_diagram(args: argparse.Namespace) -> int:
    sys.stdout.write(mermaid_diagram())
    return EXIT_OK


def _dispatch(args: argparse.Namespace) -> int:
    commands: dict[str, Callable[[argparse.Namespace], int]] = {
        "register": _cmd_register,
        "status": _cmd_status,
        "diagram": _cmd_diagram,
        "bootstrap": _cmd_bootstrap,
    }
    try:
        return commands.get(args.command, _cmd_demo)(args)
    except (UsageError, ConfigError) as exc:
        print(f"registrar: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
