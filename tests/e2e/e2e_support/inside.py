"""Test-only pieces that run inside SGLang's own processes, installed at interpreter start-up by
boot/sitecustomize.py (the suite puts that folder on the launched servers' PYTHONPATH). No file of
SGLang is changed and nothing here ships in registrar's wheel.

- `sgl_kernel`: SGLang imports it at module level, and the package index has only CUDA builds.
  For a dense Llama with `torch_native` attention on a CPU without AMX nothing in it is called,
  so an import-only stand-in serves; every attribute is a function that raises if called.
- Mooncake's sender advertises `supports_host_tensor_indices = True`, which takes a path through
  `pin_memory` and `torch.cuda.Event`; on CPU it is set to False once the module is imported
  (and the start-up fails loudly if the attribute moved, so a new SGLang is noticed; releases
  before 0.5.23 have neither the attribute nor the path).
- The bootstrap server (in the prefill's HTTP process): with `E2E_CONTROL_DIR` set, a small
  control server on 127.0.0.1 lets the test hold its start (`E2E_BOOTSTRAP_HOLD=1`), start it,
  stop it and start a fresh one on the same port, and read each lifetime's PUT count and its
  accepted PUTs per rank. With `E2E_BOOTSTRAP_REFUSE_TP=N` the server answers the PUTs of
  attention-TP rank N with 503 (as a server not ready yet would) until `/admit`, so a test
  can look at a table with that rank's row missing.
- A stalled scheduler (requests parked in the disaggregation queues) sleeps 2 ms between its
  polls instead of none, which spent a core per scheduler through every stock failure window.
- The decode's heartbeat (in each decode scheduler process, same variable): a control server
  per rank that makes it tolerate missed heartbeats for a while, and shows its cached rows.
- With `E2E_HOOKS_RAISE=1`, every hook registrar's plugin installs raises (raising.py).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

from .raising import GUARD, patch_guard

__all__ = ["install"]

_KERNEL = "sgl_kernel"
_MOONCAKE = "sglang.srt.disaggregation.mooncake.conn"
_COMMON = "sglang.srt.disaggregation.common.conn"
_SCHEDULER = "sglang.srt.managers.scheduler"
STALL_POLL_S = 0.002
"""How long a stalled scheduler sleeps between its polls of the disaggregation queues."""


# ------------------------------------------------------------------ sgl_kernel, import only


class KernelCalled(RuntimeError):
    """SGLang called into the sgl_kernel stand-in: the CPU path is no longer kernel-free."""


class _Missing:
    """What any name of the stand-in resolves to: attributes give more of these (module-level
    code such as `scalar_types.uint4b8` runs), and a call raises."""

    def __init__(self, path: str) -> None:
        self._path = path

    def __getattr__(self, name: str) -> _Missing:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self._path}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise KernelCalled(f"{self._path} called: the e2e suite has no sgl_kernel build")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self._path}>"


def _kernel_attr(module: str) -> Callable[[str], Any]:
    def getattr_(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{module}.{name}")

    return getattr_


class _KernelStandIn(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname.split(".", maxsplit=1)[0] != _KERNEL:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        module.__path__ = []
        module.__getattr__ = _kernel_attr(module.__name__)  # type: ignore[method-assign]


# ------------------------------------------------------------------ after-import patches


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a patch right after one named module has been executed."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = self.patches.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self.loader = loader
        self.patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        created: ModuleType | None = self.loader.create_module(spec)
        return created

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        self.patch(module)


def _no_host_tensor_indices(module: ModuleType) -> None:
    sender = module.MooncakeKVSender
    if not hasattr(sender, "supports_host_tensor_indices"):
        # Not on the sender nor a base (SGLang before 0.5.23): no code can read it, so the
        # host-tensor path is not there either.
        return
    if "supports_host_tensor_indices" not in vars(sender):
        raise RuntimeError(
            "e2e suite: MooncakeKVSender.supports_host_tensor_indices moved out of the sender "
            "in this SGLang; check whether the CPU path still needs it set to False"
        )
    sender.supports_host_tensor_indices = False


def _paced_stall_polls(module: ModuleType) -> None:
    """A scheduler whose requests are parked in the disaggregation queues (a handshake that cannot
    happen, KV that does not come) polls them without sleeping (SGLang's own comment on
    `Scheduler.on_idle`): a core per scheduler for as long as the stall lasts, which in the
    stock scenarios is tens of seconds to minutes. Here it sleeps STALL_POLL_S between polls,
    so the rest of the run keeps the cores; every bound the suite asserts is a second or more."""
    scheduler = module.Scheduler
    if not hasattr(scheduler, "on_idle") or not hasattr(scheduler, "is_fully_idle"):
        raise RuntimeError(
            "e2e suite: Scheduler.on_idle or is_fully_idle is gone in this SGLang; check "
            "whether a stalled scheduler still polls without sleeping"
        )
    on_idle = scheduler.on_idle

    def paced(self: Any) -> None:
        on_idle(self)
        if not self.is_fully_idle():
            time.sleep(STALL_POLL_S)

    scheduler.on_idle = paced


# ------------------------------------------------------------------ the bootstrap server


class _Bootstrap:
    """The bootstrap servers of this process, one per lifetime, and their control."""

    def __init__(self, control_dir: Path, hold: bool, refuse_tp: int | None = None) -> None:
        self.control_dir = control_dir
        self.hold = hold
        self.refuse_tp = refuse_tp
        self.refused: dict[str, int] = {}
        self.lock = threading.Lock()
        self.servers: list[Any] = []
        self.listening_at: list[float] = []
        self.stopped_at: list[float] = []
        self.held: Any = None
        self.original_run: Callable[[Any], None] | None = None
        self.control: _Control | None = None

    def patch(self, module: ModuleType) -> None:
        cls = module.CommonKVBootstrapServer
        self.original_run = cls.run
        bootstrap = self

        def run(server: Any) -> None:
            with bootstrap.lock:
                first = not bootstrap.servers
                bootstrap.servers.append(server)
                bootstrap._serve_control()
                if first and bootstrap.hold:
                    bootstrap.held = server
                    _say(f"bootstrap server on port {server.port} held until started")
                    return
            bootstrap._start(server)

        cls.run = run
        original_put = cls._handle_route_put

        async def _handle_route_put(server: Any, request: Any) -> Any:
            data = await request.json()  # aiohttp keeps the body: SGLang's handler reads it too
            rank = _rank(data)
            if bootstrap.refuse_tp is not None and data.get("attn_tp_rank") == bootstrap.refuse_tp:
                bootstrap.refused[rank] = bootstrap.refused.get(rank, 0) + 1
                _say(f"bootstrap server: PUT of rank {rank} refused (503) until admitted")
                from aiohttp import web  # SGLang's own dependency, there in its processes

                return web.Response(text="e2e: rank refused until admitted", status=503)
            answer = await original_put(server, request)
            if answer.status == 200:
                puts = server.__dict__.setdefault(_PUTS, {})
                puts[rank] = puts.get(rank, 0) + 1
            return answer

        cls._handle_route_put = _handle_route_put

    def admit(self) -> dict[str, Any]:
        """Accept every rank's PUTs from now on."""
        self.refuse_tp = None
        _say("bootstrap server: every rank's PUT admitted")
        return self.state()

    def _start(self, server: Any) -> None:
        assert self.original_run is not None
        self.original_run(server)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not _listening(server):
            time.sleep(0.02)
        self.listening_at.append(time.time())
        _say(f"bootstrap server listening on port {server.port}")

    def start_held(self) -> dict[str, Any]:
        with self.lock:
            server, self.held = self.held, None
        if server is None:
            return {"error": "no held bootstrap server"}
        self._start(server)
        return self.state()

    def stop(self) -> dict[str, Any]:
        """Close the current server as its process would at exit: routes and connections go."""
        server = self.servers[-1]
        loop = getattr(server, "_loop", None)
        if loop is not None and loop.is_running():
            loop.call_soon_threadsafe(lambda: [t.cancel() for t in list(server._background_tasks)])
        server.close()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listening(server):
            time.sleep(0.02)
        self.stopped_at.append(time.time())
        _say(f"bootstrap server on port {server.port} stopped")
        return self.state()

    def start_new(self) -> dict[str, Any]:
        """A fresh server on the same port, put where SGLang keeps it (the tokenizer manager),
        as a restarted bootstrap process would be: no rows, count 0."""
        old = self.servers[-1]
        fresh = type(old)(host=old.host, port=old.port)  # run() above records and starts it
        manager = _tokenizer_manager()
        if manager is not None and getattr(manager, "bootstrap_server", None) is old:
            manager.bootstrap_server = fresh
        return self.state()

    def state(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "held": self.held is not None,
            "listening": bool(self.servers) and _listening(self.servers[-1]),
            "lifetimes": [
                {
                    "count": int(s._registered_count),
                    "rows": _rows(s),
                    "puts": dict(s.__dict__.get(_PUTS, {})),
                }
                for s in self.servers
            ],
            "refused": dict(self.refused),
            "listening_at": self.listening_at,
            "stopped_at": self.stopped_at,
        }

    def _serve_control(self) -> None:
        if self.control is None:
            actions = {
                "/start": self.start_held,
                "/stop": self.stop,
                "/start-new": self.start_new,
                "/admit": self.admit,
            }
            self.control = _Control(self.control_dir, "bootstrap", self.state, actions)


class _Control:
    """A small JSON control server on 127.0.0.1 (port 0); its port goes to
    `<control_dir>/<role>-control.json` for the test to read."""

    def __init__(
        self,
        control_dir: Path,
        role: str,
        state: Callable[[], dict[str, Any]],
        actions: dict[str, Callable[[], dict[str, Any]]],
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(state())

            def do_POST(self) -> None:
                action = actions.get(self.path)
                self._answer(action() if action else {"error": f"no {self.path}"})

            def _answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200 if "error" not in body else 400)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        path = control_dir / f"{role}-control.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "port": self.server.server_port}))
        tmp.replace(path)


# ------------------------------------------------------------------ the decode's heartbeat


class _Decode:
    """The decode's KV manager, and a switch for its heartbeat's patience.

    SGLang drops a prefill after `max_failures` missed heartbeats in a row. A relaunched
    prefill's bootstrap server often answers again before that (after one miss), and then the
    decode keeps the dead process's addresses. How fast a relaunch is depends on the machine;
    `/heartbeat-tolerant` makes the test independent of it (no drop by the heartbeat while set),
    `/heartbeat-default` restores SGLang's setting."""

    def __init__(self, control_dir: Path) -> None:
        self.control_dir = control_dir
        self.manager: Any = None
        self.default: int | None = None
        self.control: _Control | None = None

    def patch(self, module: ModuleType) -> None:
        cls = module.CommonKVManager
        original_init = cls.__init__
        decode = self

        def __init__(manager: Any, *args: Any, **kwargs: Any) -> None:
            original_init(manager, *args, **kwargs)
            mode = getattr(manager, "disaggregation_mode", None)
            if getattr(mode, "value", mode) == "decode" and decode.manager is None:
                decode.manager = manager
                # One scheduler process per rank: rank 0's file is `decode-control.json`.
                rank = getattr(getattr(manager, "kv_args", None), "engine_rank", 0) or 0
                decode.control = _Control(
                    decode.control_dir,
                    f"decode-{rank}" if rank else "decode",
                    decode.state,
                    {"/heartbeat-tolerant": decode.tolerant, "/heartbeat-default": decode.restore},
                )

        cls.__init__ = __init__

    def tolerant(self) -> dict[str, Any]:
        if self.default is None:
            self.default = self.manager.max_failures
        self.manager.max_failures = 10**9
        _say("decode heartbeat: no prefill dropped for missed heartbeats until restored")
        return self.state()

    def restore(self) -> dict[str, Any]:
        if self.default is not None:
            self.manager.max_failures, self.default = self.default, None
        _say(f"decode heartbeat: {self.manager.max_failures} misses drop a prefill again")
        return self.state()

    def state(self) -> dict[str, Any]:
        manager = self.manager
        return {
            "pid": os.getpid(),
            "max_failures": manager.max_failures,
            "prefills": sorted(manager.prefill_info_table),
            "rows": {
                key: [[e.get("rank_ip"), e.get("rank_port")] for e in entries]
                for key, entries in list(manager.connection_pool.items())
            },
        }


_PUTS = "_e2e_accepted_puts"
"""On a bootstrap server object: its accepted PUTs per rank (`_rank`), this lifetime."""


def _rank(data: dict[str, Any]) -> str:
    """A PUT's row, as the server files it (dp is the system DP rank where there is one)."""
    system = data.get("system_dp_size", 1) != 1
    dp = data.get("system_dp_rank") if system else data.get("attn_dp_rank")
    cp, tp, pp = data.get("attn_cp_rank"), data.get("attn_tp_rank"), data.get("pp_rank")
    return f"dp {dp} cp {cp} tp {tp} pp {pp}"


def _rows(server: Any) -> list[list[Any]]:
    try:
        table = server.prefill_port_table
        return [
            [dp, cp, tp, pp, info.rank_ip, info.rank_port]
            for dp, cps in list(table.items())
            for cp, tps in list(cps.items())
            for tp, pps in list(tps.items())
            for pp, info in list(pps.items())
        ]
    except RuntimeError:  # changed by the server's thread while read
        return []


def _tokenizer_manager() -> Any:
    http_server = sys.modules.get("sglang.srt.entrypoints.http_server")
    state = getattr(http_server, "_global_state", None)
    return getattr(state, "tokenizer_manager", None)


def _listening(server: Any) -> bool:
    """Whether the bootstrap server answers on its own host (`--host`: a node's address in the
    two-node scenarios)."""
    with socket.socket() as sock:
        return sock.connect_ex((getattr(server, "host", None) or "127.0.0.1", server.port)) == 0


def _say(text: str) -> None:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}] e2e-inside[{os.getpid()}]: {text}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ installing


def install() -> None:
    """Put the stand-in and the after-import patches first on the meta path (once)."""
    if any(isinstance(f, _KernelStandIn) for f in sys.meta_path):
        return
    patches: dict[str, Callable[[ModuleType], None]] = {
        _MOONCAKE: _no_host_tensor_indices,
        _SCHEDULER: _paced_stall_polls,
    }
    control_dir = os.environ.get("E2E_CONTROL_DIR")
    if control_dir:
        refuse = os.environ.get("E2E_BOOTSTRAP_REFUSE_TP")
        bootstrap = _Bootstrap(
            Path(control_dir),
            os.environ.get("E2E_BOOTSTRAP_HOLD") == "1",
            int(refuse) if refuse else None,
        )
        decode = _Decode(Path(control_dir))

        def patch_common(module: ModuleType) -> None:
            bootstrap.patch(module)
            decode.patch(module)

        patches[_COMMON] = patch_common
    if os.environ.get("E2E_HOOKS_RAISE") == "1":
        patches[GUARD] = patch_guard
    sys.meta_path.insert(0, _AfterImport(patches))
    sys.meta_path.insert(0, _KernelStandIn())
