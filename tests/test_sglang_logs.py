"""The plugin's records reach the host's log whatever order the host configures logging in
(registrar/integrations/sglang/_logs.py): SGLang loads plugins first and configures logging
after, so what the plugin logs at load is held until then. Each case is a fresh interpreter:
logging's state is per process, as in SGLang's."""

from __future__ import annotations

import subprocess
import sys

import pytest

LOAD = (
    "import logging, logging.config, sys\n"
    "from registrar.integrations.sglang._logs import hold\n"
    "log = logging.getLogger('registrar.integrations.sglang.plugin')\n"
    "hold()\n"
    "log.info('active %s', 1)\n"
    "log.warning('a warning')\n"
    "log.debug('a debug line')\n"
    "logging.getLogger('other').info('not ours')\n"
)
SGLANG_FORMAT = "format='[%(asctime)s TP0] %(message)s', datefmt='%H:%M:%S', stream=sys.stdout"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )


@pytest.mark.parametrize("force", [True, False])
def test_held_records_reach_the_handler_configured_after_in_its_format_once(force: bool) -> None:
    done = _run(
        LOAD + f"logging.basicConfig(level=logging.INFO, {SGLANG_FORMAT}, force={force})\n"
        "log.info('after')\n"
        "logging.basicConfig(level=logging.INFO, force=True)\n"  # a second configure: no replay
    )
    lines = done.stdout.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["active 1", "a warning", "after"]
    assert all(line.startswith("[") and " TP0] " in line for line in lines)
    assert done.stderr == ""  # nothing went to logging's last resort, nothing twice
    # SGLang's own functions are back in place once handed on.
    again = _run(
        LOAD + f"logging.basicConfig(level=logging.INFO, {SGLANG_FORMAT})\n"
        "assert logging.basicConfig.__module__ == 'logging', logging.basicConfig\n"
        "assert logging.getLogger('registrar').level == logging.NOTSET\n"
    )
    assert again.stderr == ""


def test_sglang_level_rules_apply_to_what_was_held() -> None:
    done = _run(LOAD + f"logging.basicConfig(level=logging.WARNING, {SGLANG_FORMAT})\n")
    assert [line.split("] ", 1)[1] for line in done.stdout.splitlines()] == ["a warning"]


@pytest.mark.parametrize("keep", [True, False])
def test_dict_config_hands_on_too_with_its_rules(keep: bool) -> None:
    """SGLANG_LOGGING_CONFIG_PATH: a config that disables existing loggers disables ours."""
    done = _run(
        LOAD + "logging.config.dictConfig({'version': 1, 'handlers': {'h': {'class': "
        "'logging.StreamHandler', 'stream': 'ext://sys.stdout'}}, 'root': {'level': 'INFO', "
        f"'handlers': ['h']}}, 'disable_existing_loggers': {not keep}}})\n"
    )
    assert done.stdout.splitlines() == (["active 1", "a warning"] if keep else [])


def test_a_bare_basic_config_before_does_not_end_the_hold() -> None:
    """SGLang's imports call `basicConfig(format=...)` (its hub logger) before load: a handler,
    the level still WARNING. Nothing is printed through it, and all once SGLang's comes."""
    done = _run(
        "import logging, sys\n"
        "logging.basicConfig(format='early %(message)s', stream=sys.stdout)\n"
        + LOAD
        + "logging.basicConfig(format='bare %(message)s')\n"
        + f"logging.basicConfig(level=logging.INFO, {SGLANG_FORMAT}, force=True)\n"
    )
    lines = done.stdout.splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["active 1", "a warning"]


def test_never_configured_warnings_still_reach_stderr_at_exit() -> None:
    done = _run(LOAD)
    assert done.stdout == ""
    assert done.stderr.splitlines() == ["a warning"]  # logging's last resort, as without holding


def test_configured_before_load_nothing_is_held() -> None:
    done = _run(
        f"import logging, sys\nlogging.basicConfig(level=logging.INFO, {SGLANG_FORMAT})\n{LOAD}"
    )
    lines = [line.split("] ", 1)[1] for line in done.stdout.splitlines()]
    assert lines == ["active 1", "a warning", "not ours"]
