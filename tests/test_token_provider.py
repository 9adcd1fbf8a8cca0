"""A token provider (a callable) is asked before each request: rotation works, a failing
provider fails that request only (retried), and every token it answers stays secret."""

from __future__ import annotations

from support import sglang_payload

from registrar import HttpSettings, Verdict
from registrar.devtools.bootstrap_server import BootstrapServer
from registrar.protocols._http import HttpTransport


def test_provider_is_asked_per_request(server: BootstrapServer) -> None:
    server.token = "one"
    tokens = iter(["one", "wrong-secret", "two"])
    asked: list[int] = []

    def provider() -> str | None:
        asked.append(1)
        return next(tokens)

    transport = HttpTransport(HttpSettings(server.url, token=provider))
    try:
        assert transport.register(sglang_payload()).verdict is Verdict.ACCEPTED
        refused = transport.register(sglang_payload())
        assert refused.verdict is Verdict.FATAL  # 401: the server wants another token
        assert "wrong-secret" not in (refused.error or "")
        server.token = "two"
        assert transport.register(sglang_payload(tp_rank=0)).verdict is Verdict.ACCEPTED
    finally:
        transport.close()
    assert len(asked) == 3


def test_a_failing_provider_fails_the_request_and_is_retried(server: BootstrapServer) -> None:
    def provider() -> str | None:
        raise FileNotFoundError(2, "No such file or directory", "/run/token")

    transport = HttpTransport(HttpSettings(server.url, token=provider))
    try:
        outcome = transport.register(sglang_payload())
    finally:
        transport.close()
    assert outcome.verdict is Verdict.RETRY
    assert "no bearer token" in (outcome.error or "")
    assert "No such file or directory" in (outcome.error or "")
    assert server.registered_count == 0
