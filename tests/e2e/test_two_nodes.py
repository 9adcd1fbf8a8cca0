"""Two prefill nodes (issue 36 scenarios 3 and 4, docs/e2e.md "Topologies"): a prefill `--tp 2
--nnodes 2`, one rank on each node, node 1 in a network namespace of its own, node 0 with the
decode and the router in another; the suite makes both namespaces and removes them, even when a
test fails. Stock SGLang and with registrar's plugin, one deployment each.

    -k stock        the scenarios on stock SGLang only
    -k registrar    with registrar only
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_support.netns import Nodes
from e2e_support.scenarios import run
from e2e_support.stack import Stack
from e2e_support.topology import REFUSED_TP, link_cut, node_dies, tp_race, tp_relaunch

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module", params=[False, True], ids=["stock", "registrar"])
def stack(
    request: pytest.FixtureRequest, model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """Node 0 (its bootstrap server held, then node 1's rank refused until admitted) and node 1,
    a TP 1 decode, with or without registrar; the test inside node 0's namespace meanwhile."""
    registrar: bool = request.param
    logs = tmp_path_factory.mktemp("nodes-registrar" if registrar else "nodes-stock")
    nodes = Nodes()
    nodes.create()
    nodes.enter()
    try:
        made = Stack(registrar=registrar, model=model, logs=logs, tp=2, nodes=nodes)
        try:
            made.start(hold=True, refuse_tp=REFUSED_TP)
            yield made
        finally:
            made.stop()
    finally:
        nodes.leave()
        nodes.remove()


def test_n1_node_1_registers_with_a_late_node_0(stack: Stack, results: Any) -> None:
    run(results, "n1", stack.registrar, tp_race, stack)


def test_n2_both_nodes_relaunched_as_a_group(stack: Stack, results: Any) -> None:
    run(results, "n2", stack.registrar, tp_relaunch, stack)


def test_n3_the_link_between_the_nodes_cut_and_healed(stack: Stack, results: Any) -> None:
    run(results, "n3", stack.registrar, link_cut, stack)


def test_n4_node_1_dies_and_node_0_is_left(stack: Stack, results: Any) -> None:
    run(results, "n4", stack.registrar, node_dies, stack)
