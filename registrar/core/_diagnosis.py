"""What is wrong, in words: `diagnose` is a pure function from the evidence a cheap probe gathered
about a bootstrap URL to the one `Diagnosis` it supports, saying what was seen, never more
("nothing listens on 10.0.0.5:8998; 10.0.0.5:30000 answers HTTP", not "your port is wrong")."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from ._redact import redact_url


class Code(StrEnum):
    """The diagnoses, by the short code that status, health, metrics and `doctor` carry."""

    PORT_MISSING = "port-missing"
    UNRESOLVED = "unresolved"
    HTTP_PORT = "http-port"
    REFUSED_HOST_UP = "refused-host-up"
    REFUSED = "refused"
    NO_ANSWER = "no-answer"
    TLS_ON_PLAIN = "tls-on-plain"
    PLAIN_ON_TLS = "plain-on-tls"
    TLS_FAILED = "tls-failed"
    GATEWAY = "gateway"
    DENIED = "denied"
    NOT_BOOTSTRAP = "not-bootstrap"


@dataclass(frozen=True)
class Diagnosis:
    """The best diagnosis: a short `code` (`Code`), one sentence: what was seen, what to check."""

    code: str
    sentence: str

    def __post_init__(self) -> None:
        # A plain string (not the `Code` member): whatever serialises the status sees text.
        object.__setattr__(self, "code", str(self.code))


class Seen(StrEnum):
    """What answered on the bootstrap URL's host and port."""

    NOTHING = "nothing"  # the connection was refused: no process listens there
    SILENCE = "silence"  # the connection timed out: nothing answered at all
    BOOTSTRAP = "bootstrap"
    TLS = "tls"  # a TLS handshake, on a plain http:// URL
    PLAIN = "plain"  # plain HTTP, on an https:// URL
    TLS_FAILED = "tls-failed"  # the handshake failed, and no plain HTTP answers either
    HTML = "html"
    GATEWAY = "gateway"  # smg's `GET /workers` list
    DENIED = "denied"  # 401 or 403: the server wants a credential the probe did not send
    OTHER = "other"  # HTTP but not a bootstrap server, or something that is not HTTP


@dataclass(frozen=True)
class Knock:
    """Another port of the same host that the probe knocked on, and what it found."""

    port: int
    label: str  # why this port was known ("the prefill HTTP port in the payload")
    listens: bool
    http: bool  # it answered an HTTP request (with any status)


@dataclass(frozen=True)
class Evidence:
    """What one probe of a bootstrap URL saw, `detail` in a few words ("GET /route?... answered
    404 text/html"); `seen` is None when the name did not resolve or there is no port."""

    url: str
    host: str
    port_text: str  # as the URL writes it ("8998", "None", "" when absent)
    scheme: str = "http"
    resolved: bool | None = None  # None: not looked up (an address literal, or no port)
    seen: Seen | None = None
    detail: str = ""
    others: tuple[Knock, ...] = ()
    http_port: int | None = None  # the rank's own (`prefill_http_port` in the payload)

    @property
    def port(self) -> int | None:
        return int(self.port_text) if self.port_text.isdigit() else None


def port_text(netloc: str) -> str:
    """The port as a URL's authority writes it ("8998", "None"; "" when there is none)."""
    hostpart = netloc.rpartition("@")[2]
    if hostpart.startswith("["):
        rest = hostpart.partition("]")[2]
        return rest[1:] if rest.startswith(":") else ""
    return hostpart.rpartition(":")[2] if ":" in hostpart else ""


def port_problem(url: str) -> Diagnosis | None:
    """The diagnosis of a URL whose port was never filled in (`:None`, `:0`, `:`), seen in
    the text alone; None for a URL with a port number, or none at all (the scheme's)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return None  # not a URL at all: its own error says so
    text = port_text(parts.netloc)
    if (text == "" and not parts.netloc.endswith(":")) or (text.isdigit() and int(text) != 0):
        return None
    return diagnose(Evidence(redact_url(url), parts.hostname or "", text, parts.scheme))


def hostport(host: str, port: object) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_PORT_FLAG = "--disaggregation-bootstrap-port"


def diagnose(seen: Evidence) -> Diagnosis | None:
    """The one diagnosis the evidence supports, or None (a bootstrap server answers there)."""
    at = hostport(seen.host, seen.port_text)
    if seen.port is None or seen.port == 0:
        return Diagnosis(
            Code.PORT_MISSING,
            f"{seen.url} has no usable port (':{seen.port_text}'): the port was never filled "
            f"in; for a bootstrap URL set {_PORT_FLAG} (and the router's bootstrap port) to "
            "the prefill's value",
        )
    if seen.resolved is False:
        return Diagnosis(
            Code.UNRESOLVED,
            f"the name {seen.host} does not resolve ({seen.detail}): check the host in the "
            "URL and the resolver",
        )
    if seen.seen is Seen.BOOTSTRAP or seen.seen is None:
        return None
    if seen.http_port is not None and seen.port == seen.http_port:
        return Diagnosis(
            Code.HTTP_PORT,
            f"{at} is the rank's own HTTP port (prefill_http_port), not a "
            f"bootstrap port ({seen.detail or seen.seen.value}): give the value of {_PORT_FLAG}",
        )
    if seen.seen is Seen.NOTHING:
        return _refused(seen, at)
    code, text = _ANSWERS[seen.seen]
    return Diagnosis(code, text.format(at=at, detail=seen.detail))


_ANSWERS: dict[Seen, tuple[Code, str]] = {
    Seen.SILENCE: (
        Code.NO_ANSWER,
        "{at} does not answer (connecting timed out, {detail}): a wrong address, a firewall, or "
        "a host that is down",
    ),
    Seen.TLS: (
        Code.TLS_ON_PLAIN,
        "{at} speaks TLS but the bootstrap URL says http:// ({detail}): use https:// (with "
        "the server's CA bundle)",
    ),
    Seen.PLAIN: (
        Code.PLAIN_ON_TLS,
        "{at} answers plain HTTP but the bootstrap URL says https:// ({detail}): use http://, "
        "or enable TLS on the server",
    ),
    Seen.TLS_FAILED: (
        Code.TLS_FAILED,
        "the TLS handshake with {at} fails ({detail}): check the certificate, the CA bundle "
        "and the server's TLS setup",
    ),
    Seen.GATEWAY: (
        Code.GATEWAY,
        "{at} answers as a gateway, not a bootstrap server ({detail}): the bootstrap URL names "
        "the router; give the prefill's host and bootstrap port",
    ),
    Seen.DENIED: (
        Code.DENIED,
        "{at} refuses the request without the right credential ({detail}): give the key or "
        "token it expects",
    ),
    Seen.HTML: (
        Code.NOT_BOOTSTRAP,
        "{at} answers with an HTML page, not as a bootstrap server ({detail}): check the "
        "bootstrap URL: this server does not take registrations there",
    ),
    Seen.OTHER: (
        Code.NOT_BOOTSTRAP,
        "{at} answers, but not as a bootstrap server ({detail}): check the bootstrap URL: this "
        "server does not take registrations there",
    ),
}


def _refused(seen: Evidence, at: str) -> Diagnosis:
    if (knock := next((k for k in seen.others if k.listens), None)) is not None:
        what = "answers HTTP" if knock.http else "accepts connections"
        return Diagnosis(
            Code.REFUSED_HOST_UP,
            f"nothing listens on {at}; {hostport(seen.host, knock.port)} ({knock.label}) "
            f"{what}: the host is up; is {_PORT_FLAG} the same on every node?",
        )
    if seen.others:
        tried = ", ".join(f"{hostport(seen.host, k.port)} ({k.label})" for k in seen.others)
        also = f"; {tried} does not answer either"
    else:
        also = "; no other port of that host is known to check"
    return Diagnosis(
        Code.REFUSED,
        f"nothing listens on {at}{also}: is the host right, and has the bootstrap server started?",
    )
