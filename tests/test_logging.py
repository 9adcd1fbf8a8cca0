"""registrar in a host that logs at INFO (`logging.basicConfig(level=logging.INFO)`): its own
lines only, none from the state machine library, and no logger of the host reconfigured."""

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
    from registrar.protocols.sglang import make_payload

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
    # Nothing of the host's was reconfigured on the way.
    assert logging.getLogger("transitions").level == logging.NOTSET
    assert logging.getLogger("transitions.core").level == logging.NOTSET
    assert not logging.getLogger("transitions.core").filters
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


def test_the_library_would_log_if_dispatched_through() -> None:
    # The control: transitions' own dispatch does narrate at INFO, so the tests above can fail.
    extra = (
        "from registrar.core.machine import build_machine; "
        "_, model = build_machine(); model.trigger('start')"
    )
    lines = host_log("INFO", extra)
    assert [line for line in lines if line.startswith("transitions.core INFO")], lines
