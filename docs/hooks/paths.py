"""MkDocs hook: a backquoted path to a file of this repository (`registrar/core/_board.py`,
`tests/sglang_real/`, ...) must exist, and a backquoted dotted name (`registrar.surfaces.env`)
must import without a DeprecationWarning, so a page cannot cite a module that moved. Logged as
a warning, which `mkdocs build --strict` turns into a failed build."""

from __future__ import annotations

import logging
import pkgutil
import re
import sys
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.paths")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout's registrar, whatever is installed
_DOTTED = re.compile(r"`(registrar(?:\.[A-Za-z_]\w*)+)[`(]")
_PATH = re.compile(
    r"`((?:registrar|tests|benchmarks|scripts|docs)/[\w.\-/]*?)"  # a repository path
    r"(?:[:(][^`]*)?`"  # then maybe `:name` or `(...)`
)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    for match in _PATH.finditer(markdown):
        path = match.group(1).rstrip("/")
        if "*" in path or "<" in path:
            continue
        if not (ROOT / path).exists():
            log.warning("%s cites %s, which does not exist", page.file.src_path, match.group(1))
    for match in _DOTTED.finditer(markdown):
        problem = _unresolved(match.group(1))
        if problem:
            log.warning("%s cites %s: %s", page.file.src_path, match.group(1), problem)
    return markdown


def _unresolved(name: str) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        try:
            pkgutil.resolve_name(name)
        except DeprecationWarning as exc:
            return str(exc)
        except (ImportError, AttributeError, ValueError) as exc:
            return f"{type(exc).__name__}: {exc}"
    return None
