"""registrar inside SGLang, through SGLang's plugin system (entry point
`registrar = registrar.integrations.sglang:load` in `sglang.srt.plugins`; docs/sglang.md).
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
