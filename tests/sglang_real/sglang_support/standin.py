"""A stand-in for torchvision, which SGLang imports unconditionally but never uses on the code
paths these tests run. PyPI's torchvision cannot load beside the CPU build of torch the suite
pins, so a meta-path finder serves empty modules for `torchvision` and its submodules instead.

Availability probes (`importlib.util.find_spec`, as transformers uses to decide whether to
touch torchvision's API) are told the package is absent, so nothing reads attributes that the
empty modules do not have; only real imports get the stand-in. That holds after such an import
too (SGLang 0.5.19-0.5.20 import `torchvision.io` in `sglang.srt.utils.common`, before
transformers probes): `importlib.util.find_spec` answers None for a stand-in module it would
find in `sys.modules`.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any, NoReturn

__all__ = ["install"]

ROOTS = ("torchvision",)

VISIBLE_BELOW = (5, 19)
"""transformers releases before 5.19 (those SGLang 0.5.13-0.5.21 pin) need torchvision for
`AutoImageProcessor`, which SGLang registers processors with at import: there the stand-in is
visible to the probes, says it is 0.28.0 (boot/torchvision-0.28.0.dist-info, the release built
for torch 2.13) and answers every public name with a placeholder."""


class _Placeholder:
    """Any name read from a visible stand-in: readable at import, never usable."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Placeholder:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Placeholder(f"{self._name}.{attr}")

    def __call__(self, *args: object, **kwargs: object) -> NoReturn:
        raise RuntimeError(f"{self._name}: the test suite's torchvision stand-in, not usable")

    def __repr__(self) -> str:
        return f"<torchvision stand-in {self._name}>"


def _visible() -> bool:
    try:
        found = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        return False
    major, minor = (int(part) for part in found.split(".")[:2])
    return (major, minor) < VISIBLE_BELOW


class _StandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, visible: bool) -> None:
        self.visible = visible

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", maxsplit=1)[0] not in ROOTS:
            return None
        # Frame 1 is importlib's _find_spec; frame 2 is the import system, or
        # importlib.util.find_spec for a probe that only asks whether the package exists.
        if not self.visible and sys._getframe(2).f_code.co_name == "find_spec":
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module object

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []  # a package, so any submodule import is served too
        if self.visible:
            name = module.__name__
            module.__version__ = "0.28.0"  # type: ignore[attr-defined]

            def placeholder(attr: str) -> _Placeholder:
                if attr.startswith("__"):
                    raise AttributeError(attr)
                return _Placeholder(f"{name}.{attr}")

            module.__getattr__ = placeholder  # type: ignore[method-assign]


def _probe(real: Any) -> Any:
    """`importlib.util.find_spec`, answering None for a module the stand-in serves."""

    def find_spec(name: str, package: str | None = None) -> Any:
        found = real(name, package)
        if found is not None and isinstance(found.loader, _StandIn) and not found.loader.visible:
            return None
        return found

    find_spec.standin = True  # type: ignore[attr-defined]
    return find_spec


def install() -> None:
    """Put the stand-in first on the meta path, and the probe in place (once per process)."""
    if not any(isinstance(finder, _StandIn) for finder in sys.meta_path):
        sys.meta_path.insert(0, _StandIn(_visible()))
    if not getattr(importlib.util.find_spec, "standin", False):
        importlib.util.find_spec = _probe(importlib.util.find_spec)
