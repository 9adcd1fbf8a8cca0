from __future__ import annotations

import pytest
import requests
from support import Ports

from registrar.core._errors import describe_exception, root_cause
from registrar.core._redact import Secrets, redact_url


def test_refused_connection_names_errno_not_urllib3_wrapper(ports: Ports) -> None:
    with pytest.raises(requests.ConnectionError) as info:
        requests.put(f"{ports.refusing_url()}/route", json={}, timeout=2)
    text = describe_exception(info.value)
    assert isinstance(root_cause(info.value), ConnectionRefusedError)
    assert text == "[Errno 111] Connection refused"
    assert "Max retries" not in text


def _wrapped(suppress: bool) -> RuntimeError:
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except OSError:
            if suppress:
                raise RuntimeError("wrapper text nobody needs") from None
            raise RuntimeError("wrapper text nobody needs")  # noqa: B904
    except RuntimeError as exc:
        return exc
    raise AssertionError("unreachable")


def test_context_only_chain_is_followed() -> None:
    # `raise X` inside `except` without `from`: only __context__ links them.
    assert describe_exception(_wrapped(False)) == "[Errno 104] Connection reset by peer"
    suppressed = _wrapped(True)
    assert root_cause(suppressed) is suppressed


def test_wrapped_argument_and_reason_are_followed() -> None:
    inner = ConnectionRefusedError(111, "Connection refused")

    class Pooled(Exception):
        def __init__(self, reason: BaseException) -> None:
            super().__init__("Max retries exceeded")
            self.reason = reason

    outer = requests.ConnectionError(Pooled(inner))
    assert root_cause(outer) is inner


def test_cycles_terminate() -> None:
    a, b = ValueError("a"), ValueError("b")
    a.__cause__, b.__cause__ = b, a
    assert root_cause(a) in (a, b)


def test_empty_message_falls_back_to_type_name() -> None:
    assert describe_exception(TimeoutError()) == "TimeoutError"


def test_url_credentials_redacted() -> None:
    assert redact_url("http://user:pw@127.0.0.1:8998/x") == "http://***@127.0.0.1:8998/x"
    assert redact_url("http://[::1]:80") == "http://[::1]:80"
    assert redact_url("http://u:p@[::1]:80/") == "http://***@[::1]:80/"
    assert Secrets.of(("abc", "")).redact("Bearer abc and abc") == "Bearer *** and ***"
