"""The protocols registrar speaks, side by side; importing this package registers the built-in
ones (`"sglang"`, `"http"`, `"smg"`) with `registrar.core.registry`. etcd needs a key and a
TTL, which the registry's options do not carry: build it with `etcd_registrar(...)` or pass
`transport=EtcdTransport(...)`. `"smg"` adds a worker to SGLang's model gateway with the
defaults; `smg_registrar(...)` also sets readiness, drain and the key file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..core.registry import TransportOptions, register_protocol
from ..core.transport import Transport
from .etcd import EtcdTransport, etcd_registrar
from .http import HttpTransport
from .sglang import SGLangTransport, token_from_env, token_source, validate_payload
from .smg import KEY_ENV, SmgTransport, smg_registrar, smg_registrars, validate_spec

__all__ = [
    "EtcdTransport",
    "HttpTransport",
    "SGLangTransport",
    "SmgTransport",
    "etcd_registrar",
    "smg_registrar",
    "smg_registrars",
]


def _sglang(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    checked = validate_payload(payload)
    transport = SGLangTransport(
        options.url,
        token=token_from_env(options.token),
        token_source=token_source(options.token),
        timeout=options.timeout,
        verify=options.verify,
    )
    return transport, checked


def _http(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    transport = HttpTransport(
        options.url, token=options.token, timeout=options.timeout, verify=options.verify
    )
    return transport, dict(payload)


def _smg(payload: Mapping[str, Any], options: TransportOptions) -> tuple[Transport, dict[str, Any]]:
    checked = validate_spec(payload)
    token = options.token if options.token is not None else (os.environ.get(KEY_ENV) or None)
    transport = SmgTransport(
        options.url,
        token=token,
        token_source="token" if options.token is not None else f"${KEY_ENV}",
        timeout=options.timeout,
        verify=options.verify,
    )
    return transport, checked


register_protocol("sglang", _sglang)
register_protocol("smg", _smg)
register_protocol("http", _http)
