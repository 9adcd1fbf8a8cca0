"""`registrar doctor` and `registrar sglang` (docs/cli.md): the same probe and diagnoses as a
running registrar's, from outside. Nothing here registers anything (the one PUT has an empty
body), sends a credential (but a gateway key or bootstrap token it is given) or verifies a
certificate: it looks."""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import Any, Literal
from urllib.parse import urlencode

import requests

from ...core import _rules as rules
from ...core._diagnosis import Code, Diagnosis, Evidence, diagnose, hostport, port_problem
from ...core._errors import ConfigError
from ...core._redact import clean, json_object
from ...protocols._probe import Answer, ProbeOptions, Target, gather, lists_workers
from ...protocols._sglang import PROBE_PATH, TOKEN_ENV, Rank, count_in, is_bootstrap_answer
from . import EXIT_NOT_REGISTERED, EXIT_OK, UsageError, answer

MAX_RANKS = 4096
"""At most this many ranks are asked for one by one (the count is always checked)."""

Verdict = Literal["pass", "fail", "skip"]


@dataclass(frozen=True)
class Finding:
    """One check of one target: `status` skip when not applicable, figures for scripts in `data`."""

    target: str
    url: str
    check: str
    status: Verdict
    detail: str
    diagnosis: Diagnosis | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


_WRONG_SERVICE = frozenset({Code.NOT_BOOTSTRAP, Code.GATEWAY, Code.HTTP_PORT})


def _reach(kind: str, url: str, evidence: Evidence, protocol: str) -> list[Finding]:
    """Resolves, listens, speaks: one probe's findings, the diagnosis on the step that failed."""
    diagnosis = diagnose(evidence)
    at = hostport(evidence.host, evidence.port_text)
    if diagnosis is not None and kind != "bootstrap" and diagnosis.code in _WRONG_SERVICE:
        # The diagnoses of what answers speak of a bootstrap server: say it for this kind.
        diagnosis = Diagnosis(
            f"not-{kind}",
            f"{at} answers, but not as {protocol} ({evidence.detail}): check the {kind} URL",
        )
    resolves = "resolves" if evidence.resolved else "is an address (nothing to resolve)"
    listens = evidence.seen is not None and evidence.seen.value not in ("nothing", "silence")
    steps = [
        ("resolves", evidence.resolved is not False, f"{evidence.host} {resolves}"),
        ("listens", listens, f"something accepts connections on {at}"),
        ("protocol", diagnosis is None, f"speaks {protocol} ({evidence.detail})"),
    ]
    out: list[Finding] = []
    for name, ok, words in steps:
        if out and out[-1].status != "pass":
            out.append(Finding(kind, url, name, "skip", "not checked: an earlier check failed"))
        elif ok:
            out.append(Finding(kind, url, name, "pass", words))
        else:
            sentence = diagnosis.sentence if diagnosis else evidence.detail
            out.append(Finding(kind, url, name, "fail", sentence, diagnosis))
    return out


def _failed(findings: Sequence[Finding]) -> bool:
    return any(f.status == "fail" for f in findings)


def bootstrap_findings(
    url: str, expect: int | None, http_port: int | None, options: ProbeOptions
) -> list[Finding]:
    """`expect`: the rows the topology should have (dp * cp * tp * pp), else the server's;
    `http_port`: the prefill's, compared with the bootstrap port, knocked on when refused."""
    if (unfilled := port_problem(url)) is not None:
        return [Finding("bootstrap", url, "url", "fail", unfilled.sentence, unfilled)]
    seen = gather(url, PROBE_PATH, is_bootstrap_answer, http_port=http_port, options=options)
    found = _reach("bootstrap", url, seen, "SGLang's bootstrap protocol")
    if _failed(found):
        found.append(Finding("bootstrap", url, "rows", "skip", "not checked: unreachable"))
        return found
    return [*found, _rows(url, expect, http_port, options), _auth(url, options)]


def _auth(url: str, options: ProbeOptions) -> Finding:
    """Whether `PUT /route` wants a bearer token (upstream PR #39416, not in 0.5.23), the one in
    $SGLANG_DISAGGREGATION_BOOTSTRAP_AUTH_TOKEN if set, asked with an empty body that no server
    registers (one without auth answers 500, and SGLang logs it)."""
    row = functools.partial(Finding, "bootstrap", url, "auth")
    try:
        token = rules.applied(TOKEN_ENV, os.environ.get(TOKEN_ENV), rules.header_token)
    except ConfigError as exc:
        return row("fail", str(exc))
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = Target.of(url, ProbeOptions(options.timeout, headers)).get("/route", method="PUT")
    sent = f"the token in {TOKEN_ENV}" if token else "no token"
    if isinstance(answer, str):
        return row("skip", f"no answer to PUT /route with {sent}: {answer}")
    if answer.status not in (401, 403):
        return row("pass", f"PUT /route with {sent} is not refused ({answer.status}: empty body)")
    to_set = f"set {TOKEN_ENV} (or REGISTRAR_TOKEN_FILE) on the prefill ranks to the server's token"
    if token:
        said = f"{url} refuses {sent} on PUT /route ({answer.status}): {to_set}"
        return row("fail", said, Diagnosis(Code.DENIED, said))
    said = (
        f"{url} requires a bearer token on PUT /route ({answer.status} without one): the ranks "
        f"send SGLang's own where it has one (node 0's), else {to_set}; set it here to check it"
    )
    return row("skip", said, Diagnosis(Code.DENIED, said))


def _rows(url: str, expect: int | None, http_port: int | None, options: ProbeOptions) -> Finding:
    """How many rows are in against the topology, and which ranks are missing."""
    row = functools.partial(Finding, "bootstrap", url, "rows")
    get = Target.of(url, options).get
    answer = get(PROBE_PATH)
    if isinstance(answer, str):
        return row("fail", f"no answer: {answer}")
    if answer.status == 503:
        count = count_in(answer.text) or 0
        want = f" of {expect}" if expect else ""
        listed = _listed_missing(url, http_port, options)
        which = (
            f"; missing, as the prefill's /server_info lists them: {_names(listed)}"
            if listed
            else "; no rank has registered, so every rank is missing: check that the ranks reach "
            "this server where they register (node 0's --host, the --dist-init-addr host)"
            if count == 0
            else "; which ranks are missing cannot be read before it is (the server answers "
            "503 for every rank; with --http-port, the plugin's /server_info names them)"
        )
        return row(
            "fail",
            f"{count}{want} rows registered: the topology is not complete{which}",
            data={"registered": count, "expected": expect, "missing": listed},
        )
    info = json_object(answer.text) or {}
    sizes = [info.get(k, 0) for k in ("dp_size", "attn_cp_size", "attn_tp_size", "pp_size")]
    if not all(isinstance(s, int) and s >= 1 for s in sizes):
        return row("fail", f"unreadable server info: {answer.text!r}")
    ranks = [Rank(*r) for r in itertools.product(*(range(s) for s in sizes))]
    expected, asked = len(ranks), ranks[:MAX_RANKS]
    answers = [(r, get("/route?" + urlencode(r.query()))) for r in asked]
    missing = [r for r, a in answers if isinstance(a, Answer) and a.status == 404]
    shown = [asdict(r) for r in missing]
    data = {"registered": expected - len(missing), "expected": expected, "missing": shown}
    problems = []
    if expect is not None and expect != expected:
        problems.append(f"the server's topology has {expected} rows, {expect} expected")
    if missing:
        problems.append(
            f"{len(missing)} of {expected} ranks missing ({_names(shown)}): the count was reached "
            "with a rank registered twice"
        )
    if problems:
        return row("fail", "; ".join(problems), data=data)
    note = "" if len(asked) == expected else f" (the first {len(asked)} asked one by one)"
    return row("pass", f"{expected} of {expected} rows{note}", data=data)


def _names(rows: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"dp{r['dp']} cp{r['cp']} tp{r['tp']} pp{r['pp']}" for r in rows[:20])


def _listed_missing(
    url: str, http_port: int | None, options: ProbeOptions
) -> list[dict[str, Any]] | None:
    """The rows node 0's plugin lists as missing in the prefill's `/server_info` on the same host
    (`registrar_bootstrap`, docs/sglang.md); None where nothing there says."""
    if http_port is None:
        return None
    at = f"http://{hostport(Target.of(url).at.host, http_port)}/server_info"
    try:  # the whole answer (the probe reads 4 KiB; SGLang's server_info is longer)
        info = json_object(requests.get(at, timeout=options.timeout).content)
    except requests.RequestException:
        info = None
    listed = ((info or {}).get("registrar_bootstrap") or {}).get("missing_rows")
    return listed if isinstance(listed, list) and listed else None


def gateway_findings(url: str, options: ProbeOptions) -> list[Finding]:
    """A gateway (smg): reachable and listing workers, none twice, none unhealthy."""
    seen = gather(url, "/workers", lists_workers, options=options)
    found = _reach("gateway", url, seen, "smg")
    if _failed(found):
        return found
    answer = Target.of(url, options).get("/workers")
    body = json_object(answer.text) if isinstance(answer, Answer) else None
    listed = [w for w in (body or {}).get("workers", []) if isinstance(w, dict)]
    urls = [str(w.get("url", "")).rstrip("/") for w in listed]
    twice = sorted({u for u in urls if urls.count(u) > 1})
    sick = sorted(str(w.get("url")) for w in listed if w.get("is_healthy") is False)
    data = {"workers": len(listed), "duplicates": twice, "unhealthy": sick}
    named = (("listed twice", twice), ("unhealthy", sick))
    problems = [f"{what}: {', '.join(which)}" for what, which in named if which]
    verdict: Verdict = "fail" if problems else "pass"
    detail = "; ".join(problems) or f"{len(listed)} workers, none twice, none unhealthy"
    return [*found, Finding("gateway", url, "workers", verdict, detail, data=data)]


def _is_etcd(answer: Answer) -> bool:
    return answer.status == 200 and "etcdserver" in (json_object(answer.text) or {})


def etcd_findings(url: str, options: ProbeOptions) -> list[Finding]:
    """An etcd endpoint: reachable and answering `GET /version` as etcd."""
    seen = gather(url, "/version", _is_etcd, options=options)
    found = _reach("etcd", url, seen, "etcd")
    if not _failed(found):
        found[-1] = Finding("etcd", url, "protocol", "pass", f"etcd answers ({seen.detail})")
    return found


_MARKS = {"pass": "[ok]  ", "fail": "[FAIL]", "skip": "[--]  "}


def _urls(flag: str, given: list[str] | None) -> tuple[str, ...]:
    """Each URL of a repeated flag (several may be comma-separated), checked, trailing / cut."""
    found = [url for text in given or () for url in rules.comma_list(text)]
    for url in found:
        try:
            rules.url(url)
        except rules.Invalid as exc:
            raise UsageError(f"{flag} {clean(url, 200)!r} {exc.rule}") from None
    return tuple(url.rstrip("/") for url in found)


def _key(path: str) -> str:
    """The gateway's key, from a file (never a flag: it would show in `ps`)."""
    try:
        with open(path, encoding="utf-8") as file:
            key = file.read().strip()
    except OSError as exc:
        raise UsageError(f"--gateway-key-file {clean(path, 200)!r}: {exc.strerror}") from None
    if not key or "\n" in key:
        raise UsageError(f"--gateway-key-file {clean(path, 200)!r} must hold one line, the key")
    return key


def human(findings: Sequence[Finding]) -> list[str]:
    """One block per target, one line per check, then the verdict."""
    lines: list[str] = []
    for (target, url), group in itertools.groupby(findings, attrgetter("target", "url")):
        lines.append(f"{target} {clean(url, 200)}")
        for finding in group:
            code = f" [diagnosis {finding.diagnosis.code}]" if finding.diagnosis else ""
            detail = clean(finding.detail, 600)
            lines.append(f"  {_MARKS[finding.status]} {finding.check}: {detail}{code}")
    failed = sum(f.status == "fail" for f in findings)
    lines.append(f"not healthy: {failed} check(s) failed" if failed else "healthy")
    return lines


def sglang_findings() -> list[Finding]:
    """The SGLang environment, read by the plugin's release table (`registrar sglang`): the
    release and plugin system found, then whether the plugin can register there."""
    from ...integrations.sglang._report import installed_report  # noqa: PLC0415

    report = installed_report()
    where = report["path"] or report["python"]
    found = bool(report["installed"] and report["plugin_system"] and report["entry_point"])
    release = (
        f"sglang {report['sglang'] or '(version unknown)'}; plugin system: "
        f"{'yes' if report['plugin_system'] else 'no'}; registrar's entry point: "
        f"{'yes' if report['entry_point'] else 'no'}"
        if report["installed"]
        else "SGLang is not installed in this Python environment"
    )
    lost = [f["feature"] for f in report["features"] if not f["available"]]
    registers = any(f["feature"] == "registration" and f["available"] for f in report["features"])
    plugin: Verdict = ("pass" if registers else "fail") if found else "skip"
    return [
        Finding("sglang", where, "release", "pass" if found else "fail", release),
        Finding("sglang", where, "plugin", plugin, report["advice"], data={"unavailable": lost}),
    ]


def cmd_doctor(args: argparse.Namespace) -> int:
    gateways = _urls("--gateway", args.gateway)
    etcd = _urls("--etcd", args.etcd)
    if args.url is None and not gateways and not etcd and not args.sglang:
        raise UsageError("nothing to check: give --url, --gateway, --etcd or --sglang")
    key = _key(args.gateway_key_file) if args.gateway_key_file else None
    options = ProbeOptions(args.timeout)
    found: list[Finding] = []
    # A bootstrap URL whose port was never filled in (":None") is the first check's to report.
    if args.url is not None:
        found += bootstrap_findings(args.url.rstrip("/"), args.expect, args.http_port, options)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    for url in gateways:
        found += gateway_findings(url, ProbeOptions(args.timeout, headers))
    for url in etcd:
        found += etcd_findings(url, options)
    if args.sglang:
        found += sglang_findings()
    healthy = not _failed(found)
    outcome = EXIT_OK if healthy else EXIT_NOT_REGISTERED  # as status: "not registered"
    report = {"healthy": healthy, "checks": [asdict(f) for f in found]}
    return answer([json.dumps(report)] if args.json else human(found), outcome)


def cmd_sglang(args: argparse.Namespace) -> int:
    from ...integrations.sglang._report import describe, installed_report  # noqa: PLC0415

    report = installed_report()
    sys.stdout.write(json.dumps(report, indent=2) + "\n" if args.json else describe(report))
    return EXIT_OK
