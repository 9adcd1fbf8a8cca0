"""The values the health parts pass each other instead of keyword lists: how an app answers
(`HealthOptions`, made once by the front doors `health_app`, `health_asgi_app`,
`start_health_server`) and what one document shows (`ProbeQuery`)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_OPTIONS", "HealthOptions", "ProbeQuery"]


@dataclass(frozen=True)
class HealthOptions:
    """How the endpoints answer, beyond the checks. The payload is shown only when asked for
    (it may name internal addresses); `service_id` defaults to the rank's address from the
    payload (`default_service_id`). The defaults here are the front doors' defaults."""

    expose_payload: bool = False
    service_id: str | None = None


DEFAULT_OPTIONS = HealthOptions()


@dataclass(frozen=True)
class ProbeQuery:
    """What one document shows: the checks of `probe`, or only its check `only`, less those
    named in `exclude` (Kubernetes' `/readyz/<name>` and `?exclude=<name>`)."""

    probe: str = "health"
    only: str | None = None
    exclude: tuple[str, ...] = ()
