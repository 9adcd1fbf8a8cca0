"""SGLang loads plugins before it configures logging (its `configure_logger`, in every process):
until then the root logger drops INFO records (the active line) and has at most a stand-in
handler of SGLang's imports. So while the plugin's INFO would be dropped, its records are held,
and handed on once a configuration that sets the level has run (`logging.basicConfig(level=...)`
or `force=True`, as `configure_logger` calls it, or `dictConfig`, SGLANG_LOGGING_CONFIG_PATH's),
or at exit: in SGLang's format, at SGLang's level, each record once."""

from __future__ import annotations

import atexit
import functools
import logging
import logging.config
from typing import Any

_NAME = "registrar"  # the plugin's loggers all sit under it
_HOLDING = 1  # the level `_NAME` holds at: below DEBUG, and not one anybody else sets
_MAX = 200  # records held at most


class _Held(logging.Handler):
    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.before = logger.level, logger.propagate
        self.configs = {"basicConfig": logging, "dictConfig": logging.config}
        self.own = {name: getattr(module, name) for name, module in self.configs.items()}

    def emit(self, record: logging.LogRecord) -> None:
        if len(self.records) < _MAX:
            self.records.append(record)


_held: _Held | None = None


def _then_hand_on(configure: Any) -> Any:
    @functools.wraps(configure)
    def configure_then_hand_on(*args: Any, **kwargs: Any) -> Any:
        result = configure(*args, **kwargs)
        if configure.__name__ == "dictConfig" or "level" in kwargs or kwargs.get("force"):
            hand_on()  # not a bare `basicConfig(format=...)` (SGLang's hub logger at import)
        return result

    return configure_then_hand_on


def hold() -> None:
    """Hold the plugin's records until the host's logging is set up; nothing if it lets the
    plugin's INFO through already."""
    global _held
    plugin = logging.getLogger(_NAME)
    if _held is not None or plugin.isEnabledFor(logging.INFO):
        return
    _held = _Held(plugin)
    plugin.addHandler(_held)
    plugin.setLevel(_HOLDING)  # the records exist; the host's level decides when handed on
    plugin.propagate = False  # held, not printed now by a stand-in handler and again later
    for name, module in _held.configs.items():
        setattr(module, name, _then_hand_on(_held.own[name]))
    atexit.register(hand_on)  # never configured: WARNINGs and above still reach stderr


def hand_on() -> None:
    """Stop holding; each held record goes to its logger's handlers if its level is enabled."""
    global _held
    held, _held = _held, None
    if held is None:
        return
    plugin = logging.getLogger(_NAME)
    plugin.removeHandler(held)
    plugin.propagate = held.before[1]
    if plugin.level == _HOLDING:  # else set meanwhile (REGISTRAR_VERBOSE): kept
        plugin.setLevel(held.before[0])
    for name, module in held.configs.items():
        if getattr(getattr(module, name), "__wrapped__", None) is held.own[name]:
            setattr(module, name, held.own[name])  # still ours: the original again
    for record in held.records:
        owner = logging.getLogger(record.name)
        if owner.isEnabledFor(record.levelno):
            owner.handle(record)
