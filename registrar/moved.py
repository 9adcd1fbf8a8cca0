"""The import paths of release 0.1.0, kept working with a DeprecationWarning.

0.2.0 put the modules in folders that show the architecture (`core`, `protocols`, `surfaces`,
`devtools`). Code written against 0.1.0 (`from registrar.health import start_health_server`)
still imports: a finder on `sys.meta_path` answers each old name with the module that now holds
it, once, with a warning naming the new path. They go away in 1.0 (CHANGELOG.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

__all__ = ["MOVED", "install"]

MOVED: dict[str, str] = {
    "registrar.backoff": "registrar.core.backoff",
    "registrar.clock": "registrar.core.clock",
    "registrar.errors": "registrar.core.errors",
    "registrar.machine": "registrar.core.machine",
    "registrar.outcome": "registrar.core.outcome",
    "registrar.redact": "registrar.core.redact",
    "registrar.registrar": "registrar.core.registrar",
    "registrar.status": "registrar.core.status",
    "registrar.transport": "registrar.protocols.http",
    "registrar.sglang": "registrar.protocols.sglang",
    "registrar.health": "registrar.surfaces.health",
    "registrar.metrics": "registrar.surfaces.metrics",
    "registrar.cli": "registrar.surfaces.cli",
    "registrar.bootstrap_server": "registrar.devtools.bootstrap_server",
    "registrar.demo": "registrar.devtools.demo",
}
"""Old module path (0.1.0) -> the module that holds its contents now."""

ALSO: dict[str, dict[str, str]] = {
    "registrar.transport": {"Transport": "registrar.core.transport"},
}
"""Names an old module held that now live in another module than the rest."""


class _Alias(importlib.abc.Loader):
    """Loads an old name as the new module itself (one module object, not a copy)."""

    def __init__(self, old: str, new: str) -> None:
        self.old = old
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 2 skips the import machinery's frames: the warning points at the import.
        warnings.warn(
            f"{self.old} moved to {self.new} in 0.2.0; import it from there "
            "(the old path goes away in 1.0)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(self.new)
        extra = ALSO.get(self.old)
        if not extra:
            return module
        # Several new homes: a module of the old name that holds the new one's names and these.
        combined = ModuleType(self.old, module.__doc__)
        combined.__dict__.update(
            {k: v for k, v in vars(module).items() if not k.startswith("__")},
        )
        for name, home in extra.items():
            setattr(combined, name, getattr(importlib.import_module(home), name))
        combined.__all__ = [*getattr(module, "__all__", ()), *extra]  # type: ignore[attr-defined]
        return combined

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the new module is already executed."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(fullname, new))


_FINDER = _MovedFinder()


def install() -> None:
    """Put the finder on `sys.meta_path` (once)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
