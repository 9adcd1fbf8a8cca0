"""The factories of the built-in protocols, each built from its settings value; importing this
registers nothing: the registry finds them by entry point (docs/index.md, "Package layout")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._registry import ProtocolFactory
from ..core._settings import HttpSettings
from ..core._transport import Transport
from ._etcd.settings import EtcdSettings
from ._etcd.transport import EtcdTransport
from ._http import HttpTransport
from ._sglang import SGLangTransport, validate_payload
from ._smg.settings import SmgSettings, validate_spec, worker_spec
from ._smg.transport import SmgTransport


def _sglang(payload: Mapping[str, Any], s: HttpSettings) -> tuple[Transport, dict[str, Any]]:
    return SGLangTransport(s), validate_payload(payload)


def _http(payload: Mapping[str, Any], s: HttpSettings) -> tuple[Transport, dict[str, Any]]:
    return HttpTransport(s), dict(payload)


def _etcd(payload: Mapping[str, Any], s: EtcdSettings) -> tuple[Transport, dict[str, Any]]:
    return EtcdTransport(s), dict(payload)


def _smg(payload: Mapping[str, Any], s: SmgSettings) -> tuple[Transport, dict[str, Any]]:
    """The payload is the worker's spec; with `worker_url` set, the fields it adds to it."""
    if s.worker_url is None:
        return SmgTransport(s), validate_spec(payload)
    return SmgTransport(s), worker_spec(s.worker_url, s.worker_type, s.bootstrap_port, **payload)


sglang_protocol = ProtocolFactory(_sglang)
http_protocol = ProtocolFactory(_http)
etcd_protocol = ProtocolFactory(_etcd, EtcdSettings)
smg_protocol = ProtocolFactory(_smg, SmgSettings)

__all__ = ["etcd_protocol", "http_protocol", "sglang_protocol", "smg_protocol"]
