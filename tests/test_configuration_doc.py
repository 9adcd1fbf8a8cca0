"""The docs list exactly what each surface reads: the configuration reference is the tables'
output, docs/sglang.md lists the plugin's variables, docs/cli.md the command's."""

from __future__ import annotations

import re
from pathlib import Path

from docs.hooks.envdoc import configuration_page
from registrar.integrations.sglang._settings import plugin_env_table
from registrar.surfaces._options import ENV_PREFIX
from registrar.surfaces._options import OPTIONS as ENV_VARS

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _section(page: str, heading: str) -> str:
    text = DOCS.joinpath(page).read_text()
    start = text.index(heading)
    end = text.find("\n## ", start + len(heading))
    return text[start : end if end != -1 else len(text)]


def _variables(text: str) -> set[str]:
    """Every variable a table row names, `_MAX`-style shorthands spelled out."""
    found: set[str] = set()
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        full = re.findall(rf"`({ENV_PREFIX}[A-Z_]+)`", line)
        found.update(full)
        if full:  # `REGISTRAR_BACKOFF_INITIAL`, `_MAX`: the shorthand shares the first's stem
            stem = full[0][: full[0].rindex("_")]
            found.update(stem + short for short in re.findall(r"`(_[A-Z_]+)`", line))
    return found


def test_the_configuration_reference_is_generated_from_the_tables() -> None:
    committed = DOCS.joinpath("configuration.md").read_text()
    assert committed == configuration_page(), (
        "docs/configuration.md is stale: python docs/hooks/envdoc.py > docs/configuration.md"
    )


def test_the_sglang_page_lists_exactly_what_the_plugin_reads() -> None:
    listed = _variables(_section("sglang.md", "## Configuration"))
    assert listed == {ENV_PREFIX + v.name for v in plugin_env_table()}


def test_the_cli_page_lists_exactly_what_the_command_reads() -> None:
    listed = _variables(_section("cli.md", "## `registrar register`"))
    assert listed == {ENV_PREFIX + v.name for v in ENV_VARS}
