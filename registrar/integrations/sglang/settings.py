"""What the SGLang plugin reads from the environment, and what it refuses.

Inside SGLang the plugin honours the `Registrar` options of the shared table
(`registrar.surfaces.env.ENV_VARS`), the token (`REGISTRAR_TOKEN`, `REGISTRAR_TOKEN_FILE`),
`REGISTRAR_VERBOSE`, and its own variables below. Every other variable of the shared table
means something only to `registrar register` (SGLang builds the URL and payload, and reports
registration on `/ready` and `/server_info`): set, it stops the process with one line naming it,
rather than being ignored while the operator believes it works. A `REGISTRAR_*` name close to a
known one (a typo) gets a WARNING.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...core.errors import ConfigError
from ...core.transport import file_token
from ...protocols.http import validate_token
from ...surfaces.env import (
    ENV_PREFIX,
    ENV_VARS,
    EnvVar,
    command_options_from_env,
    describe_env,
    options_from_env,
    parse_flag,
    parse_seconds_or_zero,
)
from .gateway import GatewayConfig

__all__ = [
    "HONOURED",
    "PLUGIN_ENV_VARS",
    "REFUSED",
    "PluginConfig",
    "describe_plugin_env",
    "near_misses",
    "plugin_env_table",
    "read_config",
]

PLUGIN_ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        "INIT_WAIT",
        "init_wait",
        parse_seconds_or_zero,
        "30",
        "seconds a prefill rank's init waits for its first registration (0, the default: none; "
        "registration goes on in the background either way)",
    ),
    EnvVar(
        "STRICT",
        "strict",
        parse_flag,
        "1",
        "a patch that cannot be applied stops the server at load (default: one ERROR, and "
        "SGLang's own behaviour stands for that part)",
    ),
)
"""The plugin's own variables (no other surface reads them)."""

_GATEWAY_HONOURED = ("GATEWAY", "WORKER_URL", "READY_GRACE", "GATEWAY_KEY_FILE", "DRAIN_TIMEOUT")
"""The gateway's variables the plugin honours (docs/gateway.md, docs/sglang.md)."""
_COMMAND_ONLY_HONOURED = ("TOKEN", "TOKEN_FILE", "VERBOSE", *_GATEWAY_HONOURED)

HONOURED: tuple[str, ...] = (
    *(v.name for v in ENV_VARS if not v.option.startswith("cli.")),
    *_COMMAND_ONLY_HONOURED,
)
"""The shared table's variables the plugin honours (names after the prefix)."""

_BUILT_BY_SGLANG = "SGLang builds each row's bootstrap URL and payload itself"
_NO_ETCD = "the plugin registers with SGLang's bootstrap server, not etcd"
_FROM_SERVER_ARGS = "with REGISTRAR_GATEWAY the plugin reads it from SGLang's own arguments"
_REPORTED_BY_SGLANG = "inside SGLang, /ready and /server_info report registration (docs/sglang.md)"

REFUSED: dict[str, str] = {
    "URL": _BUILT_BY_SGLANG,
    "PAYLOAD": _BUILT_BY_SGLANG,
    "RANK_IP": _BUILT_BY_SGLANG + " (the rank's address: --host, --dist-init-addr)",
    "RANK_IP_ENV": _BUILT_BY_SGLANG + " (the rank's address: --host, --dist-init-addr)",
    "PROTOCOL": "the plugin speaks SGLang's bootstrap protocol",
    "ETCD": _NO_ETCD,
    "KEY": _NO_ETCD,
    "TTL": _NO_ETCD,
    "ETCD_USER": _NO_ETCD,
    "ETCD_PASSWORD": _NO_ETCD,
    "ETCD_CERT": _NO_ETCD,
    "ETCD_CERT_KEY": _NO_ETCD,
    "HEALTH_HOST": _REPORTED_BY_SGLANG,
    "HEALTH_PORT": _REPORTED_BY_SGLANG,
    "EXPOSE_PAYLOAD": _REPORTED_BY_SGLANG,
    "WORKER_TYPE": _FROM_SERVER_ARGS + " (--disaggregation-mode)",
    "BOOTSTRAP_PORT": _FROM_SERVER_ARGS + " (--disaggregation-bootstrap-port)",
    "READY_URL": "with REGISTRAR_GATEWAY the server's own /ready gates the offer",
}
"""The shared table's variables that mean nothing inside SGLang, with the reason."""


def plugin_env_table() -> tuple[EnvVar, ...]:
    """Every variable the plugin reads: the honoured shared ones, then its own."""
    shared = tuple(v for v in ENV_VARS if v.name in HONOURED)
    return (*shared, *PLUGIN_ENV_VARS)


def describe_plugin_env(prefix: str = ENV_PREFIX) -> str:
    """One line per variable the plugin reads (what docs/sglang.md lists)."""
    return describe_env(prefix, plugin_env_table())


@dataclass(frozen=True)
class PluginConfig:
    """The plugin's settings, read and validated once, at plugin load."""

    registrar: Mapping[str, Any]
    """Keyword arguments for every `Registrar` the plugin starts (the token included)."""
    init_wait: float = 0.0
    strict: bool = False
    verbose: bool = False
    gateway: GatewayConfig | None = None
    """With `REGISTRAR_GATEWAY`: node 0's HTTP process keeps the server listed there."""
    warnings: tuple[str, ...] = field(default=())
    """One line each, for the log: names that look like a mistyped variable."""


def read_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """The settings from `REGISTRAR_*` variables, or `ConfigError` naming the variable (a bad
    value, or one the plugin cannot honour)."""
    env = os.environ if environ is None else environ
    for name, reason in REFUSED.items():
        key = ENV_PREFIX + name
        if env.get(key, "").strip():
            raise ConfigError(f"{key} is not read by the SGLang plugin: {reason}; unset it")
    options = options_from_env(env)
    command = command_options_from_env(env, names=_COMMAND_ONLY_HONOURED)
    own = options_from_env(env, table=PLUGIN_ENV_VARS)
    token = _token(command)
    if token is not None:
        options["token"] = token
    return PluginConfig(
        gateway=_gateway(command, options),
        registrar=options,
        init_wait=float(own.get("init_wait", 0.0)),
        strict=bool(own.get("strict", False)),
        verbose=bool(command.get("verbose", False)),
        warnings=tuple(near_misses(env)),
    )


def _gateway(command: Mapping[str, Any], options: Mapping[str, Any]) -> GatewayConfig | None:
    """The gateway settings, or None without `REGISTRAR_GATEWAY` (its companions alone are one
    line naming the missing variable)."""
    gateways = command.get("gateway")
    if not gateways:
        stray = [ENV_PREFIX + n for n in _GATEWAY_HONOURED[1:] if n.lower() in command]
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} go with {ENV_PREFIX}GATEWAY; set it or unset them"
            )
        return None
    if command.get("gateway_key_file") is not None:
        file_token(command["gateway_key_file"], f"{ENV_PREFIX}GATEWAY_KEY_FILE")  # checked now
    return GatewayConfig(
        gateways=tuple(gateways),
        worker_url=command.get("worker_url"),
        key_file=command.get("gateway_key_file"),
        grace=command.get("ready_grace"),
        drain_timeout=command.get("drain_timeout"),
        options=dict(options),
    )


def _token(command: Mapping[str, Any]) -> str | Callable[[], str | None] | None:
    """As `registrar register` reads them: the file (read before each request, for rotation)
    wins over the fixed token; neither leaves SGLang's own variable to the registrar."""
    path = command.get("token_file")
    if path is not None:
        return file_token(path, f"{ENV_PREFIX}TOKEN_FILE")
    token: str | None = command.get("token")
    return validate_token(token, f"{ENV_PREFIX}TOKEN")  # checked now, not in every rank


def near_misses(environ: Mapping[str, str]) -> list[str]:
    """A line for each set `REGISTRAR_*` name that is not a variable but is close to one."""
    known = {v.name for v in ENV_VARS} | {v.name for v in PLUGIN_ENV_VARS}
    lines = []
    for key in sorted(environ):
        name = key.removeprefix(ENV_PREFIX)
        if not key.startswith(ENV_PREFIX) or name in known:
            continue
        close = difflib.get_close_matches(name, known, n=1, cutoff=0.8)
        if close:
            lines.append(
                f"{key} is not a registrar variable (ignored); did you mean {ENV_PREFIX}{close[0]}?"
            )
    return lines
