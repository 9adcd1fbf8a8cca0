"""The `registrar` command: a sidecar agent, a status reader, the diagram, the reference
bootstrap server, and the demo. Bad input gets one clear line on stderr and exit status 2."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

from .. import __version__
from ..core.backoff import DEFAULT_MAX_RETRY_AFTER
from ..core.errors import ConfigError, describe_exception
from ..core.machine import State, mermaid_diagram
from ..core.redact import clean, redact_url
from ..core.registrar import Registrar
from ..core.status import Status
from ..core.untrusted import load_json
from ..devtools.bootstrap_server import BootstrapServer
from ..protocols.http import DEFAULT_MAX_ANSWER_BYTES, HttpTransport
from .health import start_health_server

__all__ = ["main"]

EXAMPLES_REGISTER = """\
examples:
  registrar register --url http://127.0.0.1:8998 --payload @rank0.json --health-port 8081
  registrar register --url http://127.0.0.1:8998 --on-failure exit \\
      --payload '{"attn_tp_size": 1, "attn_tp_rank": 0, ...}'
  SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN=... registrar register --url ... --payload @p.json
"""

EXAMPLES_MAIN = """\
examples:
  registrar demo                                  # the whole story in under 30 s, on 127.0.0.1
  registrar bootstrap --port 8998                 # a reference bootstrap server (dev/test)
  registrar register --url http://127.0.0.1:8998 --payload @rank0.json --health-port 8081
  registrar status --health-url http://127.0.0.1:8081
  registrar diagram > state.mmd
"""


class UsageError(Exception):
    """Bad input on the command line: reported in one line, exit status 2."""


def _payload(text: str) -> dict[str, Any]:
    source = "--payload"
    if text.startswith("@"):
        path = Path(text[1:])
        source = f"--payload file {str(path)!r}"
        try:
            text = path.read_text()
        except OSError as exc:
            raise UsageError(f"cannot read {source}: {exc.strerror or exc}") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{source} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object, got {type(value).__name__}")
    return value


def _convert(text: str, kind: type[int] | type[float], what: str) -> float:
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


def _attempts(text: str) -> int | None:
    if text.lower() in ("none", "unlimited", "inf"):
        return None
    value = int(_convert(text, int, "a whole number or 'none'"))
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (or 'none' for no limit), got {value}")
    return value


def _interval(text: str) -> float | None:
    if text.lower() in ("off", "none", "0"):
        return None
    return _seconds(text)


def _seconds(text: str) -> float:
    value = _convert(text, float, "seconds")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {text}")
    return value


def _seconds_or_zero(text: str) -> float:
    value = _convert(text, float, "seconds")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be >= 0 seconds, got {text}")
    return value


def _port(text: str) -> int:
    value = int(_convert(text, int, "a port number"))
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            f"must be within [0, 65535] (0: any free port), got {value}"
        )
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="registrar",
        description="Register a service with a bootstrap server and keep it registered.",
        epilog=EXAMPLES_MAIN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"registrar {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    reg = sub.add_parser(
        "register",
        help="run as a sidecar agent until SIGTERM/SIGINT",
        description="Register PAYLOAD with the bootstrap server at URL, keep it registered, "
        "and serve /livez /readyz /health (and /metrics with the extra) when --health-port "
        "is given. Stops cleanly with exit 0 on SIGTERM or SIGINT.",
        epilog=EXAMPLES_REGISTER,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    reg.add_argument("--url", required=True, help="bootstrap server, e.g. http://127.0.0.1:8998")
    reg.add_argument("--payload", required=True, help="JSON text, or @FILE to read it from a file")
    reg.add_argument(
        "--token", help="bearer token (default: $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)"
    )
    reg.add_argument(
        "--protocol",
        choices=("sglang", "http"),
        default="sglang",
        help="sglang (default): PUT /route and watch the rank; http: PUT only",
    )
    reg.add_argument(
        "--max-attempts",
        type=_attempts,
        default=5,
        metavar="N",
        help="startup attempts before on-failure applies, or 'none' (default: 5)",
    )
    reg.add_argument(
        "--on-failure",
        choices=("retry", "stop", "exit"),
        default="retry",
        help="when the startup budget is spent (default: retry in the background)",
    )
    reg.add_argument(
        "--watch-interval",
        type=_interval,
        default=5.0,
        metavar="S",
        help="seconds between route checks, or 'off' (default: 5)",
    )
    reg.add_argument(
        "--timeout",
        type=_seconds,
        default=5.0,
        metavar="S",
        help="each request's deadline in seconds, the whole request (default: 5)",
    )
    reg.add_argument(
        "--max-retry-after",
        type=_seconds_or_zero,
        default=DEFAULT_MAX_RETRY_AFTER,
        metavar="S",
        help="longest wait a server's Retry-After may impose, 0 to ignore it (default: 60)",
    )
    reg.add_argument("--ca-bundle", metavar="FILE", help="CA bundle to verify an https server")
    reg.add_argument(
        "--health-host",
        default="127.0.0.1",
        metavar="H",
        help="address for the health server (default: 127.0.0.1)",
    )
    reg.add_argument(
        "--health-port",
        type=_port,
        metavar="P",
        help="serve health endpoints on this port (0: any free port)",
    )
    reg.add_argument(
        "--expose-payload",
        action="store_true",
        help="include the payload in /health (off by default)",
    )
    reg.add_argument("-v", "--verbose", action="store_true", help="log debug details")

    status = sub.add_parser(
        "status",
        help="read a running agent's /health",
        description="Print a running agent's health for a person. Exit 0 when registered, "
        "1 otherwise, 2 when the agent cannot be reached.",
        epilog="example:\n  registrar status --health-url http://127.0.0.1:8081",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--health-url", required=True, help="the agent's health server URL")
    status.add_argument("--timeout", type=_seconds, default=5.0, metavar="S")

    sub.add_parser("diagram", help="print the state diagram (mermaid) from the transition table")

    boot = sub.add_parser(
        "bootstrap",
        help="run the reference bootstrap server (development and tests only)",
        description="An in-memory bootstrap server with SGLang's HTTP semantics, for "
        "development and tests. Production keeps SGLang's own server.",
        epilog="example:\n  registrar bootstrap --host 127.0.0.1 --port 8998",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    boot.add_argument("--host", default="127.0.0.1")
    boot.add_argument("--port", type=_port, default=8998)
    boot.add_argument("--token", help="require Authorization: Bearer TOKEN on PUT /route")
    boot.add_argument("--max-body-bytes", type=int, default=1024 * 1024, metavar="N")

    sub.add_parser("demo", help="the whole story on embedded defaults, narrated (under 30 s)")
    return parser


def _log_setup(verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)-7s %(message)s", "%Y-%m-%dT%H:%M:%S%z")
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def _wait_for_signal() -> None:
    done = threading.Event()

    def handler(signum: int, frame: FrameType | None) -> None:
        done.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    while not done.wait(0.5):
        pass


def _cmd_register(args: argparse.Namespace) -> int:
    payload = _payload(args.payload)
    _log_setup(args.verbose)
    reg = Registrar(
        args.url,
        payload,
        token=args.token,
        protocol=args.protocol,
        max_attempts=args.max_attempts,
        on_failure=args.on_failure,
        watch_interval=args.watch_interval,
        timeout=args.timeout,
        max_retry_after=args.max_retry_after,
        ca_bundle=args.ca_bundle,
    )
    log = logging.getLogger("registrar")

    def on_change(old: State, new: State, status: Status) -> None:
        detail = f" ({status.last_error})" if status.last_error and new is State.FAILED else ""
        log.info("state %s -> %s%s", old.value, new.value, detail)

    reg.add_listener(on_change)
    health = None
    if args.health_port is not None:
        try:
            health = start_health_server(
                reg, args.health_host, args.health_port, expose_payload=args.expose_payload
            )
        except OSError as exc:
            raise UsageError(
                f"cannot serve health on {args.health_host}:{args.health_port}: "
                f"{describe_exception(exc)}"
            ) from None
        print(f"health on {health.url}/readyz", file=sys.stderr, flush=True)
    reg.start()
    try:
        _wait_for_signal()
    finally:
        log.info("stopping")
        reg.stop()
        if health is not None:
            health.stop()
    return 0


def _health_check(document: object) -> tuple[dict[str, Any], dict[str, Any]]:
    """The document and its registration check, or ValueError: whatever the agent (or whatever
    answers in its place) sent, only a health document of the expected shape is read."""
    checks = document.get("checks") if isinstance(document, dict) else None
    entries = checks.get("registration:state") if isinstance(checks, dict) else None
    check = entries[0] if isinstance(entries, list) and entries else None
    if not isinstance(document, dict) or not isinstance(check, dict):
        raise ValueError("no registration:state check")
    return document, check


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
        return 2
    try:
        if not result.complete:
            raise ValueError("answer too large")
        document, check = _health_check(load_json(result.text))
    except ValueError:
        print(f"registrar: {shown} is not a registrar health endpoint", file=sys.stderr)
        return 2

    def field(source: dict[str, Any], name: str, default: str = "") -> str:
        # The agent's text, escaped and capped: a health document is no licence to draw on
        # the terminal.
        value = source.get(name)
        return clean(value, 200) if value not in (None, "") else default

    state = check.get("observedValue")
    print(
        f"registration: {field(check, 'observedValue')} ({field(document, 'status')})"
        f" since {field(check, 'since')}"
    )
    print(f"bootstrap:    {field(check, 'url')}")
    print(
        f"route:        {field(check, 'route', 'not checked yet')}"
        f" (last check {field(check, 'lastCheckAt', 'never')},"
        f" server reachable: {field(check, 'serverReachable')})"
    )
    print(
        f"attempts:     {field(check, 'attemptsTotal')} sent, "
        f"{field(check, 'registrations')} accepted, "
        f"{field(check, 'reregistrations')} re-registrations"
    )
    print(f"last success: {field(check, 'lastSuccessAt', 'never')}")
    if check.get("nextAttemptAt"):
        print(f"next attempt: {field(check, 'nextAttemptAt')}")
    if document.get("output"):
        print(f"problem:      {field(document, 'output')}")
    return 0 if state == State.REGISTERED.value else 1


def _cmd_bootstrap(args: argparse.Namespace) -> int:
    _log_setup(False)
    server = BootstrapServer(
        args.host, args.port, token=args.token, max_body_bytes=args.max_body_bytes
    )
    try:
        server.start()
    except OSError as exc:
        raise UsageError(
            f"cannot listen on {args.host}:{args.port}: {describe_exception(exc)}"
        ) from None
    print(
        f"reference bootstrap server on {server.url} (development and test tool)",
        file=sys.stderr,
        flush=True,
    )
    try:
        _wait_for_signal()
    finally:
        server.close()
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..devtools.demo import run_demo  # noqa: PLC0415 - only the demo needs it

    return run_demo(sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `registrar` and `python -m registrar`."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "register":
            return _cmd_register(args)
        if args.command == "status":
            return _cmd_status(args)
        if args.command == "diagram":
            sys.stdout.write(mermaid_diagram())
            return 0
        if args.command == "bootstrap":
            return _cmd_bootstrap(args)
        return _cmd_demo(args)
    except (UsageError, ConfigError) as exc:
        print(f"registrar: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
