"""Two prefill nodes set up wrong (issue 36 scenario 5, docs/e2e.md "Topologies"), each staged
for real across two network namespaces the test makes and removes, stock SGLang and with
registrar's plugin; one group per test, nothing in front of it.

    -k stock        the scenarios on stock SGLang only
    -k registrar    with registrar only
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.misconfig import ALIAS, another_dist_host, loopback_only, loopback_rank_ip
from e2e_support.netns import Nodes
from e2e_support.scenarios import run
from e2e_support.stack import Stack

pytestmark = pytest.mark.timeout(600)

Group = Callable[..., Stack]


@pytest.fixture(params=[False, True], ids=["stock", "registrar"])
def group(request: pytest.FixtureRequest, model: Path, tmp_path: Path) -> Iterator[Group]:
    """Starts a TP 2 prefill over two nodes, one rank each, with the given mistake, and waits
    for node 0's `/health`; the test inside node 0's namespace meanwhile."""
    registrar: bool = request.param
    nodes = Nodes()
    nodes.create()
    nodes.enter()
    made: list[Stack] = []

    def start(**mistake: Any) -> Stack:
        if mistake.get("node_1_dist_host") == ALIAS:
            nodes.alias(0, ALIAS)
        stack = Stack(registrar=registrar, model=model, logs=tmp_path, tp=2, nodes=nodes, **mistake)
        made.append(stack)
        stack.launch_prefill(hold=False)
        stack.wait_prefill_up()
        return stack

    try:
        yield start
    finally:
        for stack in made:
            stack.stop()
        nodes.leave()
        nodes.remove()


def test_m1_node_0_bootstrap_server_on_its_loopback_only(group: Group, results: Any) -> None:
    stack = group(bind="127.0.0.1")
    run(results, "m1", stack.registrar, loopback_only, stack)


def test_m2_node_1_given_another_dist_init_host(group: Group, results: Any) -> None:
    stack = group(node_1_dist_host=ALIAS)
    run(results, "m2", stack.registrar, another_dist_host, stack)


def test_m3_node_1_publishes_its_loopback_as_rank_address(group: Group, results: Any) -> None:
    stack = group(node_1_rank_ip="127.0.0.1")
    run(results, "m3", stack.registrar, loopback_rank_ip, stack)
