"""The suite's own port rule (docs/testing.md, "Ports"): numbers for other processes come from
this worker's block below the kernel's ephemeral range, each free and not held by another run."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile

from support import PORT_BLOCK, port_block, process_port


def test_blocks_sit_below_the_ephemeral_range_one_per_worker(monkeypatch) -> None:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    blocks = []
    for worker in ("gw0", "gw1", "gw2", "gw3"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        blocks.append(set(port_block()))
    for i, block in enumerate(blocks):
        assert len(block) == PORT_BLOCK
        assert max(block) < low
        assert all(not block & other for other in blocks[i + 1 :])


def test_a_process_port_is_free_and_distinct() -> None:
    got = [process_port() for _ in range(5)]
    assert len(set(got)) == 5
    assert all(port in port_block() for port in got)
    for port in got:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # nothing holds it


def test_a_port_in_use_or_locked_by_another_run_is_skipped() -> None:
    """A port another process listens on, and one another suite's run holds the lock of, are
    both passed over."""
    block = port_block()
    lock_dir = os.path.join(tempfile.gettempdir(), "registrar-test-ports")
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        first = process_port()
        nxt = block[(block.index(first) + 1) % len(block)]
        after = block[(block.index(first) + 2) % len(block)]
        with contextlib.suppress(OSError):  # in use already: passed over all the same
            busy.bind(("127.0.0.1", nxt))
            busy.listen()
        # Another process (another checkout's suite) holds the lock of the one after (or a
        # real other run does already: the same for this test).
        holder = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import fcntl,sys; f=open(sys.argv[1],'w')\n"
                "try: fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
                "except OSError: pass\n"
                "print('held', flush=True); sys.stdin.read()",
                os.path.join(lock_dir, f"{after}.lock"),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "held\n"
            got = process_port()
        finally:
            holder.communicate("", timeout=10)
    assert got not in (nxt, after)
    assert got in block
