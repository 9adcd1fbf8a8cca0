"""The etcd protocol's pure parts, without a server: the watch stream's chunked framing, what a
watch message means, how gateway answers are classified, and the construction contract."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registrar import ConfigError
from registrar._assembly import etcd_registrar
from registrar.protocols._etcd.client import int64, parse_answer
from registrar.protocols._etcd.settings import EtcdSettings
from registrar.protocols._etcd.transport import EtcdTransport
from registrar.protocols._etcd.watch import ChunkedLines, StreamError, watch_change
from registrar.protocols._httpconn import TlsError
from registrar.protocols._httpvalues import HttpResult

KEY, VALUE, LEASE = b"/k", b'{"a":1}', 7


def _chunked(*messages: dict[str, Any]) -> bytes:
    out = b""
    for message in messages:
        data = json.dumps(message).encode() + b"\n"
        out += f"{len(data):x}\r\n".encode() + data + b"\r\n"
    return out


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_chunked_lines_fed_one_byte_at_a_time() -> None:
    stream = _chunked({"result": {"created": True}}, {"result": {"events": []}})
    decoder = ChunkedLines()
    messages: list[Any] = []
    for i in range(len(stream)):
        messages += decoder.feed(stream[i : i + 1])
    assert messages == [{"result": {"created": True}}, {"result": {"events": []}}]
    assert not decoder.ended
    assert decoder.feed(b"0\r\n\r\n") == []
    assert decoder.ended


def test_chunked_lines_message_split_across_chunks() -> None:
    data = json.dumps({"result": {"x": 1}}).encode() + b"\n"
    first, second = data[:5], data[5:]
    stream = f"{len(first):x};ext=1\r\n".encode() + first + b"\r\n"
    stream += f"{len(second):x}\r\n".encode() + second + b"\r\n"
    assert ChunkedLines().feed(stream) == [{"result": {"x": 1}}]


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"zz\r\n", "bad chunk size"),
        (b"1" * 2000, "chunk-size line too long"),
        (b"2\r\n{}XX", "not followed by CRLF"),
        (b"3\r\n{x\n\r\n", "unreadable watch message"),
    ],
)
def test_chunked_lines_refuses_broken_framing(data: bytes, error: str) -> None:
    with pytest.raises(StreamError, match=error):
        ChunkedLines().feed(data)


def test_chunked_lines_bounds_one_message() -> None:
    decoder = ChunkedLines(limit=100)
    with pytest.raises(StreamError, match="over 100 bytes"):
        decoder.feed(b"400\r\n" + b"x" * 0x400)


def _event(kind: str | None, value: bytes = VALUE, lease: int = LEASE, rev: int = 10) -> Any:
    kv = {"key": _b64(KEY), "mod_revision": str(rev), "value": _b64(value), "lease": str(lease)}
    event: dict[str, Any] = {"kv": kv}
    if kind:
        event["type"] = kind
    return {"result": {"events": [event]}}


def test_watch_change_reads_events() -> None:
    assert watch_change(_event(None), KEY, VALUE, LEASE, 5) is None  # our own put
    assert "deleted" in (watch_change(_event("DELETE"), KEY, VALUE, LEASE, 5) or "")
    assert "overwritten" in (watch_change(_event(None, b"x"), KEY, VALUE, LEASE, 5) or "")
    assert "overwritten" in (watch_change(_event(None, lease=9), KEY, VALUE, LEASE, 5) or "")
    # Older than what the last check saw: already accounted for.
    assert watch_change(_event("DELETE", rev=4), KEY, VALUE, LEASE, 5) is None
    assert watch_change({"result": {"created": True}}, KEY, VALUE, LEASE, 5) is None
    other = {"result": {"events": [{"kv": {"key": _b64(b"/other")}, "type": "DELETE"}]}}
    assert watch_change(other, KEY, VALUE, LEASE, 5) is None


def test_watch_change_reads_cancellation() -> None:
    compacted = {"result": {"canceled": True, "compact_revision": "42"}}
    assert "compacted up to 42" in (watch_change(compacted, KEY, VALUE, LEASE, 5) or "")
    denied = {"result": {"canceled": True, "cancel_reason": "permission denied"}}
    assert "permission denied" in (watch_change(denied, KEY, VALUE, LEASE, 5) or "")


def _result(code: int | None, text: str = "", error: BaseException | None = None) -> HttpResult:
    return HttpResult(code, {}, text, error, reconnected=False)


def test_parse_answer_unwraps_stream_results_and_errors() -> None:
    ok = parse_answer("e", _result(200, '{"result": {"ID": "5", "TTL": "3"}}\n'), str)
    assert ok.ok
    assert ok.body == {"ID": "5", "TTL": "3"}
    gone = parse_answer(
        "e", _result(404, '{"error": "x", "code": 5, "message": "lease not found"}'), str
    )
    assert not gone.ok
    assert gone.code == 5
    assert not gone.member_trouble
    stream_error = parse_answer(
        "e", _result(200, '{"error": {"grpc_code": 14, "message": "no leader"}}'), str
    )
    assert stream_error.code == 14
    assert stream_error.member_trouble
    assert parse_answer("e", _result(503, "<html>busy</html>"), str).member_trouble
    refused = parse_answer("e", _result(None, error=ConnectionRefusedError("refused")), str)
    assert refused.member_trouble
    tls = parse_answer("e", _result(None, error=TlsError("bad cert")), str)
    assert not tls.member_trouble  # every member would fail the same way


def test_watch_interval_keeps_renewals_on_time() -> None:
    # The loop waits at most 1.5 intervals: a renewal every TTL/3 at the latest.
    transport = EtcdTransport(EtcdSettings("http://127.0.0.1:2379", "/k", ttl=9.0))
    assert transport.fit_watch_interval(None, True) * 1.5 == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"endpoints": ""}, "at least one etcd client URL"),
        ({"endpoints": "ftp://x"}, "must start with http"),
        ({"endpoints": "http://a:1,http://a:1"}, "must not repeat"),
        ({"key": ""}, "key must be a non-empty"),
        ({"ttl": 0.5}, "ttl must be"),
        ({"keepalive_fraction": 0.9}, "keepalive_fraction"),
        ({"username": "u"}, "give both or neither"),
        ({"ttl": 2, "timeout": 2.0}, "must be shorter than"),
        ({"cert": ("/no/such.pem", "/no/such.key")}, "cert must be a"),
    ],
)
def test_construction_errors_name_the_option(kwargs: dict[str, Any], error: str) -> None:
    options: dict[str, Any] = {"endpoints": "http://127.0.0.1:2379", "key": "/k"}
    options.update(kwargs)
    with pytest.raises(ConfigError, match=error):
        EtcdTransport(EtcdSettings(**options))


def test_etcd_registrar_derives_and_bounds_the_watch_interval() -> None:
    reg = etcd_registrar("http://127.0.0.1:2379", "/k", {"a": 1}, ttl=9)
    assert reg.settings.watch_interval == pytest.approx(2.0)
    assert reg.status().url == "http://127.0.0.1:2379 key /k"
    with pytest.raises(ConfigError, match="watch_interval must be within"):
        etcd_registrar("http://127.0.0.1:2379", "/k", {"a": 1}, ttl=9, watch_interval=5)


@pytest.mark.parametrize(
    ("sent", "read"),
    [
        ("42", 42),
        ("-7", -7),
        (42, 42),
        ("²", 0),
        ("--5", 0),
        ("-", 0),
        ("", 0),
        (" 5", 0),
        ("9" * 20, 0),
        (True, 0),
        (None, 0),
        ("٣", 0),
    ],
)
def test_an_int64_field_reads_ascii_digits_else_zero(sent: object, read: int) -> None:
    assert int64(sent) == read


@given(st.one_of(st.text(max_size=25), st.integers(), st.floats(), st.none(), st.booleans()))
def test_no_answer_field_makes_int64_raise(sent: object) -> None:
    assert isinstance(int64(sent), int)
