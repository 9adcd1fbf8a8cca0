"""`registrar register`: the options resolved (each flag given, else its variable), turned into
settings values, and the registrations they describe run until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import functools
import logging
import os
from pathlib import Path
from typing import Any

from ..._version import __version__
from ...core import _rules as rules
from ...core._backoff import Backoff
from ...core._board import State, Status
from ...core._errors import describe_exception
from ...core._group import RegistrarGroup
from ...core._redact import load_json
from ...core._registrar import Registrar
from ...core._registry import protocol_factory
from ...core._settings import LoopSettings, options_of
from ...protocols._sglang import bootstrap_token
from ...protocols._smg.settings import SmgSettings
from .._options import DEFAULT_HEALTH_HOST, ENV_PREFIX, OPTIONS
from .._verbose import log_request
from ..env import UNSET, read_variable, registrar_options
from ..health import start_health_server
from . import EXIT_OK, Signals, UsageError, log_setup

logger = logging.getLogger("registrar")


def resolve(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The options by key (none: the settings' default stands) and the flags given. A bad variable
    or repeated flag raises ConfigError; a flag given wins: its variable is not even read."""
    flags = {k: v for k, v in vars(args).items() if k != "command"}
    chosen: dict[str, Any] = {}
    for option in OPTIONS:
        value = flags.get(option.key, UNSET)
        if value is UNSET:
            value = read_variable(option, os.environ)
        elif option.repeat:  # the values joined, checked as the variable's would be
            joined = [item for given in value for item in given]
            value = rules.applied(str(option.flag_name), joined, option.check)
        if value is not UNSET:
            chosen[option.key] = value
    return chosen, flags


def _loop_options(chosen: dict[str, Any]) -> dict[str, Any]:
    """The chosen loop keywords of `Registrar`; the others keep their protocol's default."""
    return registrar_options(
        (o, chosen[o.key])
        for o in OPTIONS
        if o.settings in (LoopSettings, Backoff) and o.key in chosen
    )


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


def _token(chosen: dict[str, Any], flags: dict[str, Any]) -> Any:
    """A fixed token, a provider reading the token file before each request, or None: a flag
    before a variable, in `bootstrap_token`'s order (SGLang's own variable left to the protocol)."""
    if "token" in flags and "token_file" in flags:
        raise UsageError("give --token or --token-file, not both")
    return bootstrap_token(
        flags.get("token"),
        flags.get("token_file"),
        variable_file=None if "token_file" in flags else chosen.get("token_file"),
        variable=None if "token" in flags else chosen.get("token"),
        env={},
    )[0]


def _rank_ip(payload: dict[str, Any], chosen: dict[str, Any]) -> dict[str, Any]:
    rank_ip, name = chosen.get("rank_ip"), chosen.get("rank_ip_env")
    if rank_ip is None and name is not None:
        rank_ip = os.environ.get(name, "").strip()
        if not rank_ip:
            raise UsageError(f"--rank-ip-env {name}: the variable {name} is not set")
    return payload if rank_ip is None else {**payload, "rank_ip": rank_ip}


def _cert(chosen: dict[str, Any]) -> tuple[str, str] | None:
    cert, cert_key = chosen.get("etcd_cert"), chosen.get("etcd_cert_key")
    if (cert is None) != (cert_key is None):
        raise UsageError("--etcd-cert and --etcd-cert-key go together")
    return None if cert is None or cert_key is None else (cert, cert_key)


def _protocol_settings(chosen: dict[str, Any], flags: dict[str, Any], protocol: str) -> Any:
    """`--protocol NAME` (any registered protocol; `--etcd` and `--gateway` name theirs): its
    settings value, of the URL and the options that are its fields; one it has no field for is
    refused in one line naming both."""
    kind = protocol_factory(protocol).settings
    names = options_of(kind)
    given: dict[str, Any] = {}
    for option in OPTIONS:
        field = "token" if option.key == "token_file" else option.field
        loop = option.settings in (LoopSettings, Backoff)
        if loop or option.key in _MODES or option.key not in chosen or field is None:
            continue
        if field not in names:
            shown = option.flag_name if option.key in flags else ENV_PREFIX + option.name
            raise UsageError(
                f"{shown} is not an option of protocol {protocol!r} "
                f"(it takes {', '.join(names) or 'none'}, and the loop's)"
            )
        given[field] = chosen[option.key]
    if missing := [name for name in options_of(kind, required=True) if name not in given]:
        needed = [str(o.flag_name or o.name) for o in OPTIONS if o.field in missing]
        raise UsageError(f"protocol {protocol!r} needs {', '.join(needed or missing)}")
    if "token" in given:
        given["token"] = _token(chosen, flags)
    if "cert" in given:
        given["cert"] = _cert(chosen)
    url = chosen.get("gateway") or chosen.get("etcd") or chosen["url"]
    return kind(tuple(url) if isinstance(url, list) else url, **given)


_MODES = ("url", "protocol", "etcd", "gateway")  # where to register: the settings' first field


def _etcd(chosen: dict[str, Any]) -> None:
    """`--etcd`: the payload under `--key` in etcd (docs/etcd.md)."""
    if chosen.get("url") or chosen.get("protocol"):
        raise UsageError("--etcd replaces --url, --protocol and --token (etcd: --etcd-user)")
    if not chosen.get("key"):
        raise UsageError("--etcd needs --key, e.g. --key /services/prefill/rank0")
    if not chosen.get("etcd_user"):
        chosen.pop("etcd_password", None)
    elif not chosen.get("etcd_password"):
        raise UsageError(f"--etcd-user needs the password in ${ENV_PREFIX}ETCD_PASSWORD")


def _gateway(chosen: dict[str, Any]) -> None:
    """`--gateway`: the worker kept listed by each smg gateway (docs/gateway.md)."""
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


def _registrars(chosen: dict[str, Any], flags: dict[str, Any]) -> RegistrarGroup:
    """The registrations the options describe (the gateway's options only with --gateway)."""
    gateway = bool(chosen.get("gateway"))
    etcd = chosen.get("etcd") is not None
    protocol = chosen.get("protocol")
    if not gateway and (etcd or protocol is None):  # else the protocol's own refusals
        gateway_rows = [o for o in OPTIONS if o.settings is SmgSettings]
        if stray := [str(o.flag_name) for o in gateway_rows if chosen.get(o.key) is not None]:
            raise UsageError(f"{', '.join(stray)} go with --gateway (docs/gateway.md)")
    for required in () if gateway else ("payload",) if etcd else ("url", "payload"):
        if chosen.get(required) is None:
            raise UsageError(f"--{required} is required (or set {ENV_PREFIX}{required.upper()})")
    loop = _loop_options(chosen)
    if gateway:
        from ..._assembly import smg_group  # noqa: PLC0415 - only --gateway needs it

        _gateway(chosen)
        return smg_group(_protocol_settings(chosen, flags, "smg"), None, loop)
    if etcd:
        _etcd(chosen)
    source = "--payload" if "payload" in flags else f"{ENV_PREFIX}PAYLOAD"
    payload = _rank_ip(_payload(chosen["payload"], source), chosen)
    protocol = "etcd" if etcd else protocol or "sglang"
    settings = _protocol_settings(chosen, flags, protocol)
    return RegistrarGroup(
        [Registrar(payload=payload, protocol=protocol, settings=settings, **loop)]
    )


def _log_change(several: bool, old: State, new: State, status: Status) -> None:
    detail = f" ({status.last_error})" if status.last_error and new is State.FAILED else ""
    where = f"{status.url}: " if several else ""
    logger.info("%sstate %s -> %s%s", where, old.value, new.value, detail)


def cmd_register(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT, then stop together, within the longest drain any one needs."""
    chosen, flags = resolve(args)
    group = _registrars(chosen, flags)
    verbose = bool(chosen.get("verbose", False))
    log_setup(verbose, quiet=("registrar.surfaces.health",))
    several = len(group) > 1
    for reg in group:
        reg.add_listener(functools.partial(_log_change, several))
        if verbose:
            reg.add_request_listener(log_request)
    source: Any = group if several else group.members()[0]
    signals = Signals().install()  # before health answers: a SIGTERM from then on stops cleanly
    health = None
    host = chosen.get("health_host") or DEFAULT_HEALTH_HOST
    if (port := chosen.get("health_port")) is not None:
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
    logger.info("registrar %s: registering with %s%s", __version__, urls, where)
    group.start()
    try:
        signals.wait()
    finally:
        logger.info("stopping")
        # stop() ends a request in flight at once; a gateway's drain takes its own time.
        group.stop()
        if health is not None:
            health.stop()
    return EXIT_OK
