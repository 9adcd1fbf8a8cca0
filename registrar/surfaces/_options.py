"""The one table of options (and its parsers), from which the environment reader, the flags and
`--help`, the SGLang plugin's tables and docs/configuration.md are read (docs/architecture.md,
"Settings and options"). Defaults are never written here: they are the settings classes'."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, dataclass
from typing import Any, TypeVar

from ..core import _rules as rules
from ..core._backoff import Backoff
from ..core._settings import HttpSettings, LoopSettings, default_of
from ..protocols._etcd.settings import EtcdSettings
from ..protocols._smg.settings import SmgSettings
from ..protocols._smg.transport import DEFAULT_WATCH_INTERVAL as SMG_WATCH_INTERVAL

ENV_PREFIX = "REGISTRAR_"


@dataclass(frozen=True)
class Option:
    name: str
    """`REGISTRAR_<NAME>` and `--<name>`."""
    example: str
    help: str
    settings: type[Any] | None = None
    """Its field's settings class (the rule, the `--help` default); None: the command's alone."""
    field: str | None = None
    kwarg: str | None = None
    """Its `Registrar` keyword for `options_from_env` (`backoff.<field>`: a field of `Backoff`)."""
    parse: Callable[[str], Any] = str
    flag: bool = True
    """False: from the environment only (a secret must not show in `ps`)."""
    plugin: str | None = None
    """Why the SGLang plugin refuses it; None when the plugin honours it."""
    rule: rules.Rule | None = None
    """The value rule, when not the settings field's own (a timeout per part)."""
    defaults: tuple[tuple[str, type, str], ...] = ()
    """Other defaults to show: (when, settings class, field)."""
    metavar: str | None = None
    """None: its parser's (`METAVARS`: S for seconds, N for integers), else the name's last word."""
    repeat: bool = False
    """The flag may be given several times (its values are joined)."""
    show_default: bool = True
    """False where the settings' default is not the whole story (the help says it)."""

    @property
    def flag_name(self) -> str | None:
        return "--" + self.name.lower().replace("_", "-") if self.flag else None

    @property
    def key(self) -> str:
        return self.name.lower()

    def check(self, value: Any) -> Any:
        rule = self.rule
        if rule is None and self.settings is not None and self.field is not None:
            rule = self.settings.RULES.get(self.field)
        return value if rule is None else rule(value)

    def read(self, text: str) -> Any:
        return self.check(self.parse(text))

    def default_text(self) -> str:
        """The defaults, read from the settings classes: "5; with --etcd: 2"."""
        if self.settings is None or self.field is None or not self.show_default:
            return ""
        if (base := default_of(self.settings, self.field)) is MISSING:
            return ""
        others = [(when, default_of(c, f)) for when, c, f in self.defaults]
        shown = [f"with {w}: {_shown(v)}" for w, v in others if v != base]
        return "; ".join([_shown(base), *shown])


def _shown(value: object) -> str:
    if value is None or isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# The parsers turn a variable's or a flag's text into a typed value, nothing more (the value's
# rule is the settings field's, `registrar.core._rules`); a ValueError says what text is expected.

_T = TypeVar("_T")
_OFF = frozenset({"off", "none", "never", "unlimited", "inf"})


def number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number") from None
    if not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


def _off_or(parse: Callable[[str], _T], expected: str) -> Callable[[str], _T | None]:
    """`parse`, or None for a word that means no limit."""
    read = rules.worded(parse, expected, ValueError)
    return lambda text: None if text.strip().lower() in _OFF else read(text)


seconds = rules.worded(number, "must be a positive number of seconds", ValueError)
parse_seconds_or_zero = rules.worded(number, "must be a number of seconds >= 0", ValueError)
seconds_or_off = _off_or(number, "must be a positive number of seconds, or off")
int_or_off = _off_or(int, "must be an integer >= 1, or unlimited")
integer = rules.worded(int, "must be an integer", ValueError)


def timeout(text: str) -> float | tuple[float, float]:
    parts = text.split(",")
    if len(parts) == 1:
        return seconds(parts[0])
    if len(parts) == 2:
        return (seconds(parts[0]), seconds(parts[1]))
    raise ValueError("must be seconds, or connect,read seconds")


def on_failure(text: str) -> str:
    value = text.strip().lower()
    if value not in ("retry", "stop", "exit"):
        raise ValueError("must be retry, stop or exit")
    return value


def parse_flag(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false")


def parse_port(text: str) -> int:
    """A TCP port to listen on, 0: any free one (the health server's rule, no registration's)."""
    expected = "must be a port number within [0, 65535] (0: any free port)"
    value = rules.worded(int, expected, ValueError)(text)
    if not 0 <= value <= 65535:
        raise ValueError(expected)
    return value


METAVARS: dict[Callable[[str], Any], str] = {int_or_off: "N", integer: "N", timeout: "S"}
METAVARS |= dict.fromkeys((seconds, parse_seconds_or_zero, seconds_or_off), "S")
_SGLANG_BUILDS = "SGLang builds each row's bootstrap URL and payload itself"
_SGLANG_ADDRESS = _SGLANG_BUILDS + " (the rank's address: --host, --dist-init-addr)"
_NO_ETCD = "the plugin registers with SGLang's bootstrap server, not etcd"
_FROM_SERVER_ARGS = "with REGISTRAR_GATEWAY the plugin reads it from SGLang's own arguments"
_REPORTED_BY_SGLANG = "inside SGLang, /ready and /server_info report registration (docs/sglang.md)"
DEFAULT_HEALTH_HOST = "127.0.0.1"
"""The command's own default: no settings class has it."""


def _loop(name: str, parse: Callable[[str], Any], example: str, help: str, **more: Any) -> Option:
    return Option(name, example, help, LoopSettings, name.lower(), name.lower(), parse, **more)


def _http(name: str, parse: Callable[[str], Any], example: str, help: str, **more: Any) -> Option:
    return Option(name, example, help, HttpSettings, name.lower(), name.lower(), parse, **more)


def _backoff(name: str, field: str, example: str, help: str, **more: Any) -> Option:
    return Option(name, example, help, Backoff, field, f"backoff.{field}", parse=number, **more)


def _etcd(name: str, field: str, example: str, help: str, **more: Any) -> Option:
    # A certificate and its key are one field of the settings (a pair): each file is checked
    # here, the pair when the settings are made.
    rule = rules.existing_path if field == "cert" else None
    return Option(name, example, help, EtcdSettings, field, plugin=_NO_ETCD, rule=rule, **more)


def _smg(name: str, field: str, example: str, help: str, **more: Any) -> Option:
    return Option(name, example, help, SmgSettings, field, **more)


OPTIONS: tuple[Option, ...] = (
    _loop(
        "ON_FAILURE",
        on_failure,
        "exit",
        "when the startup budget is spent: retry (in the background), stop, or exit",
        metavar="retry|stop|exit",
    ),
    _loop(
        "MAX_ATTEMPTS",
        int_or_off,
        "5",
        "startup attempts before on_failure applies (unlimited: never)",
    ),
    _loop(
        "MAX_ELAPSED",
        seconds_or_off,
        "60",
        "startup time budget in seconds before on_failure applies (off: none)",
    ),
    _loop(
        "WATCH_INTERVAL",
        seconds_or_off,
        "15",
        "seconds between route checks once registered; 'off' for none (0 is refused); "
        f"with --gateway: {SMG_WATCH_INTERVAL:g}, with --etcd: from --ttl",
    ),
    _http(
        "TIMEOUT",
        timeout,
        "5",
        "each request's deadline in seconds, the whole request, or CONNECT,READ",
        rule=rules.each_seconds,
        defaults=(("--etcd", EtcdSettings, "timeout"), ("--gateway", SmgSettings, "timeout")),
    ),
    _loop(
        "MAX_RETRY_AFTER",
        parse_seconds_or_zero,
        "60",
        "longest wait a server's Retry-After may impose, seconds (0: ignore it)",
    ),
    _loop(
        "DIAGNOSE_AFTER",
        seconds_or_off,
        "30",
        "seconds of requests reaching no bootstrap server before a diagnosis (a wrong port, "
        "host, scheme) is stated in the log, status, health and metrics; 'off' for none",
    ),
    _http("VERIFY", parse_flag, "true", "verify the server's TLS certificate"),
    Option(
        "CA_BUNDLE",
        "/etc/ssl/bootstrap-ca.pem",
        "CA bundle (a file) or CA directory to verify an https server",
        HttpSettings,
        "verify",
        "verify",
        rule=rules.existing_path,
        show_default=False,
        metavar="PATH",
    ),
    _backoff("BACKOFF_INITIAL", "initial", "1", "first retry delay, seconds", metavar="S"),
    _backoff("BACKOFF_MAX", "maximum", "5", "retry delay cap, seconds", metavar="S"),
    _backoff("BACKOFF_MULTIPLIER", "multiplier", "2", "retry delay growth factor", metavar="X"),
    _backoff("BACKOFF_JITTER", "jitter", "0.25", "random part of each delay", metavar="F"),
    # The command's own (the plugin honours some: SGLang gives it the rest).
    Option(
        "URL",
        "http://127.0.0.1:8998",
        "the bootstrap server (required, unless --etcd or --gateway)",
        HttpSettings,
        "url",
        plugin=_SGLANG_BUILDS,
    ),
    Option(
        "PAYLOAD",
        "@/etc/registrar/rank0.json",
        "the payload: JSON, or @FILE to read it (required, unless --gateway)",
        plugin=_SGLANG_BUILDS,
        metavar="JSON|@FILE",
    ),
    Option(
        "PROTOCOL",
        "sglang",
        "sglang (PUT /route and watch the rank), http (PUT only), or any registered protocol "
        "(etcd, smg, ...): it takes the options that are its settings' fields (default: sglang)",
        plugin="the plugin speaks SGLang's bootstrap protocol",
    ),
    Option(
        "TOKEN",
        "s3cret",
        "bearer token (visible in ps: prefer TOKEN_FILE; "
        "default: $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN)",
        HttpSettings,
        "token",
        show_default=False,
    ),
    Option(
        "TOKEN_FILE",
        "/var/run/secrets/bootstrap/token",
        "file holding the bearer token, read again before each request (rotation)",
    ),
    Option("RANK_IP", "10.0.0.5", "sets the payload's rank_ip", plugin=_SGLANG_ADDRESS),
    Option(
        "RANK_IP_ENV",
        "POD_IP",
        "the variable that holds the payload's rank_ip (Kubernetes: status.podIP)",
        plugin=_SGLANG_ADDRESS,
        metavar="VAR",
    ),
    _etcd(
        "ETCD",
        "endpoints",
        "http://127.0.0.1:2379",
        "instead of URL: etcd client URLs, comma-separated (docs/etcd.md)",
        metavar="URLS",
    ),
    _etcd("KEY", "key", "/services/prefill/rank0", "with ETCD: the key"),
    _etcd("TTL", "ttl", "10", "with ETCD: the lease TTL, seconds", parse=seconds),
    _etcd("ETCD_USER", "username", "registrar", "with ETCD: the etcd user", metavar="NAME"),
    _etcd(
        "ETCD_PASSWORD",
        "password",
        "s3cret",
        "with ETCD_USER: the etcd password (from the environment only: no flag)",
        flag=False,
    ),
    _etcd(
        "ETCD_CERT",
        "cert",
        "/etc/etcd/client.pem",
        "with ETCD: a TLS client certificate",
        metavar="FILE",
    ),
    _etcd(
        "ETCD_CERT_KEY", "cert", "/etc/etcd/client.key", "with ETCD: its key file", metavar="FILE"
    ),
    _smg(
        "GATEWAY",
        "gateways",
        "http://127.0.0.1:30000",
        "instead of URL: smg gateway URLs, comma-separated, or the flag repeated (docs/gateway.md)",
        parse=rules.comma_list,
        repeat=True,
        metavar="URL",
    ),
    _smg(
        "WORKER_URL",
        "worker_url",
        "http://10.0.0.5:30001",
        "with GATEWAY: the worker, as the gateway reaches it",
        show_default=False,
    ),
    _smg(
        "WORKER_TYPE",
        "worker_type",
        "prefill",
        "with GATEWAY: prefill, decode or regular",
        plugin=_FROM_SERVER_ARGS + " (--disaggregation-mode)",
        metavar="prefill|decode|regular",
    ),
    _smg(
        "BOOTSTRAP_PORT",
        "bootstrap_port",
        "8998",
        "with GATEWAY: a prefill worker's bootstrap server port",
        parse=integer,
        plugin=_FROM_SERVER_ARGS + " (--disaggregation-bootstrap-port)",
    ),
    _smg(
        "READY_URL",
        "ready",
        "http://127.0.0.1:30001/ready",
        "with GATEWAY: offer the worker only while this answers 2xx (SGLang: /ready)",
        plugin="with REGISTRAR_GATEWAY the server's own /ready gates the offer",
    ),
    _smg(
        "READY_GRACE",
        "grace",
        "10",
        "with READY_URL: not ready this long, the worker is withdrawn",
        parse=seconds,
    ),
    _smg(
        "GATEWAY_KEY_FILE",
        "key_file",
        "/var/run/secrets/smg/key",
        "with GATEWAY: file holding the control-plane key, read before each request "
        "(else $REGISTRAR_GATEWAY_KEY)",
    ),
    _smg(
        "DRAIN_TIMEOUT",
        "drain_timeout",
        "15",
        "with GATEWAY: at stop, wait this long for the gateway to remove the worker",
        parse=seconds,
    ),
    Option(
        "HEALTH_HOST",
        "0.0.0.0",
        f"address of the health server (default: {DEFAULT_HEALTH_HOST})",
        plugin=_REPORTED_BY_SGLANG,
        metavar="H",
    ),
    Option(
        "HEALTH_PORT",
        "8081",
        "serve /livez /readyz /health on this port (0: any free port)",
        parse=parse_port,
        plugin=_REPORTED_BY_SGLANG,
        metavar="P",
    ),
    Option(
        "EXPOSE_PAYLOAD",
        "false",
        "show the payload in /health",
        parse=parse_flag,
        plugin=_REPORTED_BY_SGLANG,
    ),
    Option(
        "VERBOSE",
        "false",
        "log each request with its status and time, and each route check",
        parse=parse_flag,
    ),
)
"""Every option, in the order `--help` and the docs list them."""
