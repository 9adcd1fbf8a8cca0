"""Registrars in a process of their own, started inside a namespace by `ip netns exec` (so
that the namespace's /etc/resolv.conf is theirs), driven over stdin by tests/dns_support.py.

argv[1] is a JSON spec: `registrars`, a list of {`kind` (sglang, http, smg, etcd), `url`,
`count` (registrars of that kind on that URL)}; `timeout` (the request deadline), `interval`
(the watch interval), `backoff` (initial, maximum). Commands, one a line; each answer is one
JSON line:
- `status`: every registrar's status, the thread count, the lookups in flight, the requests
  seen (kind, result, duration);
- `stop SECONDS`: stop every registrar with that timeout, and how long each stop took;
- `quit`.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from support import lookups_in_flight, sglang_payload

from registrar import Backoff, Registrar, etcd_registrar, smg_registrar
from registrar.core._board import RequestEvent
from registrar.protocols._resolver import RESOLVER


def build(spec: dict[str, Any], kind: str, url: str, number: int) -> Registrar:
    initial, maximum = spec.get("backoff", (0.15, 0.15))
    options: dict[str, Any] = {
        "timeout": spec.get("timeout", 1.0),
        "backoff": Backoff(initial=initial, maximum=maximum),
        "max_attempts": None,
        "watch_interval": spec.get("interval", 1.0),
    }
    payload = sglang_payload(port=20000 + number)
    if kind == "sglang":
        return Registrar(url, payload, **options)
    if kind == "http":
        return Registrar(url, payload, protocol="http", **options)
    if kind == "smg":
        worker = spec.get("worker", f"http://127.0.0.1:{30001 + number}")
        return smg_registrar(url, worker, "regular", drain_timeout=2.0, **options)
    if kind == "etcd":
        options.pop("watch_interval")
        return etcd_registrar(url, f"/registrar/test/{number}", payload, ttl=10, **options)
    raise SystemExit(f"unknown kind {kind!r}")


def main() -> None:
    spec = json.loads(sys.argv[1])
    events: list[list[Any]] = []
    lock = threading.Lock()

    def record(event: RequestEvent) -> None:
        with lock:
            events.append([event.kind, event.result, round(event.duration, 3)])

    registrars = [
        build(spec, entry["kind"], entry["url"], number)
        for entry in spec["registrars"]
        for number in range(entry.get("count", 1))
    ]
    for reg in registrars:
        reg.add_request_listener(record)
        reg.start()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command == "status":
            with lock:
                seen = list(events)
            answer: Any = {
                "statuses": [reg.status().to_dict() for reg in registrars],
                "threads": threading.active_count(),
                "in_flight": lookups_in_flight(RESOLVER),
                "events": seen,
            }
        elif command == "stop":
            took = []
            for reg in registrars:
                started = time.monotonic()
                ended = reg.stop(float(args[0]))
                took.append([ended, round(time.monotonic() - started, 3)])
            answer = {"stopped": took}
        elif command == "quit":
            break
        else:
            answer = {"error": f"unknown command {command!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
