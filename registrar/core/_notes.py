"""The loop's log lines by name, made into `Note`s: `decide` returns them, the runner logs them."""

from __future__ import annotations

import logging

from ._actions import Note

_INFO, _WARNING, _ERROR = logging.INFO, logging.WARNING, logging.ERROR
_LINES: dict[str, tuple[int, str]] = {
    "accepted": (_INFO, "%s with %s after %d attempt%s"),
    "adopted": (_INFO, "%s already holds our route (%s): adopted without registering again"),
    "ours arrived": (
        _INFO,
        "%s already holds our route (%s): our last attempt arrived though its answer was lost; "
        "not sent again",
    ),
    "sign": (
        _INFO,
        "%s: a sign the route may be gone (connection closed or watch event); checking in %.3f s",
    ),
    "held": (_INFO, "%s: not offered yet: %s"),
    "conflict": (
        _WARNING,
        "%s already holds our rank at another address (%s); registering anyway: a server that "
        "counts every registration (as SGLang's does) will count this rank twice",
    ),
    "hold": (
        _WARNING,
        "our last attempt to %s went unanswered and the server now says %s; it names no rank "
        "before the topology is ready, so the attempt may have arrived: not sending it again, "
        "looking again in %.2f s",
    ),
    "still refused": (_WARNING, "registration with %s still refused: %s; next attempt in %.2f s"),
    "route conflict": (_WARNING, "route conflict at %s: %s"),
    "refused": (
        _WARNING,
        "route check at %s failed: %s; probing every ~%.2f s until it listens again",
    ),
    "broken": (_INFO, "route check at %s failed: %s; checking again in ~%.2f s"),
    "check failed": (_WARNING, "route check at %s failed: %s; checking again at the next interval"),
    "lost": (_WARNING, "route at %s is missing (%s); registering again in %.2f s"),
    "failed": (_WARNING, "registration attempt %s to %s failed: %s; next attempt in %.2f s"),
    "failed, probing": (
        _WARNING,
        "registration attempt %s to %s failed: %s; next attempt in %.2f s "
        "(nothing listens: probing every ~%.2f s, the next counted attempt in %.2f s)",
    ),
    "refused for good": (
        _ERROR,
        "registration with %s refused: %s; retrying cannot help until the configuration is "
        "fixed; on_failure=%s",
    ),
    "given up": (_ERROR, "registration with %s failed after %d attempt%s, last: %s; on_failure=%s"),
    "retry": (_WARNING, "still trying in the background; next attempt in %.2f s"),
    "exit": (logging.CRITICAL, "ending the process with status %d (on_failure='exit')"),
    "unheeded": (
        _WARNING,
        "route reported missing %d time%s, but the server says %s (%s); not registering again",
    ),
}


def say(line: str, *args: object) -> Note:
    level, message = _LINES[line]
    return Note(level, message, args)
