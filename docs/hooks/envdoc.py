"""docs/configuration.md, drawn from the options table (`registrar.surfaces._options.OPTIONS`),
the flags the command's parser really has, the settings classes' defaults and the SGLang
plugin's own table, so the reference cannot drift from what the code reads:

    python docs/hooks/envdoc.py > docs/configuration.md

tests/test_configuration_doc.py checks the committed page equals this output.
"""

from __future__ import annotations

import argparse
import sys

from registrar.integrations.sglang._settings import HONOURED, PLUGIN_ENV_VARS, REFUSED
from registrar.protocols._sglang import TOKEN_ENV
from registrar.surfaces._options import ENV_PREFIX, OPTIONS, Option
from registrar.surfaces.cli import build_parser

__all__ = ["configuration_page", "main"]

_HEAD = f"""\
# Configuration reference

Every `{ENV_PREFIX}*` variable, and which surface reads it. This page is generated from the
tables in the code (`python docs/hooks/envdoc.py > docs/configuration.md`); a test fails
when the two differ.

- **`registrar register`** (the sidecar, [cli.md](cli.md)): every variable it reads has a flag of
  the same name, except where this page says none; **the flag wins**.
- **SGLang plugin** ([sglang.md](sglang.md)): read once when the plugin loads. A variable it
  cannot honour is **refused**: set, it stops the server with one line naming it, rather than
  being ignored. A name close to a variable's (a typo) gets a WARNING.
- **Library**: `registrar.surfaces.env.options_from_env()` turns the `Registrar` options (the
  rows read by both surfaces, except the token and `VERBOSE`) into keyword arguments.

A bad value is one line naming the variable and showing a good one, e.g.
`{ENV_PREFIX}MAX_ATTEMPTS='many' must be an integer >= 1, or unlimited; e.g.
{ENV_PREFIX}MAX_ATTEMPTS=5`. Unset and empty variables leave the defaults, shown here as the
settings classes define them (`registrar.core._settings`, `registrar.protocols.*_settings`).
On/off options have a `--name` and a `--no-name` flag.

| variable | `registrar register` | SGLang plugin | meaning | default | example |
|---|---|---|---|---|---|
"""

_TAIL = f"""
Without a token from these, the library reads `{TOKEN_ENV}` (the variable of SGLang's
upcoming bootstrap authentication, [sglang.md](sglang.md#the-token)).
"""


def _flags() -> set[str]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    register = sub.choices["register"]
    return {flag for action in register._actions for flag in action.option_strings}


def _command_column(var: Option, flags: set[str]) -> str:
    flag = "--" + var.name.lower().replace("_", "-")
    if flag in flags:
        return f"`{flag}`"
    return "yes (no flag)"


def _plugin_column(var: Option) -> str:
    if var.name in HONOURED:
        return "yes"
    return f"refused: {REFUSED[var.name]}"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def configuration_page() -> str:
    """The whole page, as committed in docs/configuration.md."""
    flags = _flags()
    rows = [
        f"| `{ENV_PREFIX}{v.name}` | {_command_column(v, flags)} | {_cell(_plugin_column(v))} "
        f"| {_cell(v.help)} | {_cell(v.default_text())} | `{v.example}` |"
        for v in OPTIONS
    ]
    rows += [
        f"| `{ENV_PREFIX}{v.name}` | no | yes (plugin only) | {_cell(v.help)} | "
        f"{_cell(v.default_text())} | `{v.example}` |"
        for v in PLUGIN_ENV_VARS
    ]
    return _HEAD + "\n".join(rows) + "\n" + _TAIL


def main() -> int:
    sys.stdout.write(configuration_page())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
