"""The protocols registrar speaks, side by side, and the factories of the built-in ones
(`"sglang"`, `"http"`, `"smg"`). Importing this package registers nothing: `registrar.core.registry`
finds a protocol by name through the `registrar.protocols` entry-point group (the built-in ones
are declared there too, and known to the registry by name should the package's metadata be
missing). etcd needs a key and a TTL, which the registry's options do not carry: build it with
`registrar.etcd_registrar(...)` or pass `transport=EtcdTransport(...)`. `"smg"` adds a worker to
SGLang's model gateway with the defaults; `registrar.smg_registrar(...)` also sets readiness,
drain and the key file."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.registry import TransportOptions
from ..core.settings import HttpSettings, verify_fields
from ..core.transport import Token, Transport
from .etcd import EtcdTransport
from .http import HttpTarget, HttpTransport
from .sglang import SGLangTransport, token_from_env, token_source, validate_payload
from .smg import SmgSettings, SmgTransport, validate_spec

__all__ = [
    "EtcdTransport",
    "HttpTransport",
    "SGLangTransport",
    "SmgTransport",
    "http_protocol",
    "sglang_protocol",
    "smg_protocol",
]


def _http_settings(options: TransportOptions, token: Token | None) -> HttpSettings:
    """The HTTP settings `options` stand for (they were checked as such), with `token`."""
    return HttpSettings(
        options.url, timeout=options.timeout, token=token, **verify_fields(options.verify)
    )


def sglang_protocol(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    checked = validate_payload(payload)
    settings = _http_settings(options, token_from_env(options.token))
    target = HttpTarget(token_source=token_source(options.token))
    return SGLangTransport.from_settings(settings, target), checked


def http_protocol(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    return HttpTransport.from_settings(_http_settings(options, options.token)), dict(payload)


def smg_protocol(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    checked = validate_spec(payload)
    settings = SmgSettings(
        (options.url,),
        checked["url"],
        key=options.token,
        timeout=options.timeout,
        **verify_fields(options.verify),
    )
    return SmgTransport(settings), checked
