"""The loop's log lines by name, made into `Note`s: `decide` returns them, the runner logs them."""

from __future__ import annotations

from logging import CRITICAL, ERROR, INFO, WARNING

from ._actions import Note

_LINES: dict[str, tuple[int, str]] = {
    "accepted": (INFO, "%s with %s after %d attempt%s"),
    "adopted": (INFO, "%s already holds our route (%s): adopted without registering again"),
    "ours arrived": (
        INFO,
        "%s already holds our route (%s): our last attempt arrived though its answer was lost; "
        "not sent again",
    ),
    "sign": (
        INFO,
        "%s: a sign the route may be gone (connection closed or watch event); checking in %.3f s",
    ),
    "held": (INFO, "%s: not offered yet: %s"),
    "conflict": (
        WARNING,
        "%s already holds our rank at another address (%s); registering anyway: a server that "
        "counts every registration (as SGLang's does) will count this rank twice",
    ),
    "hold": (
        WARNING,
        "our last attempt to %s went unanswered and the server now says %s; it names no rank "
        "before the topology is ready, so the attempt may have arrived: not sending it again, "
        "looking again in %.2f s",
    ),
    "still refused": (WARNING, "registration with %s still refused: %s; next attempt in %.2f s"),
    "route conflict": (WARNING, "route conflict at %s: %s"),
    "refused": (
        WARNING,
        "route check at %s failed: %s; probing every ~%.2f s until it listens again",
    ),
    "broken": (INFO, "route check at %s failed: %s; checking again in ~%.2f s"),
    "check failed": (WARNING, "route check at %s failed: %s; checking again at the next interval"),
    "lost": (WARNING, "route at %s is missing (%s); registering again in %.2f s"),
    "failed": (WARNING, "registration attempt %s to %s failed: %s; next attempt in %.2f s"),
    "failed, probing": (
        WARNING,
        "registration attempt %s to %s failed: %s; next attempt in %.2f s "
        "(nothing listens: probing every ~%.2f s, the next counted attempt in %.2f s)",
    ),
    "refused for good": (
        ERROR,
        "registration with %s refused: %s; retrying cannot help until the configuration is "
        "fixed; on_failure=%s",
    ),
    "given up": (ERROR, "registration with %s failed after %d attempt%s, last: %s; on_failure=%s"),
    "retry": (WARNING, "still trying in the background; next attempt in %.2f s"),
    "exit": (CRITICAL, "ending the process with status %d (on_failure='exit')"),
    "unheeded": (
        WARNING,
        "route reported missing %d time%s, but the server says %s (%s); not registering again",
    ),
}


def say(line: str, *args: object) -> Note:
    level, message = _LINES[line]
    return Note(level, message, args)
