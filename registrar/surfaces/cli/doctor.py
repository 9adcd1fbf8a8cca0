"""`registrar doctor`: check a deployment before (or while) it serves, and say what is wrong in
words; `--json` for scripts (the schema is in docs/cli.md). Exit 0 only when every check made
passed. And `registrar sglang`: what the SGLang plugin will do in this environment's SGLang,
read from its installed source without starting it (where SGLang is too old to load the
plugin, this is where the user learns it)."""

from __future__ import annotations

import argparse
import json
import sys

from ...core import rules
from ...core.redact import clean
from ..doctor import Finding, Report, Target, run_doctor
from ..parsers import urls
from .common import EXIT_NOT_REGISTERED, EXIT_OK, UsageError, answer

_MARKS = {"pass": "[ok]  ", "fail": "[FAIL]", "skip": "[--]  "}


def _urls(flag: str, given: list[str] | None) -> tuple[str, ...]:
    """Every URL of a repeated flag (each may list several, comma-separated), checked."""
    found = [url for text in given or () for url in urls(text)]
    for url in found:
        try:
            rules.url(url)
        except rules.Invalid as exc:
            raise UsageError(f"{flag} {clean(url, 200)!r} {exc.rule}") from None
    return tuple(found)


def _target(args: argparse.Namespace) -> Target:
    gateways = _urls("--gateway", args.gateway)
    etcd = _urls("--etcd", args.etcd)
    if args.url is None and not gateways and not etcd and not args.sglang:
        raise UsageError("nothing to check: give --url, --gateway, --etcd or --sglang")
    # The bootstrap URL is not refused here for a port that was never filled in (":None"):
    # saying so is the first check's job.
    key = _key(args.gateway_key_file) if args.gateway_key_file else None
    return Target(args.url, args.expect, args.http_port, gateways, etcd, args.timeout, key)


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


def human(report: Report) -> list[str]:
    """The report for a person: one block per target, one line per check, then the verdict."""
    lines: list[str] = []
    where: tuple[str, str] | None = None
    for finding in report.findings:
        if (finding.target, finding.url) != where:
            where = (finding.target, finding.url)
            lines.append(f"{finding.target} {clean(finding.url, 200)}")
        lines.append(_line(finding))
    failed = sum(f.status == "fail" for f in report.findings)
    lines.append("healthy" if report.healthy else f"not healthy: {failed} check(s) failed")
    return lines


def _line(finding: Finding) -> str:
    code = f" [diagnosis {finding.diagnosis.code}]" if finding.diagnosis else ""
    return f"  {_MARKS[finding.status]} {finding.check}: {clean(finding.detail, 600)}{code}"


def sglang_findings() -> list[Finding]:
    """The SGLang environment, read by the plugin's release table (`registrar sglang`): the
    release and plugin system found, then whether the plugin can register there."""
    from ...integrations.sglang.report import installed_report  # noqa: PLC0415

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
    return [
        Finding("sglang", where, "release", "pass" if found else "fail", release),
        Finding(
            "sglang",
            where,
            "plugin",
            ("pass" if registers else "fail") if found else "skip",
            report["advice"],
            data={"unavailable": lost},
        ),
    ]


def cmd_doctor(args: argparse.Namespace) -> int:
    report = run_doctor(_target(args), [sglang_findings] if args.sglang else ())
    outcome = EXIT_OK if report.healthy else EXIT_NOT_REGISTERED  # as status: "not registered"
    if args.json:
        return answer([json.dumps(report.to_dict())], outcome)
    return answer(human(report), outcome)


def cmd_sglang(args: argparse.Namespace) -> int:
    from ...integrations.sglang.report import describe, installed_report  # noqa: PLC0415

    report = installed_report()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(describe(report))
    return EXIT_OK
