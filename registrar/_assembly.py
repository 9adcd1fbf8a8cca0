"""The front doors of etcd and smg: the one place importing both `registrar.core` and
`registrar.protocols` (docs/architecture.md, "Settings and options")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Unpack

from .core import _rules as rules
from .core._group import RegistrarGroup
from .core._registrar import Registrar
from .core._settings import LoopOptions, split_options
from .protocols._etcd.settings import EtcdOptions, EtcdSettings
from .protocols._smg.settings import SmgOptions, SmgSettings, worker_spec
from .protocols._smg.transport import SmgTransport


class EtcdRegistrarOptions(LoopOptions, EtcdOptions, total=False):
    """`etcd_registrar`'s keywords: the loop's and `EtcdSettings`' fields."""


class SmgRegistrarOptions(LoopOptions, SmgOptions, total=False):
    """`smg_registrar(s)`' keywords: the loop's, `SmgSettings`' fields, and `spec` (more fields
    of the gateway's WorkerSpec)."""

    spec: Mapping[str, Any]


def etcd_registrar(
    endpoints: str | Sequence[str],
    key: str,
    payload: Mapping[str, Any],
    **options: Unpack[EtcdRegistrarOptions],
) -> Registrar:
    """A `Registrar` keeping `payload` under `key` in etcd (not started): `protocol="etcd"` with
    an `EtcdSettings` of the options that are its fields (docs/etcd.md)."""
    given: dict[str, Any] = dict(options)
    settings = EtcdSettings(endpoints, key, **split_options(given, EtcdSettings))
    return Registrar(payload=payload, protocol="etcd", settings=settings, **given)


def smg_registrar(
    gateway: str,
    worker_url: str,
    worker_type: str = "regular",
    **options: Unpack[SmgRegistrarOptions],
) -> Registrar:
    """A `Registrar` keeping the worker at `worker_url` listed by the smg gateway at `gateway`
    (not started; docs/gateway.md)."""
    return smg_registrars((gateway,), worker_url, worker_type, **options).members()[0]


def smg_registrars(
    gateways: Sequence[str],
    worker_url: str,
    worker_type: str = "regular",
    **options: Unpack[SmgRegistrarOptions],
) -> RegistrarGroup:
    """One `smg_registrar` per gateway (an HA pair, a mesh), each with its own state, as one
    group (started and stopped together; health shows each)."""
    given: dict[str, Any] = dict(options)
    spec = given.pop("spec", None)
    fields = split_options(given, SmgSettings)
    return smg_group(SmgSettings(tuple(gateways), worker_url, worker_type, **fields), spec, given)


def smg_group(
    settings: SmgSettings, spec: Mapping[str, Any] | None, loop: Mapping[str, Any]
) -> RegistrarGroup:
    """The builder of every smg front door (the library's and the SGLang plugin's): one
    `Registrar` per gateway of `settings`, `loop` the `Registrar` options (`LoopOptions`)."""
    worker = rules.applied("worker_url", settings.worker_url, rules.url)
    payload = worker_spec(worker, settings.worker_type, settings.bootstrap_port, **dict(spec or {}))
    clock = loop.get("clock")
    members = [
        Registrar(payload=payload, transport=SmgTransport(settings, url, clock=clock), **loop)
        for url in settings.gateways
    ]
    return RegistrarGroup(members, stop_timeout=settings.stop_timeout)
