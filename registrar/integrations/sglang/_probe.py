"""What the installed SGLang has (targets.Probe): imported, in SGLang's processes, or read from its
source (`registrar sglang`, which must work where SGLang's dependencies are missing or heavy)."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import pkgutil
from functools import cache
from pathlib import Path
from typing import Any


class ImportProbe:
    """Imports each path's module, as HookRegistry would."""

    def has(self, path: str) -> bool:
        try:
            pkgutil.resolve_name(path)
        except Exception:  # a missing module, attribute, or an import that fails
            return False
        return True

    def own(self, path: str) -> bool:
        owner, _, name = path.rpartition(".")
        found = pkgutil.resolve_name(owner) if self.has(owner) else None
        return isinstance(found, type) and name in found.__dict__

    def source(self, path: str) -> str | None:
        try:
            return inspect.getsource(inspect.unwrap(pkgutil.resolve_name(path)))
        except Exception:  # a builtin, a C extension, no file
            return None


def sglang_root() -> Path | None:
    """The installed `sglang` package directory, found without importing it."""
    try:
        spec = importlib.util.find_spec("sglang")
    except (ImportError, ValueError):
        return None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) if locations else None


class SourceProbe:
    """Reads SGLang's source under `root` with `ast`, importing nothing: a class's methods (through
    its bases, those imported from SGLang too), module-level functions, assignments, imports."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def has(self, path: str) -> bool:
        return self._find(path) is not None

    def own(self, path: str) -> bool:
        owner, _, name = path.rpartition(".")
        found = self._find(owner)
        node = found[1] if found is not None else None
        return isinstance(node, ast.ClassDef) and name in _members(node)

    def source(self, path: str) -> str | None:
        found = self._find(path)
        return None if found is None else ast.get_source_segment(*found)

    def _find(self, path: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        parts = path.split(".")
        if parts[0] != "sglang":
            return None
        for end in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module file
            base = self.root.joinpath(*parts[1:end])
            module = _parse(str(base.with_suffix(".py"))) or _parse(str(base / "__init__.py"))
            if module is not None:
                return self._walk(module, ".".join(parts[:end]), parts[end:], depth)
        return None

    def _walk(
        self, module: tuple[str, ast.Module], name: str, attrs: list[str], depth: int
    ) -> tuple[str, ast.AST] | None:
        text, node = module
        top = _members(node)
        found = top.get(attrs[0])
        if isinstance(found, str):  # `from X import attr`: look there
            return self._find(f"{found}.{'.'.join(attrs)}", depth + 1) if depth < 8 else None
        if found is None or len(attrs) == 1:
            return None if found is None else (text, found)
        if not isinstance(found, ast.ClassDef) or len(attrs) != 2:
            return None
        member = _members(found).get(attrs[1])
        if isinstance(member, ast.AST):
            return text, member
        for base in found.bases:  # inherited: a base defined here or imported from sglang
            if isinstance(base, ast.Name) and depth < 8:
                origin = top.get(base.id)
                where = f"{origin}" if isinstance(origin, str) else f"{name}.{base.id}"
                inherited = self._find(f"{where}.{attrs[1]}", depth + 1)
                if inherited is not None:
                    return inherited
        return None


def _members(node: ast.Module | ast.ClassDef) -> dict[str, Any]:
    """Names defined in a module or class body: defs and classes (their node), assignments
    (their node), `from sglang... import x` (the full dotted name, a string), `import x`."""
    found: dict[str, Any] = {}
    for item in node.body:
        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            found[item.name] = item
        elif isinstance(item, ast.Assign | ast.AnnAssign):
            targets = item.targets if isinstance(item, ast.Assign) else [item.target]
            found.update({t.id: item for t in targets if isinstance(t, ast.Name)})
        elif isinstance(item, ast.ImportFrom) and item.level == 0 and item.module:
            for alias in item.names:
                found[alias.asname or alias.name] = f"{item.module}.{alias.name}"
        elif isinstance(item, ast.Import):
            found.update({(a.asname or a.name).split(".")[0]: item for a in item.names})
    return found


@cache
def _parse(file: str) -> tuple[str, ast.Module] | None:
    try:
        text = Path(file).read_text(encoding="utf-8")
        return text, ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return None
