"""Real resolver faults: registrars in a process inside a network namespace whose resolver is a
DNS server of the test's own (tests/dns_support.py), met by glibc's stub resolver as a real
cluster's would be, not a patched `getaddrinfo`. The server never answers, answers SERVFAIL,
answers late, stalls after a first good answer, or moves the name to another host.

Each case asserts what happened (a failed attempt with its own error, the registration kept on
the last good address, one PUT per server lifetime, the move followed); times are recorded as
figures (docs/reliability.md) and bounded only generously, to catch a hang."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from typing import Any

import dns_support
import netns
import pytest
from bootstrap_lab import BootstrapLab
from dns_support import HOST_A, HOST_B, Resolving
from support import wait_until

from registrar.surfaces.cli import EXIT_UNREACHABLE

pytestmark = [pytest.mark.netns, pytest.mark.timeout(120)]

DEADLINE = 1.0
INTERVAL = 1.0
PORT = 8998
HANG = 30.0
"""Only catches a hang, never a speed target."""
SLACK = 3.0
"""Added to a deadline in the bounds asserted (as in tests/test_netns.py): a busy machine's
scheduling, never a target."""
KINDS = {
    "sglang": "http://bootstrap.slow.test:8998",
    "http": "http://http.slow.test:8080",
    "smg": "http://gateway.slow.test:30000",
    "etcd": "http://etcd.slow.test:2379",
}

_why_not = netns.unavailable()


@pytest.fixture
def space() -> Iterator[Resolving]:
    if _why_not is not None:
        pytest.skip(f"network namespaces unavailable: {_why_not}")
    made = Resolving()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def servers(space: Resolving) -> Iterator[dict[str, BootstrapLab]]:
    """The reference bootstrap server on two hosts of the namespace, same port."""
    made: dict[str, BootstrapLab] = {}
    try:
        with space.inside():
            for host in (HOST_A, HOST_B):
                made[host] = BootstrapLab(host, PORT).start()
        yield made
    finally:
        for server in made.values():
            server.close()


def spec(*registrars: dict[str, Any], **options: Any) -> dict[str, Any]:
    return {"registrars": list(registrars), "timeout": DEADLINE, "interval": INTERVAL, **options}


def puts(server: BootstrapLab) -> int:
    return sum(1 for r in server.records() if r.method == "PUT")


def status(driver: dns_support.Driver, index: int = 0) -> dict[str, Any]:
    answer: dict[str, Any] = driver.ask("status")["statuses"][index]
    return answer


def test_a_resolver_that_never_answers_fails_every_kind_within_its_deadline(
    space: Resolving,
    record_property: pytest.RecordProperty,
) -> None:
    assert space.dns is not None
    space.dns.mode = "never"
    driver = space.driver(spec(*({"kind": k, "url": u} for k, u in KINDS.items())))
    names = [u.split("//")[1].split(":")[0] for u in KINDS.values()]

    def all_failed() -> bool:
        found = driver.ask("status")["statuses"]
        return all(
            s["attempts_total"] >= 2
            and f"could not resolve {name} within 1.0 s" in (s["last_error"] or "")
            for name, s in zip(names, found, strict=True)
        )

    assert wait_until(all_failed, timeout=HANG, interval=0.1)

    def all_resolving() -> bool:
        # True but for a moment each 10 s, when glibc gives a lookup up and the next begins.
        found = driver.ask("status")["statuses"]
        return all(
            (s["resolution"] or "").startswith(f"resolving {name} (no answer for ")
            for name, s in zip(names, found, strict=True)
        )

    assert wait_until(all_resolving, timeout=HANG, interval=0.1)
    answer = driver.ask("status")
    for name, found in zip(names, answer["statuses"], strict=True):
        assert f"could not resolve {name}" in found["last_error"], found
        assert found["state"] == "registering"
        assert found["retrying"]
    registers = [e for e in answer["events"] if e[0] == "register"]
    assert registers
    assert all(result == "retry" for _, result, _ in registers)
    assert max(duration for *_, duration in registers) < DEADLINE + SLACK
    assert answer["in_flight"] <= len(names)  # one lookup per name, however many attempts
    stopped = driver.ask("stop 5")["stopped"]
    assert all(ended for ended, _ in stopped)
    assert max(took for _, took in stopped) < 5.0
    durations = sorted(duration for *_, duration in registers)
    record_property(
        "figures",
        f"resolver never answers: failed attempts took {durations[0]}..{durations[-1]} s; "
        f"stop() took {[took for _, took in stopped]} s (sglang, http, smg, etcd)",
    )


def test_the_status_command_fails_within_its_deadline(
    space: Resolving, record_property: pytest.RecordProperty
) -> None:
    assert space.dns is not None
    space.dns.mode = "never"
    started = time.monotonic()
    done = space.run(
        sys.executable,
        "-m",
        "registrar",
        "status",
        "--health-url",
        "http://health.slow.test:9000",
        "--timeout",
        "1",
    )
    took = time.monotonic() - started
    assert done.returncode == EXIT_UNREACHABLE, done
    assert "could not resolve health.slow.test within 1.0 s" in done.stderr
    assert took < HANG  # the interpreter's start included; the wait itself is the deadline
    record_property("figures", f"resolver never answers: registrar status ended in {took:.2f} s")


def test_servfail_is_a_failed_attempt_and_the_last_good_address_survives_it(
    space: Resolving, servers: dict[str, BootstrapLab]
) -> None:
    assert space.dns is not None
    space.dns.mode = "servfail"
    driver = space.driver(spec({"kind": "sglang", "url": f"http://bootstrap.test:{PORT}"}))
    assert wait_until(lambda: status(driver)["attempts_total"] >= 1, timeout=HANG)
    assert status(driver)["last_error"] == (
        "could not resolve bootstrap.test: [Errno -3] Temporary failure in name resolution"
    )
    space.dns.answers["bootstrap.test"] = HOST_A
    space.dns.mode = "answer"
    assert wait_until(lambda: status(driver)["state"] == "registered", timeout=HANG)
    space.dns.mode = "servfail"
    time.sleep(3 * INTERVAL)  # checks go on, on the last good address
    found = status(driver)
    assert found["state"] == "registered"
    assert found["route"] == "present"
    assert found["resolution"] == (
        "bootstrap.test did not resolve ([Errno -3] Temporary failure in name resolution); "
        f"using its last good address {HOST_A}"
    )
    assert puts(servers[HOST_A]) == 1


def test_a_slow_answer_is_waited_for_across_attempts(
    space: Resolving, servers: dict[str, BootstrapLab]
) -> None:
    assert space.dns is not None
    space.dns.answers["bootstrap.test"] = HOST_A
    space.dns.mode, space.dns.delay = "slow", 2.5
    driver = space.driver(spec({"kind": "sglang", "url": f"http://bootstrap.test:{PORT}"}))
    assert wait_until(lambda: status(driver)["state"] == "registered", timeout=HANG)
    answer = driver.ask("status")
    first = answer["statuses"][0]
    assert first["attempts_total"] >= 2  # the first ran out of its deadline
    assert first["registrations"] == 1
    assert puts(servers[HOST_A]) == 1


def test_a_stall_after_a_good_answer_keeps_the_registration_through_a_restart(
    space: Resolving, servers: dict[str, BootstrapLab], record_property: pytest.RecordProperty
) -> None:
    """The resolver stalls 30 s after a first good answer; the server restarts during it."""
    assert space.dns is not None
    server = servers[HOST_A]
    space.dns.answers["bootstrap.test"] = HOST_A
    driver = space.driver(spec({"kind": "sglang", "url": f"http://bootstrap.test:{PORT}"}))
    assert wait_until(lambda: status(driver)["state"] == "registered", timeout=HANG)
    space.dns.mode = "never"
    stalled = time.monotonic()
    time.sleep(3 * INTERVAL)
    found = status(driver)
    assert found["state"] == "registered"
    assert found["resolution"].startswith("resolving bootstrap.test (no answer for ")
    assert found["resolution"].endswith(f"using its last good address {HOST_A}")
    first_lifetime = puts(server)
    with space.inside():
        server.restart(down_for=0.5)
    restarted = time.monotonic()
    assert wait_until(lambda: status(driver)["registrations"] == 2, timeout=HANG)
    record_property(
        "figures",
        f"resolver stalled 30 s: registered again {time.monotonic() - restarted:.2f} s after "
        "the server's restart, on the last good address",
    )
    assert wait_until(lambda: status(driver)["state"] == "registered", timeout=HANG)
    time.sleep(max(0.0, 30.0 - (time.monotonic() - stalled)))
    space.dns.mode = "answer"
    # The lookup in flight when it answers again may still be one whose queries were lost.
    assert wait_until(lambda: status(driver)["resolution"] is None, timeout=HANG)
    found = status(driver)
    assert found["state"] == "registered"
    assert found["registrations"] == 2
    assert first_lifetime == 1
    assert puts(server) == 2  # one PUT per server lifetime


def test_a_moved_answer_is_followed_within_one_check_interval(
    space: Resolving, servers: dict[str, BootstrapLab], record_property: pytest.RecordProperty
) -> None:
    assert space.dns is not None
    space.dns.answers["bootstrap.test"] = HOST_A
    driver = space.driver(spec({"kind": "sglang", "url": f"http://bootstrap.test:{PORT}"}))
    assert wait_until(lambda: status(driver)["state"] == "registered", timeout=HANG)
    moved = time.time()
    space.dns.answers["bootstrap.test"] = HOST_B
    assert wait_until(lambda: puts(servers[HOST_B]) == 1, timeout=HANG)
    followed = min(r.at for r in servers[HOST_B].records() if r.method == "PUT") - moved
    # One interval (spread by up to 20 %), the look's own lookup and the requests it makes.
    assert followed < 1.2 * INTERVAL + 2 * DEADLINE + SLACK, followed
    record_property("figures", f"resolver moved the name: followed in {followed:.2f} s")
    assert wait_until(lambda: status(driver)["registrations"] == 2, timeout=HANG)
    assert puts(servers[HOST_A]) == 1
    assert puts(servers[HOST_B]) == 1


@pytest.mark.timeout(150)
def test_threads_stay_flat_over_a_60_s_stall(
    space: Resolving, record_property: pytest.RecordProperty
) -> None:
    """Twenty registrars on two names that never resolve, attempting every 1.15 s: the
    threads are the registrars' own and one lookup per name, however long it lasts."""
    assert space.dns is not None
    space.dns.mode = "never"
    names = ("http://bootstrap.slow.test:8998", "http://other.slow.test:8998")
    driver = space.driver(spec(*({"kind": "sglang", "url": url, "count": 10} for url in names)))
    samples = []
    started = time.monotonic()
    while time.monotonic() - started < 60.0:
        time.sleep(5.0)
        answer = driver.ask("status")
        samples.append((answer["threads"], answer["in_flight"]))
    attempts = sum(s["attempts_total"] for s in driver.ask("status")["statuses"])
    threads = [count for count, _ in samples]
    assert max(in_flight for _, in_flight in samples) <= len(names)
    assert max(threads) - min(threads) <= len(names), samples
    assert attempts >= 20 * 10  # every registrar kept trying, each attempt within its deadline
    stopped = driver.ask("stop 5")["stopped"]
    assert all(ended for ended, _ in stopped)
    record_property(
        "figures",
        f"resolver stalled 60 s: threads every 5 s {threads}; {attempts} failed attempts; "
        f"slowest stop() {max(took for _, took in stopped)} s",
    )
