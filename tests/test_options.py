"""Each option is defined once, in the options table (registrar/surfaces/_options.py): the
environment reader, the command's flags and --help, the SGLang plugin's tables and
docs/configuration.md all come from it, and a row added to it appears in all four."""

from __future__ import annotations

import argparse
import inspect
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

from docs.hooks.envdoc import configuration_page
from registrar.core._settings import HttpSettings, LoopSettings, default_of
from registrar.integrations.sglang._settings import HONOURED, PLUGIN_ENV_VARS, REFUSED
from registrar.protocols._etcd.settings import EtcdSettings
from registrar.surfaces._options import ENV_PREFIX, OPTIONS
from registrar.surfaces.cli import build_parser
from registrar.surfaces.env import options_from_env


def _register_parser() -> argparse.ArgumentParser:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["register"]


def test_the_env_reader_reads_the_table() -> None:
    assert inspect.signature(options_from_env).parameters["table"].default is OPTIONS
    assert len({o.name for o in OPTIONS}) == len(OPTIONS)


def test_the_register_flags_are_the_tables() -> None:
    flags = {
        flag
        for action in _register_parser()._actions
        for flag in action.option_strings
        if flag.startswith("--") and not flag.startswith("--no-") and flag != "--help"
    }
    assert flags == {o.flag_name for o in OPTIONS if o.flag}
    # The documented exception: the etcd password comes from the environment only.
    assert [o.name for o in OPTIONS if not o.flag] == ["ETCD_PASSWORD"]


def test_the_plugin_tables_are_the_tables() -> None:
    names = {o.name for o in OPTIONS}
    assert set(HONOURED) | set(REFUSED) == names
    assert not set(HONOURED) & set(REFUSED)
    assert not {o.name for o in PLUGIN_ENV_VARS} & names


def test_the_docs_page_lists_the_tables() -> None:
    listed = set(re.findall(rf"^\| `{ENV_PREFIX}([A-Z_]+)`", configuration_page(), re.M))
    assert listed == {o.name for o in OPTIONS} | {o.name for o in PLUGIN_ENV_VARS}


def test_help_shows_the_defaults_of_the_settings_classes() -> None:
    text = " ".join(_register_parser().format_help().split())
    http, etcd = default_of(HttpSettings, "timeout"), default_of(EtcdSettings, "timeout")
    assert http != etcd
    assert f"(default: {http:g}; with --etcd: {etcd:g})" in text
    assert f"(default: {default_of(LoopSettings, 'max_attempts')})" in text


def test_a_row_added_to_the_table_appears_in_all_four() -> None:
    code = textwrap.dedent(
        """
        import argparse, os
        import registrar.surfaces._options as options
        options.OPTIONS = (
            *options.OPTIONS,
            options.Option("NEW_KNOB", "true", "a knob added in one row", parse=options.parse_flag),
        )
        from registrar.surfaces.env import command_options_from_env
        from registrar.surfaces.cli import build_parser
        from registrar.surfaces.cli._register import resolve
        from registrar.integrations.sglang._settings import HONOURED, plugin_env_table
        from docs.hooks.envdoc import configuration_page

        assert command_options_from_env({"REGISTRAR_NEW_KNOB": "yes"}) == {"new_knob": True}
        args = build_parser().parse_args(["register", "--no-new-knob"])
        os.environ["REGISTRAR_NEW_KNOB"] = "true"  # the flag wins
        assert resolve(args)[0]["new_knob"] is False
        assert "NEW_KNOB" in HONOURED
        assert "NEW_KNOB" in {v.name for v in plugin_env_table()}
        assert "| `REGISTRAR_NEW_KNOB` | `--new-knob` | yes | a knob added in one row |" in (
            configuration_page()
        )
        print("all four")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "all four"


def test_a_bad_flag_names_the_flag_and_a_bad_variable_the_variable() -> None:
    run = [sys.executable, "-m", "registrar", "register"]
    flag = subprocess.run(
        [*run, "--backoff-jitter", "2"], capture_output=True, text=True, timeout=60, check=False
    )
    assert (
        "argument --backoff-jitter: must be a number within [0, 1], got '2'; "
        "e.g. --backoff-jitter 0.25" in flag.stderr
    )
    env = subprocess.run(
        run,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"REGISTRAR_TIMEOUT": "-1", "PATH": "/usr/bin:/bin"},
    )
    assert (
        "REGISTRAR_TIMEOUT='-1' must be a positive number of seconds; e.g. REGISTRAR_TIMEOUT=5"
        in env.stderr
    )


def test_a_loop_option_is_its_settings_field_and_its_row(tmp_path: Path) -> None:
    """Done on a copy of the package: two lines in `LoopSettings` (the field, its rule) and a
    row in the table, no other file, and `Registrar`, the variable, the flag, the plugin's
    table and the docs page all take it."""
    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "registrar", tmp_path / "registrar")
    shutil.copytree(root / "docs" / "hooks", tmp_path / "docs" / "hooks")
    settings = tmp_path / "registrar" / "core" / "_settings.py"
    text = settings.read_text()
    field = "    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES\n"
    rule = '        "max_payload_bytes": rules.count,\n'
    assert field in text and rule in text  # noqa: PT018 - both anchors must exist
    text = text.replace(field, field + "    max_knob: int = 3\n")
    settings.write_text(text.replace(rule, rule + '        "max_knob": rules.count,\n'))
    options = tmp_path / "registrar" / "surfaces" / "_options.py"
    table = "OPTIONS: tuple[Option, ...] = (\n"
    row = '    _loop("MAX_KNOB", integer, "4", "a knob added in one row", metavar="N"),\n'
    options.write_text(options.read_text().replace(table, table + row))
    code = textwrap.dedent(
        """
        from registrar import ConfigError, Registrar
        from registrar.integrations.sglang._settings import HONOURED
        from registrar.surfaces.cli import build_parser
        from registrar.surfaces.cli._register import _loop_options, resolve
        from registrar.surfaces.env import options_from_env
        from docs.hooks.envdoc import configuration_page

        url, payload = "http://127.0.0.1:1", {"a": 1}
        assert Registrar(url, payload, protocol="http").settings.max_knob == 3
        options = options_from_env({"REGISTRAR_MAX_KNOB": "4"})
        assert options == {"max_knob": 4}
        assert Registrar(url, payload, protocol="http", **options).settings.max_knob == 4
        chosen = resolve(build_parser().parse_args(["register", "--max-knob", "5"]))[0]
        loop = _loop_options(chosen)
        assert Registrar(url, payload, protocol="http", **loop).settings.max_knob == 5
        try:
            Registrar(url, payload, protocol="http", max_knob=0)
        except ConfigError as exc:
            assert str(exc).startswith("max_knob must be a positive integer"), exc
        else:
            raise AssertionError("max_knob=0 was accepted")
        assert "MAX_KNOB" in HONOURED
        assert "| `REGISTRAR_MAX_KNOB` | `--max-knob` | yes | a knob added in one row | 3 |" in (
            configuration_page()
        )
        print("one field, one row")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "one field, one row"
