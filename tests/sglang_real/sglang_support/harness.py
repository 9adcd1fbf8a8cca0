"""The pieces the real-SGLang tests share: rank processes, SGLang's bootstrap server, waiting."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import socket
import subprocess
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from sglang_support.zygote import Forked

HERE = Path(__file__).resolve().parent.parent
BOOT = HERE / "sglang_support" / "boot"
ROOT = HERE.parent.parent


def child_env(**extra: str) -> dict[str, str]:
    """The environment of a process the suite starts: the torchvision stand-in loads first,
    registrar is this checkout's (the shared SGLang environment's editable install points
    at whichever checkout built or refreshed it last), and a rank publishes 127.0.0.1 as its
    `rank_ip` (without `SGLANG_HOST_IP`, SGLang publishes the machine's outside address, which
    node 0's `/ready` then connects to)."""
    env = {"SGLANG_HOST_IP": "127.0.0.1", **os.environ}
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BOOT), str(HERE), str(ROOT), env.get("PYTHONPATH", "")) if p
    )
    env.update(extra)
    return env


def import_quietly(module: str) -> Any:
    """Import a piece of SGLang; it warns about every GPU-only feature when loaded on CPU."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return importlib.import_module(module)


class Rank:
    """A rank process (sglang_support/rank.py): its JSON lines, its commands, its end."""

    def __init__(self, proc: subprocess.Popen[str] | Forked, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.lines: list[dict[str, Any]] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self.lines.append(json.loads(line))
                self._cond.notify_all()
        with self._cond:
            self._cond.notify_all()

    def event(self, name: str, timeout: float = 240.0, after: int = 0) -> dict[str, Any]:
        """The first `name` line from index `after` on, waiting for it. A rank's start imports
        SGLang and torch (10-20 CPU-seconds): with CI's lanes beside it on two cores, 120 s was
        missed by a rank that started and registered; the tests' own limit is 300 s."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for line in self.lines[after:]:
                    if line.get("event") == name:
                        return line
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(
                        f"no {name!r} from the rank (exit {self.proc.poll()}); its log:\n"
                        + self.log.read_text()[-4000:]
                    )
                self._cond.wait(min(left, 0.5))

    def command(self, text: str, reply: str) -> dict[str, Any]:
        with self._cond:
            after = len(self.lines)
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()
        return self.event(reply, after=after)

    def status(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.command("status", "status")["rows"]
        return rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                assert self.proc.stdin is not None
                self.proc.stdin.close()
                self.proc.wait(10)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.proc.kill()
                self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


class Server:
    """SGLang's real CommonKVBootstrapServer, started and closed on one port."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.instance: Any = None

    def start(self) -> Server:
        conn = import_quietly("sglang.srt.disaggregation.common.conn")
        self.instance = conn.CommonKVBootstrapServer("127.0.0.1", self.port)
        assert wait_for(self._listening, 10), f"bootstrap server not listening on {self.port}"
        return self

    def _listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def close(self) -> None:
        if self.instance is not None:
            server = self.instance
            loop = getattr(server, "_loop", None)
            if loop is not None and loop.is_running():
                # SGLang's close() stops the loop with its cleanup task still pending, which
                # asyncio reports at exit ("Task was destroyed but it is pending!"): cancel it
                # first; the loop's own cleanup then lets it finish. Every task of the loop, as
                # the releases before 0.5.19 keep no reference to it (`_background_tasks`).
                loop.call_soon_threadsafe(
                    lambda: [task.cancel() for task in asyncio.all_tasks(loop)]
                )
            server.close()
            self.instance = None

    @property
    def count(self) -> int:
        """Accepted PUTs in this server's lifetime (the real server counts every one)."""
        return int(self.instance._registered_count) if self.instance is not None else 0

    def rows(self) -> set[tuple[int, int, int, int]]:
        table = self.instance.prefill_port_table if self.instance is not None else {}
        return {
            (dp, cp, tp, pp)
            for dp, cps in table.items()
            for cp, tps in cps.items()
            for tp, pps in tps.items()
            for pp in pps
        }


def wait_for(predicate: Any, timeout: float = 30.0, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def registered(rank: Any, timeout: float = 60.0) -> bool:
    """Wait until the rank's first registrar says registered: a server counts a PUT before the
    rank has read the answer, so a count alone does not say the rank's state."""
    return wait_for(lambda: rank.status()[0]["state"] == "registered", timeout=timeout)


# What upstream's blocking loop writes on each failed attempt (test_upstream.py meets it).
UPSTREAM_ATTEMPT = "Prefill register attempt"


def checked(rank: Any, times: int = 2, timeout: float = 30.0) -> bool:
    """Wait until each of the rank's registrars has made `times` more route checks (its
    `last_check_at` moved on that often, or more between two looks): each found the route in
    place, or it would have sent a PUT. The point to count PUTs at, instead of a sleep."""
    first = {json.dumps(row["rank"]): [row.get("last_check_at")] for row in rank.status()}

    def moved() -> bool:
        for row in rank.status():
            seen = first.setdefault(json.dumps(row["rank"]), [None])
            if row.get("last_check_at") != seen[-1]:
                seen.append(row.get("last_check_at"))
        return all(len(seen) > times for seen in first.values())

    return wait_for(moved, timeout=timeout)


def assert_init_left_registration_to_the_background(rank: Any) -> None:
    """Init returned with the server down, and upstream's blocking retry loop never ran: not one
    of its attempts is in the log, and the plugin says it registers in the background. What
    the rank shows, not how long init took (a loaded machine makes any init slow)."""
    log = rank.log.read_text()
    assert UPSTREAM_ATTEMPT not in log, log
    assert "in the background (registrar" in log, log
    assert all(row["state"] in ("registering", "failed") for row in rank.status())


def assert_one_put_each(server: Any, procs: list[Any], rows: set[Any], lifetime: int) -> None:
    """In this lifetime of the bootstrap server: every row in, each rank registered once more
    (its `lifetime + 1`th), checked twice after its PUT without another, one PUT per rank."""
    assert wait_for(lambda: server.rows() == rows, timeout=60), server.rows()
    for proc in procs:
        assert wait_for(lambda p=proc: p.status()[0]["registrations"] == lifetime + 1)
        assert checked(proc)  # two checks after its PUT: no second PUT
    assert server.count == len(procs), f"lifetime {lifetime}: {server.count} PUTs"
