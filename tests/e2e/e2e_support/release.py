"""What registrar's plugin installs on the SGLang this suite runs against, from the plugin's own
target table (read from SGLang's source, as `registrar sglang` does, without importing it): the
tests follow the table, so a hook added to it later is expected by them at once."""

from __future__ import annotations

from functools import cache

from registrar.integrations.sglang._probe import SourceProbe, sglang_root
from registrar.integrations.sglang._targets import (
    Plan,
    Target,
    installed_version,
    parse_release,
    plan,
)

__all__ = ["has_feature", "hidden_by_override", "installed_targets", "release_plan"]


@cache
def release_plan() -> Plan:
    root = sglang_root()
    if root is None:
        raise AssertionError("no SGLang installed beside this interpreter")
    return plan(SourceProbe(root), parse_release(installed_version()))


def installed_targets() -> list[Target]:
    """Every target the plugin hooks on this release."""
    return release_plan().taken()


def has_feature(name: str) -> bool:
    """Whether this release has a target for the table's feature `name`."""
    return any(c.target is not None for c in release_plan().choices if c.feature.name == name)


def hidden_by_override(targets: list[Target]) -> set[str]:
    """The targets a Mooncake deployment never calls: a base-class method whose Mooncake
    override the table hooks as well because it does not call `super()` (condition `own`;
    `_on_heartbeat_success` on 0.5.13-0.5.19). The plugin hooks the base for other backends."""
    overridden = {t.path.rsplit(".", 1)[1] for t in targets if t.condition == "own"}
    return {
        t.path for t in targets if t.condition != "own" and t.path.rsplit(".", 1)[1] in overridden
    }
