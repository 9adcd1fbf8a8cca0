"""Configuration from `REGISTRAR_*` environment variables: one table, one translation.

Every surface that reads the environment (the SGLang plugin, the `registrar` command) turns the
variables into `Registrar` keyword arguments here, so a variable means the same everywhere and
each is validated once, with an error that names the variable and shows a good value. A surface's
own variables live with it (the SGLang plugin's in `integrations/sglang/settings.py`) and use the
same `EnvVar` and readers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core.errors import ConfigError
from ..core.registrar import DEFAULT_BACKOFF

__all__ = [
    "ENV_PREFIX",
    "ENV_VARS",
    "EnvVar",
    "command_options_from_env",
    "describe_env",
    "options_from_env",
    "parse_flag",
    "parse_port",
    "parse_seconds_or_zero",
]

ENV_PREFIX = "REGISTRAR_"

_OFF = frozenset({"off", "none", "never", "unlimited", "inf"})
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _policy(text: str) -> str:
    value = text.strip().lower()
    if value not in ("retry", "stop", "exit"):
        raise ValueError("must be retry, stop or exit")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a positive number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be a positive number of seconds")
    return value


def parse_seconds_or_zero(text: str) -> float:
    """A number of seconds, 0 included."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number of seconds >= 0") from None
    if not (math.isfinite(value) and value >= 0):
        raise ValueError("must be a number of seconds >= 0")
    return value


def _seconds_or_off(text: str) -> float | None:
    if text.strip().lower() in _OFF:
        return None
    try:
        return _seconds(text)
    except ValueError:
        raise ValueError("must be a positive number of seconds, or off") from None


def _attempts(text: str) -> int | None:
    if text.strip().lower() in _OFF:
        return None
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be an integer >= 1, or unlimited") from None
    if value < 1:
        raise ValueError("must be an integer >= 1, or unlimited")
    return value


def _timeout(text: str) -> float | tuple[float, float]:
    parts = text.split(",")
    if len(parts) == 1:
        return _seconds(parts[0])
    if len(parts) == 2:
        return (_seconds(parts[0]), _seconds(parts[1]))
    raise ValueError("must be seconds, or connect,read seconds")


def parse_flag(text: str) -> bool:
    """1/true/yes/on or 0/false/no/off."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError("must be true or false")


def parse_port(text: str) -> int:
    """A TCP port, 0 meaning any free one."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be a port number within [0, 65535] (0: any free port)") from None
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number within [0, 65535] (0: any free port)")
    return value


def _text(text: str) -> str:
    return text.strip()


def _urls(text: str) -> list[str]:
    urls = [part.strip() for part in text.split(",") if part.strip()]
    if not urls:
        raise ValueError("must be one or more URLs, comma-separated")
    return urls


def _worker_type(text: str) -> str:
    value = text.strip().lower()
    if value not in ("prefill", "decode", "regular"):
        raise ValueError("must be prefill, decode or regular")
    return value


def _bootstrap_port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError("must be a port number within [1, 65535]") from None
    if not 1 <= value <= 65535:
        raise ValueError("must be a port number within [1, 65535]")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError("must be a number within [0, 1]") from None
    if not 0 <= value <= 1:
        raise ValueError("must be a number within [0, 1]")
    return value


@dataclass(frozen=True)
class EnvVar:
    """One variable: its name after the prefix, the option it sets, how it is read."""

    name: str
    option: str
    """A `Registrar` keyword argument, `backoff.<field>` for a field of the `Backoff`, or
    `cli.<option>` for an option of `registrar register` alone (its flag `--<option>`)."""
    parse: Callable[[str], Any]
    """Raises ValueError with the rule the text broke."""
    example: str
    help: str


ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "ON_FAILURE",
        "on_failure",
        _policy,
        "exit",
        "when the startup budget is spent: retry (in the background), stop, or exit",
    ),
    EnvVar(
        "MAX_ATTEMPTS",
        "max_attempts",
        _attempts,
        "5",
        "startup attempts before on_failure applies (unlimited: never)",
    ),
    EnvVar(
        "MAX_ELAPSED",
        "max_elapsed",
        _seconds_or_off,
        "60",
        "startup time budget in seconds before on_failure applies (off: none)",
    ),
    EnvVar(
        "WATCH_INTERVAL",
        "watch_interval",
        _seconds_or_off,
        "15",
        "seconds between route checks once registered (off: no periodic check)",
    ),
    EnvVar("TIMEOUT", "timeout", _timeout, "5", "request timeout: seconds, or connect,read"),
    EnvVar(
        "MAX_RETRY_AFTER",
        "max_retry_after",
        parse_seconds_or_zero,
        "60",
        "longest wait a server's Retry-After may impose, seconds (0: ignore it)",
    ),
    EnvVar("VERIFY", "verify", parse_flag, "true", "verify the server's TLS certificate"),
    EnvVar("CA_BUNDLE", "ca_bundle", str, "/etc/ssl/bootstrap-ca.pem", "CA bundle for TLS"),
    EnvVar("BACKOFF_INITIAL", "backoff.initial", _seconds, "1", "first retry delay, seconds"),
    EnvVar("BACKOFF_MAX", "backoff.maximum", _seconds, "5", "retry delay cap, seconds"),
    EnvVar("BACKOFF_MULTIPLIER", "backoff.multiplier", float, "2", "retry delay growth factor"),
    EnvVar("BACKOFF_JITTER", "backoff.jitter", _fraction, "0.25", "random part of each delay"),
    # `registrar register` alone: the flag of the same name wins over the variable.
    EnvVar("URL", "cli.url", _text, "http://127.0.0.1:8998", "the bootstrap server"),
    EnvVar("PAYLOAD", "cli.payload", _text, "@/etc/registrar/rank0.json", "JSON, or @FILE"),
    EnvVar("PROTOCOL", "cli.protocol", _text, "sglang", "sglang (PUT and watch) or http"),
    EnvVar("TOKEN", "cli.token", _text, "s3cret", "bearer token (prefer TOKEN_FILE)"),
    EnvVar(
        "TOKEN_FILE",
        "cli.token_file",
        _text,
        "/var/run/secrets/bootstrap/token",
        "file holding the bearer token, read again before each request (rotation)",
    ),
    EnvVar("RANK_IP", "cli.rank_ip", _text, "10.0.0.5", "sets the payload's rank_ip"),
    EnvVar(
        "RANK_IP_ENV",
        "cli.rank_ip_env",
        _text,
        "POD_IP",
        "the variable that holds the payload's rank_ip (Kubernetes: status.podIP)",
    ),
    EnvVar("ETCD", "cli.etcd", _text, "http://127.0.0.1:2379", "instead of URL: etcd client URLs"),
    EnvVar("KEY", "cli.key", _text, "/services/prefill/rank0", "with ETCD: the key"),
    EnvVar("TTL", "cli.ttl", _seconds, "10", "with ETCD: the lease TTL, seconds"),
    EnvVar("ETCD_USER", "cli.etcd_user", _text, "registrar", "with ETCD: the etcd user"),
    EnvVar(
        "ETCD_PASSWORD",
        "cli.etcd_password",
        _text,
        "s3cret",
        "with ETCD_USER: the etcd password (from the environment only: no flag)",
    ),
    EnvVar("ETCD_CERT", "cli.etcd_cert", _text, "/etc/etcd/client.pem", "with ETCD: client cert"),
    EnvVar("ETCD_CERT_KEY", "cli.etcd_cert_key", _text, "/etc/etcd/client.key", "its key file"),
    EnvVar(
        "GATEWAY",
        "cli.gateway",
        _urls,
        "http://127.0.0.1:30000",
        "instead of URL: smg gateway URLs, comma-separated (docs/gateway.md)",
    ),
    EnvVar(
        "WORKER_URL", "cli.worker_url", _text, "http://10.0.0.5:30001", "with GATEWAY: the worker"
    ),
    EnvVar("WORKER_TYPE", "cli.worker_type", _worker_type, "prefill", "prefill, decode or regular"),
    EnvVar("BOOTSTRAP_PORT", "cli.bootstrap_port", _bootstrap_port, "8998", "a prefill's port"),
    EnvVar(
        "READY_URL",
        "cli.ready_url",
        _text,
        "http://127.0.0.1:30001/ready",
        "with GATEWAY: offer the worker only while this answers 2xx",
    ),
    EnvVar("READY_GRACE", "cli.ready_grace", _seconds, "10", "not ready this long: withdrawn"),
    EnvVar(
        "GATEWAY_KEY_FILE",
        "cli.gateway_key_file",
        _text,
        "/var/run/secrets/smg/key",
        "file holding the gateway's control-plane key (else $REGISTRAR_GATEWAY_KEY)",
    ),
    EnvVar(
        "DRAIN_TIMEOUT", "cli.drain_timeout", _seconds, "15", "at stop: wait this long for removal"
    ),
    EnvVar("HEALTH_HOST", "cli.health_host", _text, "0.0.0.0", "address of the health server"),
    EnvVar("HEALTH_PORT", "cli.health_port", parse_port, "8081", "port of the health server"),
    EnvVar(
        "EXPOSE_PAYLOAD", "cli.expose_payload", parse_flag, "false", "show the payload in /health"
    ),
    EnvVar("VERBOSE", "cli.verbose", parse_flag, "false", "log each request and route check"),
)


def options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
    table: Iterable[EnvVar] = ENV_VARS,
) -> dict[str, Any]:
    """`Registrar` keyword arguments from the variables that are set (unset or empty ones are
    left out, so the library's defaults stand), or `ConfigError` naming the variable.

    `names` restricts the table to some variables (their names after the prefix); `table`
    reads another table instead (e.g. the SGLang plugin's own, whose options are not
    `Registrar` arguments)."""
    env = os.environ if environ is None else environ
    wanted = None if names is None else frozenset(names)
    options: dict[str, Any] = {}
    backoff: dict[str, Any] = {}
    for var in table:
        if (wanted is not None and var.name not in wanted) or var.option.startswith("cli."):
            continue
        value = _read(var, env, prefix)
        if value is _UNSET:
            continue
        if var.option.startswith("backoff."):
            backoff[var.option.removeprefix("backoff.")] = value
        else:
            options[var.option] = value
    if backoff:
        try:
            options["backoff"] = replace(DEFAULT_BACKOFF, **backoff)
        except ConfigError as exc:
            set_by = ", ".join(prefix + v.name for v in ENV_VARS if v.option.startswith("backoff."))
            raise ConfigError(f"{exc} (check {set_by})") from None
    return options


_UNSET: Any = object()


def _read(var: EnvVar, env: Mapping[str, str], prefix: str) -> Any:
    key = prefix + var.name
    text = env.get(key, "").strip()
    if not text:
        return _UNSET
    try:
        return var.parse(text)
    except ValueError as exc:
        raise ConfigError(f"{key}={text!r} {exc}; e.g. {key}={var.example}") from None


def command_options_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    prefix: str = ENV_PREFIX,
    names: Iterable[str] | None = None,
) -> dict[str, Any]:
    """The options of `registrar register` alone (`cli.*` in the table) that are set, by
    option name (`health_port`), or `ConfigError` naming the variable. `names` restricts the
    table as for `options_from_env`."""
    env = os.environ if environ is None else environ
    wanted = None if names is None else frozenset(names)
    options: dict[str, Any] = {}
    for var in ENV_VARS:
        if var.option.startswith("cli.") and (wanted is None or var.name in wanted):
            value = _read(var, env, prefix)
            if value is not _UNSET:
                options[var.option.removeprefix("cli.")] = value
    return options


def describe_env(prefix: str = ENV_PREFIX, table: Iterable[EnvVar] = ENV_VARS) -> str:
    """One line per variable, for --help texts and docs."""
    return "\n".join(f"{prefix}{var.name}: {var.help} (e.g. {var.example})" for var in table)
