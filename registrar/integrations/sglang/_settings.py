"""What the SGLang plugin reads from the environment, and what it refuses: a variable that means
something only to `registrar register` stops the process with one line naming it, rather than
being ignored while the operator believes it works (docs/sglang.md "Configuration")."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...core import _rules as rules
from ...core._errors import ConfigError
from ...core._transport import file_token
from ...protocols._sglang import bootstrap_token
from ...protocols._smg.settings import SmgSettings
from ...surfaces._options import ENV_PREFIX, OPTIONS, Option, parse_flag, parse_seconds_or_zero
from ...surfaces.env import command_options_from_env, describe_env, options_from_env

# The plugin's own variables (no other surface reads them), rows like the options table's.
PLUGIN_ENV_VARS: tuple[Option, ...] = (
    Option(
        "INIT_WAIT",
        "30",
        "seconds a prefill rank's init waits for its first registration (0, the default: none; "
        "registration goes on in the background either way)",
        kwarg="init_wait",
        parse=parse_seconds_or_zero,
        rule=rules.seconds_or_zero,
    ),
    Option(
        "STRICT",
        "1",
        "a patch that cannot be applied stops the server at load (default: one ERROR, and "
        "SGLang's own behaviour stands for that part)",
        kwarg="strict",
        parse=parse_flag,
    ),
)

# Options table rows the plugin honours (no reason to refuse them); the gateway's, GATEWAY first.
HONOURED: tuple[str, ...] = tuple(v.name for v in OPTIONS if v.plugin is None)
_GATEWAY_HONOURED = tuple(v for v in OPTIONS if v.plugin is None and v.settings is SmgSettings)
REFUSED: dict[str, str] = {v.name: v.plugin for v in OPTIONS if v.plugin is not None}


def plugin_env_table() -> tuple[Option, ...]:
    """Every variable the plugin reads: the honoured shared ones, then its own."""
    return (*(v for v in OPTIONS if v.name in HONOURED), *PLUGIN_ENV_VARS)


def describe_plugin_env(prefix: str = ENV_PREFIX) -> str:
    """One line per variable the plugin reads (what docs/sglang.md lists)."""
    return describe_env(prefix, plugin_env_table())


@dataclass(frozen=True)
class GatewayConfig:
    """`REGISTRAR_GATEWAY` and its companions: the `SmgSettings` fields they set (the worker is
    SGLang's, known at start) and the `Registrar` options the gateway registrations share."""

    smg: Mapping[str, Any]
    loop: Mapping[str, Any]


@dataclass(frozen=True)
class PluginConfig:
    """Read and validated once, at plugin load."""

    registrar: Mapping[str, Any]  # keyword arguments for every `Registrar` (the token included)
    init_wait: float = 0.0
    strict: bool = False
    verbose: bool = False
    gateway: GatewayConfig | None = None
    warnings: tuple[str, ...] = ()  # names that look like a mistyped variable


def read_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """The `REGISTRAR_*` settings, or `ConfigError` naming a bad or refused variable."""
    env = os.environ if environ is None else environ
    for name, reason in REFUSED.items():
        key = ENV_PREFIX + name
        if env.get(key, "").strip():
            raise ConfigError(f"{key} is not read by the SGLang plugin: {reason}; unset it")
    options = options_from_env(env)
    command = command_options_from_env(env, names=HONOURED)  # the token, VERBOSE, the gateway's
    own = options_from_env(env, table=PLUGIN_ENV_VARS)
    # As `registrar register` reads them, checked now, not per rank; SGLang's sources: each row's.
    token, _ = bootstrap_token(
        variable_file=command.get("token_file"), variable=command.get("token"), env={}
    )
    if token is not None:
        options["token"] = token
    return PluginConfig(
        gateway=_gateway(command, options),
        registrar=options,
        verbose=bool(command.get("verbose")),
        warnings=tuple(near_misses(env)),
        **own,  # init_wait, strict: unset, the defaults above stand
    )


def _gateway(command: Mapping[str, Any], options: Mapping[str, Any]) -> GatewayConfig | None:
    """None without `REGISTRAR_GATEWAY` (its companions alone are a `ConfigError`)."""
    gateways = command.get("gateway")
    if not gateways:
        stray = [ENV_PREFIX + o.name for o in _GATEWAY_HONOURED[1:] if o.key in command]
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} go with {ENV_PREFIX}GATEWAY; set it or unset them"
            )
        return None
    if command.get("gateway_key_file") is not None:
        file_token(command["gateway_key_file"], f"{ENV_PREFIX}GATEWAY_KEY_FILE")  # checked now
    smg = {str(o.field): command[o.key] for o in _GATEWAY_HONOURED if o.key in command}
    # The bootstrap token and the failure policy are a prefill rank's, not the gateway's.
    return GatewayConfig(
        smg={**smg, "gateways": tuple(gateways), **_picked(options, ("timeout", "verify"))},
        loop=_picked(options, ("backoff", "max_retry_after", "watch_interval")),
    )


def _picked(options: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    return {name: options[name] for name in names if name in options}


def near_misses(environ: Mapping[str, str]) -> list[str]:
    """A line for each set `REGISTRAR_*` name that is not a variable but is close to one."""
    known = {v.name for v in OPTIONS} | {v.name for v in PLUGIN_ENV_VARS}
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
