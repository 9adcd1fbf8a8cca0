"""A stand-in for torchvision, which SGLang imports unconditionally but never uses on the code
paths these tests run. PyPI's torchvision cannot load beside the CPU build of torch the suite
pins, so a meta-path finder serves empty modules for `torchvision` and its submodules instead.

Availability probes (`importlib.util.find_spec`, as transformers uses to decide whether to
touch torchvision's API) are told the package is absent, so nothing reads attributes that the
empty modules do not have; only real imports get the stand-in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType

__all__ = ["install"]

ROOTS = ("torchvision",)


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", maxsplit=1)[0] not in ROOTS:
            return None
        # Frame 1 is importlib's _find_spec; frame 2 is the import system, or
        # importlib.util.find_spec for a probe that only asks whether the package exists.
        if sys._getframe(2).f_code.co_name == "find_spec":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []  # a package, so any submodule import is served too


def install() -> None:
    """Put the stand-in first on the meta path (once per process)."""
    if not any(isinstance(finder, _StandIn) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StandIn())
