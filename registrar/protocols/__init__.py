"""The protocols registrar speaks, side by side; importing this package registers the built-in
ones (`"sglang"`, `"http"`) with `registrar.core.registry`. etcd needs a key and a TTL, which
the registry's options do not carry: build it with `etcd_registrar(...)` or pass
`transport=EtcdTransport(...)`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core.registry import TransportOptions, register_protocol
from ..core.transport import Transport
from .etcd import EtcdTransport, etcd_registrar
from .http import HttpTransport
from .sglang import SGLangTransport, token_from_env, token_source, validate_payload

__all__ = ["EtcdTransport", "HttpTransport", "SGLangTransport", "etcd_registrar"]


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


register_protocol("sglang", _sglang)
register_protocol("http", _http)
