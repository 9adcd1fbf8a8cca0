"""registrar inside SGLang, through SGLang's plugin system (entry point
`registrar = registrar.integrations.sglang:load` in `sglang.srt.plugins`; docs/sglang.md).
Importing this package imports no SGLang: only `load()` (called by SGLang) does."""

from __future__ import annotations

from ._plugin import load
from ._rows import rank_summary
from ._settings import describe_plugin_env

__all__ = ["describe_plugin_env", "load", "rank_summary"]
