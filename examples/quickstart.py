"""Start a reference bootstrap server one second late and watch a registrar get through."""

from __future__ import annotations

import logging
import threading

from registrar import Backoff, Registrar, State
from registrar.bootstrap_server import BootstrapServer

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("transitions").setLevel(logging.WARNING)

payload = {
    "attn_tp_size": 1,
    "attn_tp_rank": 0,
    "attn_cp_size": 1,
    "attn_cp_rank": 0,
    "attn_dp_size": 1,
    "attn_dp_rank": 0,
    "pp_size": 1,
    "pp_rank": 0,
    "system_dp_size": 1,
    "system_dp_rank": 0,
    "rank_ip": "127.0.0.1",
    "rank_port": 20000,
    "page_size": 16,
    "kv_cache_dtype": "auto",
}

server = BootstrapServer("127.0.0.1", 0).start()
server.stop()  # keep the port, refuse connections: the startup race
timer = threading.Timer(1.0, server.start)
timer.start()
with Registrar(server.url, payload, backoff=Backoff(initial=0.3, maximum=2.0)) as reg:
    ok = reg.wait_for(State.REGISTERED, timeout=10)
    print(reg.status().to_dict())
timer.join()
server.close()
raise SystemExit(0 if ok else 1)
