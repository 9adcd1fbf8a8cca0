"""The project's promises about itself: CI runs the README's test command."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_readme_test_command() -> None:
    readme = ROOT.joinpath("README.md").read_text()
    ci = ROOT.joinpath(".ci", "run").read_text()
    command = "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]'"
    assert f"{command} && .venv/bin/python -m pytest" in readme
    assert command in ci
    assert "\n.venv/bin/python -m pytest\n" in ci
