"""The protocols registrar speaks, side by side, and the factories of the built-in ones
(`"sglang"`, `"http"`, `"smg"`). Importing this package registers nothing: `registrar.core.registry`
finds a protocol by name through the `registrar.protocols` entry-point group (the built-in ones
are declared there too, and known to the registry by name should the package's metadata be
missing). etcd needs a key and a TTL, which the registry's options do not carry: build it with
`registrar.etcd_registrar(...)` or pass `transport=EtcdTransport(...)`. `"smg"` adds a worker to
SGLang's model gateway with the defaults; `registrar.smg_registrar(...)` also sets readiness,
drain and the key file."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..core.registry import TransportOptions
from ..core.transport import Transport
from .etcd import EtcdTransport
from .http import HttpTransport
from .sglang import SGLangTransport, token_from_env, token_source, validate_payload
from .smg import KEY_ENV, SmgTransport, validate_spec

__all__ = [
    "EtcdTransport",
    "HttpTransport",
    "SGLangTransport",
    "SmgTransport",
    "http_protocol",
    "sglang_protocol",
    "smg_protocol",
]


def sglang_protocol(
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


def http_protocol(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
    transport = HttpTransport(
        options.url, token=options.token, timeout=options.timeout, verify=options.verify
    )
    return transport, dict(payload)



def smg_protocol(
    payload: Mapping[str, Any], options: TransportOptions
) -> tuple[Transport, dict[str, Any]]:
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
