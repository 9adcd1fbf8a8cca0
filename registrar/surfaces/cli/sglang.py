"""`registrar sglang`: what the SGLang plugin will do in this environment's SGLang, read from
its installed source without starting it (integrations/sglang/report.py): where SGLang is too
old to load the plugin, this is where the user learns it."""

from __future__ import annotations

import argparse
import json
import sys

from .common import EXIT_OK

__all__ = ["cmd_sglang"]


def cmd_sglang(args: argparse.Namespace) -> int:
    from ...integrations.sglang.report import describe, installed_report  # noqa: PLC0415

    report = installed_report()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(describe(report))
    return EXIT_OK
