"""docs/architecture.md shows how to add a protocol in one file: its sketch must work as shown.

The sketch is taken from the page as written, registered under a protocol name, and driven
against a small service on 127.0.0.1 that forgets its registrations on demand: registered, then
found missing and registered again.
"""

from __future__ import annotations

import importlib.util
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from registrar import Registrar, State, register_protocol

PAGE = Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


class Services(ThreadingHTTPServer):
    """PUT /services stores a service by name; GET /services/NAME finds it (404 otherwise)."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.names: set[str] = set()
        self.puts = 0


class _Handler(BaseHTTPRequestHandler):
    server: Services

    def do_PUT(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.names.add(body["name"])
        self.server.puts += 1
        self._answer(200)

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        self._answer(200 if name in self.server.names else 404)

    def _answer(self, code: int) -> None:
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def services() -> Iterator[Services]:
    server = Services()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(5)


def _sketch(tmp_path: Path) -> ModuleType:
    code = re.search(r"```python\n# mypackage/myproto.py\n(.*?)```", PAGE.read_text(), re.S)
    assert code is not None, "docs/architecture.md lost its protocol sketch"
    path = tmp_path / "myproto.py"
    path.write_text(code.group(1))
    spec = importlib.util.spec_from_file_location("myproto", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_protocol_sketch_registers_and_registers_again(
    tmp_path: Path, services: Services, registrars: list[Registrar]
) -> None:
    register_protocol("myproto", _sketch(tmp_path).factory)
    url = f"http://127.0.0.1:{services.server_address[1]}"
    reg = Registrar(url, {"name": "svc"}, protocol="myproto", watch_interval=0.2)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert services.puts == 1
    services.names.clear()  # the service forgets us
    deadline = threading.Event()
    for _ in range(100):
        if services.puts == 2 and reg.status().state is State.REGISTERED:
            break
        deadline.wait(0.1)
    assert services.puts == 2, "the sketch's check did not report the route missing"
    assert reg.status().reregistrations == 1
