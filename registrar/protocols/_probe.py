"""The cheap probe behind a diagnosis: resolve, connect, see what speaks there, knock on the
rank's own port. No step raises (what failed is evidence); fresh connections, no credential."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from urllib.parse import urlsplit

from urllib3.connection import HTTPConnection, HTTPSConnection

from .._version import __version__
from ..core._diagnosis import Evidence, Knock, Seen, port_text
from ..core._errors import describe_exception
from ..core._redact import clean, json_object, redact_url
from ._httpvalues import Endpoint
from ._resolver import RESOLVER, Unresolved, is_ip_literal

_HEADERS = {"User-Agent": f"registrar/{__version__} (probe)", "Accept": "*/*"}


@dataclass(frozen=True)
class Answer:
    status: int
    content_type: str
    text: str  # the start of the body


Recognise = Callable[[Answer], bool]  # whether an answer to the probe's GET is the server's own


def _connect(address: str, port: int, timeout: float) -> tuple[Seen | None, str]:
    """None when something accepts the connection; else NOTHING or SILENCE and why."""
    try:
        with socket.create_connection((address, port), timeout=timeout):
            return None, ""
    except ConnectionRefusedError:
        return Seen.NOTHING, "connection refused"
    except TimeoutError:
        return Seen.SILENCE, f"no answer within {timeout:g} s"
    except OSError as exc:
        return Seen.SILENCE, describe_exception(exc)


def _tls_context() -> ssl.SSLContext:
    """Only to see whether TLS answers: nothing secret is sent, nothing is verified."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True)
class ProbeOptions:
    timeout: float = 2.0  # seconds for each step (resolve, connect, one answer)
    headers: Mapping[str, str] = field(default_factory=dict)  # for every GET (a gateway's key)


def lists_workers(answer: Answer | str) -> bool:
    """smg's `GET /workers`: a JSON object with a `workers` list."""
    if isinstance(answer, str) or answer.status != 200:
        return False
    return isinstance((json_object(answer.text) or {}).get("workers"), list)


@dataclass(frozen=True)
class Target:
    at: Endpoint
    address: str
    options: ProbeOptions

    @classmethod
    def of(cls, url: str, options: ProbeOptions = ProbeOptions(), address: str = "") -> Target:
        """`url`'s endpoint, reached at `address` (by default its host)."""
        at = Endpoint.of(url)
        return cls(at, address or at.host, options)

    def get(self, path: str, tls: bool | None = None, method: str = "GET") -> Answer | str:
        """One GET (or empty PUT) on a fresh connection: the answer, or why there was none."""
        timeout, host = self.options.timeout, self.at.host
        tls = self.at.tls if tls is None else tls
        conn: HTTPConnection
        if tls:
            conn = HTTPSConnection(
                self.address,
                self.at.port,
                timeout=timeout,
                ssl_context=_tls_context(),
                server_hostname=host,
            )
        else:
            conn = HTTPConnection(self.address, self.at.port, timeout=timeout)
        with contextlib.ExitStack() as opened:
            opened.callback(conn.close)
            try:
                headers = {**_HEADERS, **self.options.headers, "Host": host}
                nothing = b"" if method == "PUT" else None
                conn.request(method, self.at.prefix + path, nothing, headers, preload_content=False)
                response = conn.getresponse()
                opened.callback(response.close)  # its file holds the socket open until closed
                body = response.read(4096, decode_content=False)
                kind = response.headers.get("Content-Type", "").split(";")[0].strip()
                return Answer(response.status, kind, body.decode("utf-8", "replace"))
            except Exception as exc:  # whatever broke is the evidence
                return describe_exception(exc)


def _what_answers(target: Target, path: str, recognise: Recognise) -> tuple[Seen, str]:
    answer = target.get(path)
    if isinstance(answer, str):
        return _not_http(target, answer)
    shown = clean(" ".join(answer.text.split()), 80)
    kind = answer.content_type or "no content type"
    described = f"GET {path.partition('?')[0]} answered {answer.status} {kind}"
    described += f": {shown}" if shown else ""
    if recognise(answer):
        return Seen.BOOTSTRAP, described
    if answer.status in (401, 403):
        return Seen.DENIED, described
    if answer.content_type == "text/html" or answer.text.lstrip().startswith("<"):
        return Seen.HTML, described
    if lists_workers(target.get("/workers")):
        return Seen.GATEWAY, f"{described}; GET /workers lists workers"
    return Seen.OTHER, described


def _not_http(target: Target, why: str) -> tuple[Seen, str]:
    """No HTTP answer on the URL's scheme: try the other one (unless the server went away)."""
    timeout = target.options.timeout
    gone, how = _connect(target.address, target.at.port, timeout)
    if gone is not None:
        return gone, how
    if target.at.tls:
        plain = target.get("/", tls=False)
        if isinstance(plain, Answer):
            return Seen.PLAIN, f"TLS: {why}; plain GET / answered {plain.status}"
        return Seen.TLS_FAILED, why
    try:
        with (
            socket.create_connection((target.address, target.at.port), timeout=timeout) as raw,
            _tls_context().wrap_socket(raw, server_hostname=target.at.host) as tls,
        ):
            return Seen.TLS, f"plain HTTP: {why}; TLS handshake completed ({tls.version()})"
    except (OSError, ValueError):
        return Seen.OTHER, f"not HTTP: {why}"


def _knock(address: str, port: int, host: str, timeout: float) -> Knock:
    label = "the prefill's HTTP port"
    refused, _ = _connect(address, port, timeout)
    if refused is not None:
        return Knock(port, label, listens=False, http=False)
    answer = Target(Endpoint(host, port, "", False), address, ProbeOptions(timeout)).get("/")
    return Knock(port, label, listens=True, http=isinstance(answer, Answer))


def gather(
    url: str,
    path: str,
    recognise: Recognise,
    *,
    http_port: int | None = None,
    options: ProbeOptions = ProbeOptions(),
) -> Evidence:
    """Probe `url` (`GET {url}{path}`, read by `recognise`); `http_port` is the rank's own."""
    timeout = options.timeout
    parts = urlsplit(url)
    host = parts.hostname or ""
    seen = Evidence(
        redact_url(url), host, port_text(parts.netloc), parts.scheme, http_port=http_port
    )
    port = seen.port
    if not port or not host:
        return seen
    if is_ip_literal(host):
        address = host
    else:
        try:  # the transports' own lookup: no thread of its own under a stalled resolver
            resolved = RESOLVER.resolve(host, port, timeout)
        except Unresolved as exc:
            return replace(seen, resolved=False, detail=describe_exception(exc))
        seen, address = replace(seen, resolved=True), str(resolved.addresses[0][3][0])
    failed, why = _connect(address, port, timeout)
    if failed is not None:
        own = http_port if http_port != port else None
        knocks = (_knock(address, own, host, timeout),) if own else ()
        return replace(seen, seen=failed, detail=why, others=knocks)
    kind, detail = _what_answers(Target.of(url, options, address), path, recognise)
    return replace(seen, seen=kind, detail=detail)
