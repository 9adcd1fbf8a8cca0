"""Whether every row of node 0's table still answers at the address it registered. A node of a
group can become unreachable (its link cut, its host gone without a reset) while its row stays in
the table and SGLang's readiness stays true until something else gives (gloo's timeout, or a
`/health` call that waited 20 s for the stuck scheduler); meanwhile the group serves nothing. A
TCP connect to each row's `rank_ip:rank_port` (the rank's KV socket, which the decode dials too)
tells within seconds. The connects run in a thread of their own, so `/ready` never waits on the
network (docs/sglang.md "Readiness")."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("registrar.integrations.sglang.reach")

INTERVAL = 1.0  # seconds between two rounds of connects
PATIENCE = 1.0  # seconds a connect may take: a cut link shows as this timeout

Row = tuple[int, int, int, int]  # (dp, cp, tp, pp)
Address = tuple[str, int]


def _addresses(server: Any) -> Iterator[tuple[Row, Address]]:
    """Each row's registered address; nothing if the table changed under us."""
    try:
        for dp, cps in list(server.prefill_port_table.items()):
            for cp, tps in list(cps.items()):
                for tp, pps in list(tps.items()):
                    for pp, info in list(pps.items()):
                        ip, port = getattr(info, "rank_ip", None), getattr(info, "rank_port", None)
                        if isinstance(ip, str) and port is not None:
                            yield (dp, cp, tp, pp), (ip, int(port))
    except (RuntimeError, AttributeError, TypeError, ValueError):
        return


def _name(row: Row, address: Address) -> str:
    return "dp {} cp {} tp {} pp {} at {}:{}".format(*row, *address)


class Reach:
    """The rows that did not answer at the last look, kept by one daemon thread per process,
    started by the first question. The answer is for the server asked last (a restarted
    bootstrap server replaces the one before)."""

    def __init__(self, interval: float = INTERVAL, patience: float = PATIENCE) -> None:
        self.interval = interval
        self.patience = patience
        self._server: Any = None
        self._silent: dict[Row, str] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def silent(self, server: Any) -> dict[Row, str]:
        """The rows of `server` that did not answer at the last look, each with its error."""
        with self._lock:
            if server is not self._server:
                self._server, self._silent = server, {}
            if self._thread is None:
                self._stopped = threading.Event()
                self._thread = threading.Thread(
                    target=self._run,
                    args=(self._stopped,),
                    name="sglang-registrar-reach",
                    daemon=True,  # in SGLang it lives as long as its process
                )
                self._thread.start()
            return dict(self._silent)

    def _run(self, stopped: threading.Event) -> None:
        failed = False
        while not stopped.wait(self.interval):
            try:
                self.look()
            except Exception:  # a bug here must not end the looks: logged once, looks go on
                if not failed:
                    logger.exception("sglang-registrar: a look at the rows failed")
                failed = True

    def stop(self) -> None:
        """End the thread and forget what it saw (tests; a later question starts it again)."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._server, self._silent = None, {}
        if thread is not None:
            self._stopped.set()
            thread.join()

    def look(self) -> None:
        """One round: connect to every row, log each change, keep the result."""
        server = self._server
        for row, address in list(_addresses(server)):
            error = None  # None: the row's address accepts a connection
            try:
                socket.create_connection(address, timeout=self.patience).close()
            except OSError as exc:
                error = str(exc) or type(exc).__name__
            with self._lock:
                if server is not self._server:
                    return
                before = self._silent.get(row)
                if error is None:
                    self._silent.pop(row, None)
                else:
                    self._silent[row] = error
            if error is not None and before is None:
                logger.warning(
                    "sglang-registrar: rank %s does not answer (%s); /ready is false until it does",
                    _name(row, address),
                    error,
                )
            elif error is None and before is not None:
                logger.info("sglang-registrar: rank %s answers again", _name(row, address))


REACH = Reach()
