"""The smg gateway protocol's logic without a gateway: a scripted control plane (answers in
order) and a fake clock. The real gateway is in tests/test_smg_gateway.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from support import CLI_ENV, FakeClock, wait_until

from registrar import ConfigError, Registrar, Route, State, Verdict, smg_registrar
from registrar.core._backoff import Backoff
from registrar.protocols._httpvalues import HttpResult
from registrar.protocols._smg.settings import (
    DEFAULT_CONFIRM_TIMEOUT,
    SmgSettings,
    validate_spec,
    worker_spec,
)
from registrar.protocols._smg.transport import SmgTransport

GATEWAY = "http://127.0.0.1:30000"
WORKER = "http://127.0.0.1:31000"
ID = "01a231cd-e600-7353-8a64-cd40f75a21ca"
OTHER_ID = "01a231cd-e600-7353-8a64-cd40f75a21cb"
SPEC = {"url": WORKER, "worker_type": "decode"}


def answer(code: int, body: Any = None) -> HttpResult:
    text = json.dumps(body) if body is not None else ""
    return HttpResult(code, {}, text, None, reconnected=False)


def refused() -> HttpResult:
    return HttpResult(None, {}, "", ConnectionRefusedError(111, "refused"), False, refused=True)


def listed(status: str = "ready", worker_id: str = ID, url: str = WORKER) -> HttpResult:
    return answer(
        200, {"id": worker_id, "url": url, "status": status, "is_healthy": status == "ready"}
    )


def accepted(worker_id: str = ID) -> HttpResult:
    return answer(202, {"status": "accepted", "worker_id": worker_id})


def exists(worker_id: str = ID) -> HttpResult:
    text = f"Worker already exists at URL '{WORKER}' with ID {worker_id}. Use PUT /workers/..."
    return answer(409, {"error": text, "code": "WORKER_ALREADY_EXISTS"})


def not_found() -> HttpResult:
    return answer(404, {"error": "Worker not found", "code": "WORKER_NOT_FOUND"})


class Script:
    """A control plane answering from a script: (method, path) -> answers in order, the last
    one repeating. Every request is recorded."""

    def __init__(self, **routes: list[HttpResult]) -> None:
        self.routes = {key: list(value) for key, value in routes.items()}
        self.sent: list[tuple[str, str]] = []

    def send(self, method: str, path: str, **kw: Any) -> HttpResult:
        self.sent.append((method, path))
        key = method if method in ("POST", "DELETE") else ("LIST" if path == "/workers" else "GET")
        answers = self.routes.get(key)
        assert answers, f"unscripted {method} {path}"
        return answers.pop(0) if len(answers) > 1 else answers[0]

    def count(self, method: str) -> int:
        return sum(1 for m, _ in self.sent if m == method)


def transport(script: Script, clock: FakeClock, **kw: Any) -> SmgTransport:
    if "token" in kw:
        kw["key"] = kw.pop("token")
    smg = SmgTransport(SmgSettings(GATEWAY, WORKER, **kw), clock=clock)
    smg._http.send = script.send  # type: ignore[method-assign]  # the scripted control plane
    return smg


def test_register_posts_then_waits_until_listed_ready(clock: FakeClock) -> None:
    script = Script(POST=[accepted()], GET=[listed("pending"), listed("pending"), listed()])
    smg = transport(script, clock)
    outcome = smg.register(SPEC)
    assert outcome.verdict is Verdict.ACCEPTED
    assert smg.worker_id == ID
    assert script.sent == [("POST", "/workers")] + [("GET", f"/workers/{ID}")] * 3
    assert clock.waits == [0.05, 0.1]  # polled with a growing delay


def test_a_dropped_job_is_a_failed_attempt_retried(clock: FakeClock) -> None:
    script = Script(POST=[accepted()], GET=[listed("pending"), not_found()])
    smg = transport(script, clock)
    outcome = smg.register(SPEC)
    assert outcome.verdict is Verdict.RETRY
    assert "dropped" in (outcome.error or "")
    assert smg.worker_id is None


def test_409_adopts_the_worker_the_gateway_names(clock: FakeClock) -> None:
    script = Script(POST=[exists(OTHER_ID)], GET=[listed(worker_id=OTHER_ID)])
    smg = transport(script, clock)
    assert smg.register(SPEC).verdict is Verdict.ACCEPTED
    assert smg.worker_id == OTHER_ID
    assert script.count("POST") == 1


def test_an_adopted_worker_being_removed_is_added_again_once_gone(clock: FakeClock) -> None:
    script = Script(
        POST=[exists(), accepted(OTHER_ID)],
        GET=[listed("draining"), listed("draining"), not_found(), listed(worker_id=OTHER_ID)],
    )
    smg = transport(script, clock)
    assert smg.register(SPEC).verdict is Verdict.ACCEPTED
    assert smg.worker_id == OTHER_ID
    assert script.count("POST") == 2


def test_confirmation_is_bounded_and_the_next_attempt_follows_the_same_worker(
    clock: FakeClock,
) -> None:
    script = Script(POST=[accepted()], GET=[listed("pending")])
    smg = transport(script, clock, confirm_timeout=3.0)
    outcome = smg.register(SPEC)
    assert outcome.verdict is Verdict.RETRY
    assert "not listed ready within 3 s" in (outcome.error or "")
    assert sum(clock.waits) == pytest.approx(3.0)
    script.routes["GET"] = [listed()]
    assert smg.register(SPEC).verdict is Verdict.ACCEPTED
    assert script.count("POST") == 1  # never a second worker for one URL


def test_credentials_refused_is_fatal_and_never_shows_the_key(clock: FakeClock) -> None:
    script = Script(POST=[answer(401, {"error": "Unauthorized"})])
    smg = transport(script, clock, token="s3cret-key")
    outcome = smg.register(SPEC)
    assert outcome.verdict is Verdict.FATAL
    assert "control-plane key" in (outcome.error or "")
    assert "s3cret-key" not in (outcome.error or "")


def test_a_refused_post_is_a_refusal(clock: FakeClock) -> None:
    outcome = transport(Script(POST=[refused()]), clock).register(SPEC)
    assert outcome.verdict is Verdict.RETRY
    assert outcome.refused


def test_check_classifies_by_status_never_by_body(clock: FakeClock) -> None:
    script = Script(POST=[accepted()], GET=[listed()])
    smg = transport(script, clock)
    smg.register(SPEC)
    assert smg.check(SPEC).route is Route.PRESENT
    script.routes["GET"] = [listed("pending")]
    assert smg.check(SPEC).route is Route.UNDETERMINED
    script.routes["GET"] = [refused()]
    check = smg.check(SPEC)
    assert check.route is Route.UNREACHABLE
    assert check.refused
    script.routes["GET"] = [answer(404, "anything at all")]
    check = smg.check(SPEC)
    assert check.route is Route.MISSING
    assert ID in check.evidence
    assert smg.worker_id is None  # a restarted gateway's ids are all new


def test_unhealthy_but_listed_is_present(clock: FakeClock) -> None:
    script = Script(POST=[accepted()], GET=[listed(), listed("not_ready")])
    smg = transport(script, clock)
    smg.register(SPEC)
    check = smg.check(SPEC)
    assert check.route is Route.PRESENT
    assert "not healthy" in check.evidence


def test_the_look_before_the_first_post_adopts_our_url(clock: FakeClock) -> None:
    others = {"id": OTHER_ID, "url": "http://127.0.0.1:1", "status": "ready"}
    ours = {"id": ID, "url": WORKER + "/", "status": "ready", "is_healthy": True}
    script = Script(LIST=[answer(200, {"workers": [others, ours], "total": 2})])
    smg = transport(script, clock)
    assert smg.check(SPEC).route is Route.PRESENT
    assert smg.worker_id == ID
    script.routes["LIST"] = [answer(200, {"workers": [others], "total": 1})]
    smg2 = transport(script, clock)
    assert smg2.check(SPEC).route is Route.MISSING
    assert smg2.worker_id is None


def test_close_drains_until_the_gateway_no_longer_lists_the_worker(clock: FakeClock) -> None:
    script = Script(
        POST=[accepted()],
        GET=[listed(), listed("draining"), listed("draining"), not_found()],
        DELETE=[answer(202, {"status": "accepted"})],
    )
    smg = transport(script, clock)
    smg.register(SPEC)
    smg.close()
    assert script.count("DELETE") == 1
    assert script.sent[-1] == ("GET", f"/workers/{ID}")
    assert smg.worker_id is None


def test_the_drain_is_bounded(clock: FakeClock) -> None:
    script = Script(POST=[accepted()], GET=[listed()], DELETE=[answer(202, {})])
    smg = transport(script, clock, drain_timeout=4.0)
    smg.register(SPEC)
    clock.waits.clear()
    smg.close()
    assert sum(clock.waits) == pytest.approx(4.0)


def test_close_after_a_lost_answer_finds_the_worker_by_its_url(clock: FakeClock) -> None:
    lost = HttpResult(None, {}, "", TimeoutError("no answer"), False)
    ours = {"id": ID, "url": WORKER, "status": "pending"}
    script = Script(
        POST=[lost],
        LIST=[answer(200, {"workers": [ours]})],
        DELETE=[answer(202, {})],
        GET=[not_found()],
    )
    smg = transport(script, clock)
    assert smg.register(SPEC).verdict is Verdict.RETRY
    smg.close()
    assert ("DELETE", f"/workers/{ID}") in script.sent


def test_not_ready_for_the_grace_period_withdraws_the_worker(clock: FakeClock) -> None:
    ready = [True]
    script = Script(POST=[accepted()], GET=[listed()], DELETE=[answer(202, {})])
    smg = transport(script, clock, ready=lambda: ready[0], grace=10.0)
    assert smg.not_ready() is None
    smg.register(SPEC)
    ready[0] = False
    assert smg.check(SPEC).route is Route.PRESENT  # not ready from now: the grace starts
    clock.now += 9.0
    assert smg.check(SPEC).route is Route.PRESENT
    assert script.count("DELETE") == 0
    clock.now += 1.0
    check = smg.check(SPEC)
    assert check.route is Route.MISSING
    assert "withdrawn: not ready for 10.0 s" in check.evidence
    assert script.count("DELETE") == 1


@pytest.fixture
def gated(clock: FakeClock) -> Iterator[tuple[Registrar, Script, list[bool]]]:
    ready = [False]
    script = Script(
        POST=[accepted()],
        GET=[listed()],
        DELETE=[answer(202, {})],
        LIST=[answer(200, {"workers": []})],
    )
    smg = transport(script, clock, ready=lambda: ready[0], grace=5.0)
    reg = Registrar(
        GATEWAY,
        SPEC,
        transport=smg,
        clock=clock,
        rng=lambda: 0.5,
        max_attempts=1,
        on_failure="stop",
        backoff=Backoff(initial=1.0, maximum=2.0),
    )
    try:
        yield reg, script, ready
    finally:
        reg.stop()


def test_waiting_for_readiness_sends_nothing_and_spends_no_budget(
    gated: tuple[Registrar, Script, list[bool]], clock: FakeClock
) -> None:
    reg, script, ready = gated
    reg.start()
    assert wait_until(lambda: clock.now - clock.start > 3600)  # an hour of virtual time
    status = reg.status()
    assert status.state is State.REGISTERING  # max_attempts=1 and on_failure=stop: not spent
    assert status.attempts_total == 0
    assert status.last_error == "not offered yet: the readiness callable answered False"
    assert script.sent == []
    ready[0] = True
    assert reg.wait_for(State.REGISTERED, 5)
    assert script.count("POST") == 1


def test_spec_validation_names_the_field() -> None:
    assert worker_spec(WORKER + "/", "prefill", 8998) == {
        "url": WORKER,
        "worker_type": "prefill",
        "bootstrap_port": 8998,
    }
    with pytest.raises(ConfigError, match="worker_type must be one of prefill, decode, regular"):
        validate_spec({"url": WORKER, "worker_type": "encoder"})
    with pytest.raises(ConfigError, match="bootstrap_port is for a prefill worker"):
        worker_spec(WORKER, "decode", 8998)
    with pytest.raises(ConfigError, match="bootstrap_port must be a port"):
        worker_spec(WORKER, "prefill", 70000)
    with pytest.raises(ConfigError, match="worker url"):
        worker_spec("127.0.0.1:31000")
    with pytest.raises(ConfigError, match="confirm_timeout must be a positive"):
        SmgTransport(SmgSettings(GATEWAY, WORKER, confirm_timeout=0))
    with pytest.raises(ConfigError, match="not both"):
        smg_registrar(GATEWAY, WORKER, key="a", key_file="/nonexistent")
    with pytest.raises(ConfigError, match="cannot read the gateway key file"):
        smg_registrar(GATEWAY, WORKER, key_file="/nonexistent/key")
    assert DEFAULT_CONFIRM_TIMEOUT > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--worker-url", WORKER], "--worker-url go with --gateway"),
        (["--gateway", GATEWAY], "--gateway needs --worker-url"),
        (["--gateway", GATEWAY, "--worker-url", WORKER, "--payload", "{}"], "replaces --payload"),
        (["--gateway", GATEWAY, "--worker-url", WORKER, "--worker-type", "x"], "prefill, decode"),
        (
            ["--gateway", GATEWAY, "--worker-url", WORKER, "--bootstrap-port", "8998"],
            "bootstrap_port is for a prefill worker",
        ),
    ],
)
def test_command_usage_errors_are_one_line(args: list[str], message: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "registrar", "register", *args],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
        env=CLI_ENV,
    )
    assert done.returncode == 2
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_list_too_large_to_read_is_undetermined_and_the_409_still_adopts(
    clock: FakeClock,
) -> None:
    cut = HttpResult(200, {}, '{"workers": [', None, reconnected=False, complete=False)
    script = Script(LIST=[cut], POST=[exists()], GET=[listed()])
    smg = transport(script, clock)
    check = smg.check(SPEC)
    assert check.route is Route.UNDETERMINED
    assert smg.register(SPEC).verdict is Verdict.ACCEPTED  # the gateway names its worker
    assert smg.worker_id == ID
