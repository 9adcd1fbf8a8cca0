"""registrar in a host that logs at INFO (`logging.basicConfig(level=logging.INFO)`): its own
lines only, none from the state machine library about registrar's machines, the host's own
machines still heard, and no logger of the host reconfigured (one filter added, which drops
registrar's records only)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

HOST = textwrap.dedent(
    """
    import logging
    logging.basicConfig(level=logging.{level}, format="%(name)s %(levelname)s %(message)s")
    from registrar import Registrar, State
    from registrar.devtools.bootstrap_server import BootstrapServer
    from registrar.protocols._sglang import make_payload

    server = BootstrapServer("127.0.0.1", 0).start()
    reg = Registrar(server.url, make_payload(rank_ip="127.0.0.1", rank_port=20000),
                    watch_interval=0.05)
    reg.start()
    assert reg.wait_for(State.REGISTERED, 10)
    server.restart()  # forgets the route: lost, registered again
    import time
    deadline = time.monotonic() + 10
    while reg.status().registrations < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert reg.status().registrations == 2, reg.status()
    reg.stop()
    server.close()
    # Nothing of the host's was reconfigured on the way: one filter, registrar's own.
    from registrar.core._board import ours_dropped
    assert logging.getLogger("transitions").level == logging.NOTSET
    assert logging.getLogger("transitions.core").level == logging.NOTSET
    assert logging.getLogger("transitions.core").filters == [ours_dropped]
    assert logging.getLogger().level == logging.{level}
    {extra}
    """
)


def host_log(level: str, extra: str = "") -> list[str]:
    code = HOST.format(level=level, extra=extra)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stderr.splitlines()


def test_state_changes_add_no_lines_from_the_machine_library() -> None:
    lines = host_log("INFO")
    assert not [line for line in lines if line.startswith("transitions")], lines
    # The registrar's own narration is there: the host sees what matters.
    assert any(line.startswith("registrar INFO registered with") for line in lines), lines


def test_not_even_at_debug() -> None:
    lines = host_log("DEBUG")
    assert not [line for line in lines if line.startswith("transitions")], lines


HOST_MACHINE = (
    "from transitions import Machine; "
    "Machine(states=['a', 'b'], transitions=[['go', 'a', 'b']], initial='a', name={name}).go()"
)


def test_a_host_machine_is_still_heard() -> None:
    # The control: transitions' dispatch does narrate at INFO, so the tests above can fail; the
    # filter drops registrar's records only, not those of the host's machines, named or not.
    for name in ("'host'", "None"):
        lines = host_log("INFO", HOST_MACHINE.format(name=name))
        narrated = [line for line in lines if line.startswith("transitions.core INFO")]
        assert narrated, lines
        assert all("registrar" not in line for line in narrated), narrated


def test_our_machine_is_not_heard_when_dispatched_directly() -> None:
    extra = (
        "from registrar.core._board import State, build_machine; "
        "build_machine(State.UNREGISTERED, lambda event: None).dispatch('start')"
    )
    lines = host_log("INFO", extra)
    assert not [line for line in lines if line.startswith("transitions")], lines
