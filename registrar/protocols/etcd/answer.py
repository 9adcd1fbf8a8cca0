"""What etcd's JSON gateway says, parsed: one exchange becomes an `EtcdAnswer` (the message, or
the gRPC error and whether it speaks for one member only), and the gateway's encodings (keys and
values base64, int64 as strings) are read here, in one place, never trusting their types.

Pure: unit-tested without a server (tests/test_etcd_unit.py)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from ...core.redact import clean
from ...core.untrusted import load_json
from ..httpconn import TlsError
from ..httpvalues import HttpResult


class Grpc(IntEnum):
    """The gRPC status codes the gateway passes on in its error bodies."""

    CANCELLED = 1
    UNKNOWN = 2
    INVALID = 3
    DEADLINE = 4
    NOT_FOUND = 5
    PERMISSION = 7
    EXHAUSTED = 8
    PRECONDITION = 9
    ABORTED = 10
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


# Answers that speak for one member only (it has no leader, is shutting down, timed out):
# another member may do better.
_MEMBER_TROUBLE = frozenset(
    {Grpc.CANCELLED, Grpc.UNKNOWN, Grpc.DEADLINE, Grpc.ABORTED, Grpc.INTERNAL, Grpc.UNAVAILABLE}
)


def b64(data: bytes) -> str:
    """Bytes as the gateway takes them."""
    return base64.b64encode(data).decode("ascii")


def unb64(text: object) -> bytes | None:
    """Bytes the gateway sent, or None for anything that is not base64 text."""
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def int64(value: object, default: int = 0) -> int:
    """An int64 the gateway sent as a string (or omitted, meaning 0)."""
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit() and len(value) <= 20:
        return int(value)
    return default


def header_revision(body: Mapping[str, Any]) -> int:
    """The store's revision an answer was made at (0 when it names none)."""
    header = body.get("header")
    return int64(header.get("revision")) if isinstance(header, Mapping) else 0


@dataclass(frozen=True)
class EtcdAnswer:
    """One gateway call, parsed: the message on success, the gRPC error otherwise."""

    endpoint: str
    status_code: int | None
    body: Mapping[str, Any] | None = None
    """The message (a streaming call's `result` unwrapped) on success."""
    code: int | None = None
    """The gRPC status code of an error answer."""
    message: str = ""
    """Error text: etcd's message or the root cause of a failed exchange, cleaned."""
    error: BaseException | None = None
    refused: bool = False
    """The connection was refused: nothing listens at this endpoint."""

    @property
    def ok(self) -> bool:
        return self.body is not None

    @property
    def member_trouble(self) -> bool:
        """No answer, or one that speaks for this member only: try another."""
        if self.ok:
            return False
        if self.status_code is None:
            return not isinstance(self.error, TlsError)
        if self.code is not None:
            return self.code in _MEMBER_TROUBLE
        return self.status_code >= 500


def parse_answer(
    endpoint: str, result: HttpResult, describe: Callable[[BaseException], str]
) -> EtcdAnswer:
    """Classify one exchange with the gateway."""
    if result.error is not None:
        return EtcdAnswer(
            endpoint,
            None,
            message=describe(result.error),
            error=result.error,
            refused=result.refused,
        )
    status = result.status_code
    try:
        document = load_json(result.text) if result.complete else None
    except ValueError:
        document = None
    if isinstance(document, dict) and isinstance(document.get("result"), dict):
        document = document["result"]  # a streaming call's one message
    elif isinstance(document, dict) and isinstance(document.get("error"), dict):
        inner = document["error"]  # a streaming call's error: {"error": {"grpc_code": ...}}
        document = {"code": inner.get("grpc_code"), "message": inner.get("message")}
    if status == 200 and isinstance(document, dict) and "code" not in document:
        return EtcdAnswer(endpoint, status, body=document)
    code = document.get("code") if isinstance(document, dict) else None
    message = document.get("message") if isinstance(document, dict) else None
    if not isinstance(message, str) or not message:
        message = f"HTTP {status}: {' '.join(result.text.split())}"
    return EtcdAnswer(
        endpoint,
        status,
        code=code if isinstance(code, int) and not isinstance(code, bool) else None,
        message=clean(message, 200),
    )
