"""Whatever a server says (an address in a route answer, a body, a header) reaches a log line or
a status field escaped and capped: it cannot forge a log line, draw on a terminal, or make one
line of 50 KB. One helper does it (`registrar.core._redact.clean`); these tests drive it through
real answers from a hostile server on 127.0.0.1."""

from __future__ import annotations

import json
import logging

import pytest
from hostile_server import HostileServer, answer
from support import ScriptedTransport, accepted, retry, route, sglang_payload, wait_until

from registrar import Backoff, HttpSettings, Registrar, State
from registrar.core import _rules as rules
from registrar.core._redact import MAX_SHOWN, clean
from registrar.core._transport import Route
from registrar.protocols._sglang import SGLangTransport

URL = "http://127.0.0.1:8998"
FAST = Backoff(initial=0.05, maximum=0.1)
HOSTILE = "10.0.0.9\nERROR forged line\r\x1b[31mred\x1b[0m\u2028sep\u202eevil" + "A" * 50_000


def test_clean_escapes_control_characters_and_caps_length() -> None:
    assert clean("a\nb\r\x00\x1b[2J\x7f\x85\u2028\u202e") == (
        "a\\x0ab\\x0d\\x00\\x1b[2J\\x7f\\x85\\u2028\\u202e"
    )
    long = clean("x" * 10_000)
    assert len(long) <= MAX_SHOWN + 4
    assert long.endswith(" ...")
    assert clean("plain text, unchanged: é ü 中") == "plain text, unchanged: é ü 中"
    assert clean(None) == "None"


def test_one_set_of_unsafe_characters_is_escaped_in_text_and_refused_in_a_url() -> None:
    """Every code point `clean` escapes a URL refuses, spaces too, and no other: the word joiner
    and the invisible operators (zero-width like U+200B) are escaped in log lines as well."""
    for bad in ("\u2060", "\u2061", "\u2064", "\u206f", "\u200b", "\ufeff"):
        assert clean(f"a{bad}b") == f"a\\u{ord(bad):04x}b"
    differ = []
    for code in range(0x10000):
        char = chr(code)
        try:
            rules.url(f"http://127.0.0.1:8998/p{char}")
            refused = False
        except rules.Invalid:
            refused = True
        if refused != (clean(char) != char or char.isspace()):
            differ.append(hex(code))
    assert differ == []


def _assert_safe(records: list[logging.LogRecord]) -> None:
    for record in records:
        message = record.getMessage()
        for bad in ("\n", "\r", "\x1b", "\u2028", "\u202e"):
            assert bad not in message, message[:200]
        assert len(message) < 2_000, f"a log line of {len(message)} characters"


def test_a_conflicting_rank_ip_is_escaped_and_capped(
    registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="registrar")
    conflict = json.dumps({"rank_ip": HOSTILE, "rank_port": 20000})
    with HostileServer(answer(200, ""), answer(200, conflict)) as server:
        reg = Registrar(server.url, sglang_payload(), backoff=FAST, watch_interval=0.05)
        registrars.append(reg)
        reg.start()
        assert reg.wait_for(State.REGISTERED, timeout=10)
        transport = SGLangTransport(HttpSettings(server.url))
        try:
            check = transport.check(sglang_payload())
        finally:
            transport.close()
        for _ in range(200):
            if any("route conflict" in r.getMessage() for r in caplog.records):
                break
            reg.wait_for(State.STOPPED, timeout=0.02)
        reg.stop()
    assert check.route is Route.CONFLICT
    assert check.evidence.startswith("our rank is registered as 10.0.0.9\\x0aERROR forged line")
    warnings = [r for r in caplog.records if "route conflict" in r.getMessage()]
    assert warnings
    _assert_safe(caplog.records)


@pytest.mark.parametrize("code", [503, 400, 302])
def test_bodies_and_headers_are_escaped_in_status_and_logs(
    code: int, registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="registrar")
    headers = [("Location", "http://10.0.0.1/\x1b[2Jnext"), ("Retry-After", "\x1b[31m")]
    with HostileServer(answer(code, HOSTILE, headers), answer(200, "")) as server:
        reg = Registrar(
            server.url, sglang_payload(), protocol="http", backoff=FAST, watch_interval=None
        )
        registrars.append(reg)
        reg.start()
        final = State.REGISTERED if code == 503 else State.FAILED
        assert reg.wait_for(final, timeout=10)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert errors
    _assert_safe(caplog.records)
    if code != 503:  # a fatal answer stays in the status
        last = reg.status().last_error or ""
        assert "\n" not in last
        assert "\x1b" not in last
        assert len(last) < 1_000


def test_any_transport_s_text_is_escaped_by_the_loop(
    registrars: list, caplog: pytest.LogCaptureFixture
) -> None:
    # A custom transport that does not clean what it returns: the loop does, for every one.
    caplog.set_level(logging.DEBUG, logger="registrar")
    raw = "refused\nERROR forged\x1b[2J" + "B" * 5_000
    transport = ScriptedTransport(
        [retry(503, raw), accepted()], checks=[route(Route.UNDETERMINED, raw)]
    )
    reg = Registrar(URL, sglang_payload(), transport=transport, backoff=FAST, watch_interval=0.05)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=10)
    assert wait_until(lambda: transport.checked >= 2)
    reg.stop()
    _assert_safe(caplog.records)
    assert any(r.getMessage().count("refused\\x0aERROR forged\\x1b[2J") for r in caplog.records)
