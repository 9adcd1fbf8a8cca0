"""Rank processes forked from one process that imported SGLang once (a zygote), instead of each
importing torch and SGLang anew: a rank's start costs 4-5 CPU-seconds of imports, about 80 % of
what the suite spends on each of its ranks, and the matrix starts some 30 ranks per release on
two cores that CI shares with the end-to-end suites.

    python -m sglang_support.zygote SOCKET     (started by `Zygote`, one per pytest session)

The zygote imports what `sglang_support.rank` imports before its `main` runs anything: torch,
SGLang's KV manager, server arguments and plugin loader. It calls nothing of SGLang and loads
no plugin, so each rank still loads SGLang's plugins itself (`SGLANG_PLUGINS` and every
`REGISTRAR_*` variable are read in the rank, from the rank's own environment), and the rank's
`main` is the same code a fresh `python -m sglang_support.rank` runs. A test whose subject
happens at import (a module that cannot import, what importing registrar imports) starts its
process fresh, as before.

A request is one datagram on a `SOCK_SEQPACKET` socket: the command line, the environment and
the working directory as JSON, and the rank's stdin, stdout and stderr as file descriptors.
The zygote answers the child's PID, and later its exit code on the same connection once it
has reaped the child: `Forked` reads it there, so a rank looks to the tests like the
`subprocess.Popen` it was before (poll, wait, kill, its pipes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import IO, Any

__all__ = ["Forked", "Zygote"]

PRELOAD = (
    "torch",
    "sglang.srt.disaggregation.base.conn",
    "sglang.srt.disaggregation.common.conn",
    "sglang.srt.disaggregation.utils",
    "sglang.srt.server_args",
    "sglang.srt.plugins",
    "sglang_support.release",
)
"""What a rank imports before it does anything (sglang_support/rank.py)."""

MAX_REQUEST = 1 << 20


# ------------------------------------------------------------------------------ the zygote


def _preload() -> None:
    import importlib

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SGLang warns about every GPU-only feature on CPU
        for module in PRELOAD:
            importlib.import_module(module)
    # A fork copies only the thread that forks: a thread that held a lock at that moment
    # would leave the lock held in every rank. Importing must not have started one.
    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        raise SystemExit(f"zygote: importing SGLang started threads {threads}: cannot fork")


def _child(request: dict[str, Any], fds: list[int]) -> None:
    """In the forked process: become the command the request names, then exit with its code.
    The exit is `os._exit` after flushing the streams: unlike a fresh interpreter's, it runs no
    `atexit` handler and waits for no thread (the zygote's own, from torch and SGLang, are not
    the rank's to run). No test here asserts on what a rank does at exit; one that does must
    start its process fresh."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        sys.argv = list(request["argv"])
        code = 0
        if "code" in request:  # python -c CODE
            exec(compile(request["code"], "<string>", "exec"), {"__name__": "__main__"})
        else:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _spawn(
    listener: socket.socket, conn: socket.socket, children: dict[int, socket.socket]
) -> None:
    message, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    if not message:
        conn.close()
        return
    pid = os.fork()
    if pid == 0:
        listener.close()
        conn.close()
        for other in children.values():
            other.close()
        _child(json.loads(message), fds)
    for fd in fds:
        os.close(fd)
    conn.send(str(pid).encode())
    children[pid] = conn


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.send(str(os.waitstatus_to_exitcode(status)).encode())
            conn.close()


def serve(path: str) -> None:
    """Import, listen on `path`, say `ready`, then fork a rank per request until the end of
    standard input (the session's end): the ranks still running are then waited for a while,
    so that their CPU time is counted in the session's (`.ci/run` reports it per phase)."""
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(16)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        readable, _, _ = select.select([listener, sys.stdin], [], [], 0.2)
        if sys.stdin in readable and not os.read(sys.stdin.fileno(), 1):
            break
        if listener in readable:
            conn, _ = listener.accept()
            _spawn(listener, conn, children)
        _reap(children)
    deadline = time.monotonic() + 10
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)
    # Nothing to tear down that a rank needs, and torch's and SGLang's exit takes seconds.
    os._exit(0)


# ------------------------------------------------------------------------------ the client


class Forked:
    """A process the zygote forked, with what the suite uses of `subprocess.Popen`."""

    def __init__(
        self, argv: list[str], conn: socket.socket, pid: int, stdin: IO[str], stdout: IO[str] | None
    ) -> None:
        self.args = argv
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self.returncode: int | None = None
        self._conn = conn

    def _collect(self, timeout: float | None) -> int | None:
        if self.returncode is None:
            self._conn.settimeout(timeout)
            try:
                answer = self._conn.recv(64)
            except (TimeoutError, BlockingIOError):
                return None
            # An empty answer: the zygote is gone without reaping (killed with the session).
            self.returncode = int(answer) if answer else -signal.SIGKILL
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        return self._collect(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._collect(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _interpreter(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k.startswith("PYTHON")}


class Zygote:
    """The zygote process of one pytest session: started on first use, ended by the end of its
    input (killed by its PID if it does not end)."""

    def __init__(self, env: dict[str, str], cwd: Path) -> None:
        self._env = env
        self._cwd = cwd
        self._dir = tempfile.mkdtemp(prefix="zygote-")
        self._path = os.path.join(self._dir, "socket")
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def _started(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            return
        cmd = [sys.executable, "-m", "sglang_support.zygote", self._path]
        self._proc = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self._env,
            cwd=self._cwd,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if line.strip() != "ready":
            code = self._proc.wait(30)
            raise RuntimeError(f"the zygote did not start (exit {code}): see its stderr above")

    def spawn(
        self,
        command: list[str],
        env: dict[str, str],
        cwd: Path,
        stderr: IO[Any],
        stdout: IO[Any] | None = None,
    ) -> Forked:
        """`python *command` (`-m MODULE ARGS...` or `-c CODE`) in `env` and `cwd`, forked;
        stdin a pipe, stdout a pipe unless a file is given (text, as `Popen(text=True)`
        gives), stderr the given file."""
        flag, target, *argv = command
        if flag not in ("-m", "-c"):
            raise ValueError(f"the zygote runs `-m MODULE` or `-c CODE`, not {flag!r}")
        if _interpreter(env) != _interpreter(self._env):
            # sys.path and the interpreter's flags were set when the zygote started.
            raise ValueError(
                f"PYTHON* variables differ from the zygote's: start {command[:2]} fresh"
            )
        with self._lock:
            self._started()
        request: dict[str, Any] = {"env": env, "cwd": str(cwd)}
        if flag == "-m":
            request |= {"module": target, "argv": [target, *argv]}
        else:
            request |= {"code": target, "argv": ["-c", *argv]}
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe() if stdout is None else (-1, os.dup(stdout.fileno()))
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            conn.connect(self._path)
            socket.send_fds(conn, [json.dumps(request).encode()], [in_r, out_w, stderr.fileno()])
            pid = int(conn.recv(64))
        finally:
            os.close(in_r)
            os.close(out_w)
        pipe_in = io.TextIOWrapper(io.FileIO(in_w, "w"))
        pipe_out = None if out_r < 0 else io.TextIOWrapper(io.FileIO(out_r, "r"))
        return Forked([sys.executable, *command], conn, pid, pipe_in, pipe_out)

    def run(
        self, command: list[str], env: dict[str, str], cwd: Path, timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """As `subprocess.run(capture_output=True, text=True, check=False)` would, stdin empty."""
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            proc = self.spawn(command, env, cwd, err, stdout=out)
            proc.stdin.close()
            try:
                code = proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
                raise
            out.seek(0)
            err.seek(0)
            return subprocess.CompletedProcess(proc.args, code, out.read(), err.read())

    def stop(self) -> None:
        """End of its input ends the zygote (after it reaped its ranks); killed if it hangs."""
        proc = self._proc
        if proc is not None:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        with contextlib.suppress(OSError):
            os.unlink(self._path)
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)


if __name__ == "__main__":
    serve(sys.argv[1])
