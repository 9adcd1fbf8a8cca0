"""Stock SGLang, without registrar's plugin: the upstream retry loop blocks every rank's init
and then gives up for good, so a bootstrap server that starts late never learns of the ranks.
This is the behaviour the plugin replaces (test_plugin.py shows the same scenario with it)."""

from __future__ import annotations

import time

import pytest
from sglang_support.harness import wait_for
from support import process_port

pytestmark = pytest.mark.timeout(300)  # two rank starts and the upstream loop on a loaded CI

# The upstream loop: 5 attempts, delays 1, 2, 4, 8 s each scaled by a factor in [0.75, 1).
UPSTREAM_LEAST_BLOCKING = 0.75 * (1 + 2 + 4 + 8)


def test_upstream_loop_blocks_init_then_gives_up_for_good(spawn_rank, bootstrap) -> None:
    port = process_port()
    ranks = [spawn_rank(port, rank=r, tp_size=2, plugin=False) for r in range(2)]
    for rank in ranks:
        init = rank.event("init")
        assert init["seconds"] >= UPSTREAM_LEAST_BLOCKING, init
        log = rank.log.read_text()
        assert "Prefill register attempt 5/5 failed" in log
        assert "failed to register to bootstrap server after 5 retries" in log
        # registrar's plugin is installed here, and left out by SGLANG_PLUGINS.
        assert "Skipping plugin registrar (not in SGLANG_PLUGINS)" in log
        assert "in the background (registrar" not in log
    server = bootstrap(port).start()
    time.sleep(3)  # time enough for any retry that was left (there is none)
    assert server.count == 0
    assert server.rows() == set()
    assert not wait_for(lambda: server.count > 0, timeout=2)
