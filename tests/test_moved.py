"""The 0.1.0 import paths still work, each with a DeprecationWarning naming the new one."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest

from registrar.moved import ALSO, MOVED

# What each module of 0.1.0 exported (its __all__), as that release had it.
RELEASE_0_1_0 = {
    "registrar.backoff": ["Backoff", "contact_delay"],
    "registrar.health": ["HealthServer", "health_app", "is_live", "start_health_server"],
    "registrar.bootstrap_server": ["BootstrapServer", "Fault"],
    "registrar.transport": ["HttpTransport", "Transport", "parse_retry_after", "validate_url"],
    "registrar.machine": ["State", "Trigger", "TRANSITIONS", "mermaid_diagram"],
    "registrar.registrar": ["Registrar", "DEFAULT_BACKOFF"],
    "registrar.sglang": ["SGLangTransport", "rank_of", "validate_payload"],
}


@pytest.fixture
def forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test imports the old names afresh (an import already done warns no more)."""
    for old in MOVED:
        monkeypatch.delitem(sys.modules, old, raising=False)
        monkeypatch.delattr("registrar." + old.rsplit(".", 1)[1], raising=False)


@pytest.mark.usefixtures("forget")
@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_path_imports_the_new_module_with_a_warning(old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"^{old} moved to {new} in 0\.2\.0") as caught:
        module = importlib.import_module(old)
    assert len(caught) == 1
    current = importlib.import_module(new)
    if old in ALSO:
        for name in ALSO[old]:
            assert getattr(module, name) is not None
    else:
        assert module is current
    for name in getattr(current, "__all__", ()):
        assert getattr(module, name) is getattr(current, name)


@pytest.mark.usefixtures("forget")
@pytest.mark.parametrize(("old", "names"), sorted(RELEASE_0_1_0.items()))
def test_what_0_1_0_exported_is_still_there(old: str, names: list[str]) -> None:
    with pytest.warns(DeprecationWarning, match=f"^{old} moved"):
        module = importlib.import_module(old)
    for name in names:
        assert hasattr(module, name), f"{old}.{name}"


@pytest.mark.usefixtures("forget")
def test_from_import_of_an_old_module_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match="registrar.health moved") as caught:
        from registrar import health  # noqa: PLC0415
    assert caught[0].filename == __file__  # the warning points at the import, not importlib
    from registrar.surfaces.health import start_health_server  # noqa: PLC0415

    assert health.start_health_server is start_health_server


def test_the_current_paths_do_not_warn() -> None:
    code = (
        "import warnings\nwarnings.simplefilter('error')\n"
        "import registrar, registrar.surfaces.health, registrar.devtools.bootstrap_server\n"
        "import registrar.surfaces.cli, registrar.integrations.sglang\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_no_module_of_the_package_uses_an_old_path() -> None:
    from pathlib import Path  # noqa: PLC0415

    root = Path(importlib.import_module("registrar").__file__).parent  # type: ignore[arg-type]
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                absolute = node.module if node.level == 0 else None
                assert absolute not in MOVED, f"{path}: {absolute}"
