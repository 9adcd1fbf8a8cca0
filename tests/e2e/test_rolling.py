"""Scenario r1 (issue 36 scenario 6, docs/e2e.md "Rolling restart behind smg"): two TP 2
prefills and two decodes behind the smg router, each restarted with SIGTERM in turn under a
stream of requests. One deployment per test (stock first, stopped before the one with
registrar starts: one deployment at a time on two cores).

    -k stock        stock SGLang, the router given the four as static workers
    -k registrar    the router started empty, the servers listed by REGISTRAR_GATEWAY
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e_support.deploy import Deployment
from e2e_support.rolling import rolling_restart
from e2e_support.scenarios import run

pytestmark = pytest.mark.timeout(1800)
"""Five launches in a row per test (the four at once, then each again in turn): at load 20-30 on
2 cores a relaunch took 140-235 s and the side with registrar ran past the suite's 900 s."""


def test_r1_stock_rolling_restart_behind_a_static_router(deploy: Deployment, results: Any) -> None:
    run(results, "r1", False, rolling_restart, deploy, False)


def test_r1_registrar_rolling_restart_with_the_gateway_drain(
    deploy: Deployment, results: Any
) -> None:
    run(results, "r1", True, rolling_restart, deploy, True)
