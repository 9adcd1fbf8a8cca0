"""registrar inside SGLang, through SGLang's plugin system: no change to SGLang's source.

`pip install sglang-registrar` into SGLang's environment registers the entry point
`registrar = registrar.integrations.sglang:load` in the `sglang.srt.plugins` group; SGLang's
`load_plugins()` then loads it in every process it starts (the launcher, each scheduler, ...),
filtered by `SGLANG_PLUGINS` like any plugin. See docs/sglang.md.

Importing this package imports no SGLang: only `load()` (called by SGLang) does.
"""

from __future__ import annotations

from .plugin import ACTIVE, SUPPORTED_VERSIONS, TARGETS, load, verify
from .rows import DISTRIBUTION, rank_summary
from .settings import (
    HONOURED,
    PLUGIN_ENV_VARS,
    REFUSED,
    PluginConfig,
    describe_plugin_env,
    plugin_env_table,
    read_config,
)
from .tables import bootstrap_summary, table_complete

__all__ = [
    "ACTIVE",
    "DISTRIBUTION",
    "HONOURED",
    "PLUGIN_ENV_VARS",
    "REFUSED",
    "SUPPORTED_VERSIONS",
    "TARGETS",
    "PluginConfig",
    "bootstrap_summary",
    "describe_plugin_env",
    "load",
    "plugin_env_table",
    "rank_summary",
    "read_config",
    "table_complete",
    "verify",
]
