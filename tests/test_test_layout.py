"""Every module in registrar/ has tests one can find from its name (docs/testing.md, "Finding
a module's tests"): `tests/test_<name>.py` or `tests/test_<name>_*.py` (for a module in a
sub-package, `tests/test_<package>_<name>*.py` too), or else an entry in `TESTED_IN` below that
names the test files and says why they are where they are."""

from __future__ import annotations

from pathlib import Path

import registrar

PACKAGE = Path(registrar.__file__).parent
TESTS = Path(__file__).parent

TESTED_IN: dict[str, tuple[tuple[str, ...], str]] = {
    "registrar.protocols._probe": (
        ("test_diagnosis_staged.py", "test_doctor.py"),
        "the probe is what sees each staged misconfiguration, for the registrar and doctor",
    ),
    "registrar.__main__": (
        ("test_cli.py",),
        "`python -m registrar` is the CLI; every CLI test runs it",
    ),
    "registrar._version": (("test_project.py",), "the version the package metadata reports"),
    "registrar._assembly": (
        (
            "test_etcd_unit.py",
            "test_sglang_gateway_plugin.py",
        ),
        "the ready-made registrars: etcd's, and the gateway part of the plugin",
    ),
    "registrar.core": (("test_layout.py",), "the core package: what it may import"),
    "registrar.core._actions": (
        ("test_decide_explorer.py",),
        "the actions the decision function returns, over the loop state it explores",
    ),
    "registrar.core._board": (
        (
            "test_concurrency.py",
            "test_registrar_unit.py",
            "test_health.py",
            "test_health_conventions.py",
            "test_machine.py",
        ),
        "the state machine; snapshots and listeners, under many threads and in order, and as "
        "health shows them",
    ),
    "registrar.core._clock": (
        (
            "test_registrar_unit.py",
            "test_layout.py",
            "test_many_descriptors.py",
        ),
        "the loop on a fake clock (support.FakeClock); the selectable waker a transport waits on",
    ),
    "registrar.core._redact": (
        (
            "test_errors.py",
            "test_security.py",
            "test_untrusted_text.py",
            "test_construction.py",
        ),
        "secrets kept out of every text; a peer's text and JSON read safely; the payload checked",
    ),
    "registrar.core._registry": (
        ("test_layout.py",),
        "protocols found by name through entry points",
    ),
    "registrar.core._runner": (
        (
            "test_registrar_unit.py",
            "test_promises.py",
            "test_fast_recovery.py",
            "test_budget.py",
        ),
        "the runner performs the decisions (and asks on_failure): what the loop does, end to end",
    ),
    "registrar.core._transport": (
        (
            "test_layout.py",
            "test_hostile_answers.py",
            "test_untrusted_text.py",
        ),
        "the transport protocols a third party implements; outcomes built from hostile answers",
    ),
    "registrar.devtools": (("test_layout.py",), "imported only by the commands that need it"),
    "registrar.devtools._demo": (("test_cli.py",), "`registrar demo`"),
    "registrar.integrations": (
        ("test_sglang_plugin.py",),
        "the integrations package: the SGLang plugin",
    ),
    "registrar.integrations.sglang._settings": (
        (
            "test_sglang_plugin.py",
            "test_sglang_gateway_plugin.py",
        ),
        "the plugin's variables",
    ),
    "registrar.integrations.sglang._guard": (
        ("test_sglang_capture.py",),
        "the guards around every hook kind, beside the capture they protect",
    ),
    "registrar.integrations.sglang._probe": (
        ("test_sglang_targets.py",),
        "the source reader, with the target table it answers for",
    ),
    "registrar.integrations.sglang._report": (
        ("test_sglang_cli.py",),
        "what `registrar sglang` prints",
    ),
    "registrar.integrations.sglang._rows": (
        ("test_sglang_plugin.py", "test_sglang_registrar.py", "test_sglang_capture.py"),
        "a rank's registrars inside SGLang, and the capture of SGLang's own PUT before 0.5.20",
    ),
    "registrar.integrations.sglang._tables": (
        ("test_sglang_plugin.py", "test_sglang_capture.py"),
        "the bootstrap table, readiness and the /ready route",
    ),
    "registrar.protocols": (
        (
            "test_layout.py",
            "test_construction.py",
        ),
        "the built-in protocols' factories",
    ),
    "registrar.protocols._http": (
        (
            "test_deadline.py",
            "test_hostile_answers.py",
            "test_token_provider.py",
            "test_fast_recovery.py",
            "test_many_descriptors.py",
            "test_security.py",
        ),
        "HTTP: deadlines, hostile servers, tokens, the idle connection and its poll, TLS",
    ),
    "registrar.surfaces": (("test_layout.py",), "the surfaces package: what it may import"),
    "registrar.surfaces.env": (
        (
            "test_cli_config.py",
            "test_configuration_doc.py",
        ),
        "options from the environment",
    ),
    "registrar.surfaces._httpserver": (
        ("test_health_server.py",),
        "the server under the health endpoints",
    ),
    "registrar.surfaces.metrics": (
        (
            "test_health_conventions.py",
            "test_health.py",
        ),
        "/metrics, beside the health endpoints",
    ),
    "registrar.surfaces._verbose": (
        ("test_cli_config.py",),
        "`registrar register -v`'s request lines",
    ),
    "registrar.core._settings": (
        ("test_rules.py",),
        "the settings values, each made through the rules it applies",
    ),
    "registrar.protocols._etcd.settings": (
        ("test_rules.py", "test_options.py"),
        "the etcd settings value beside the loop's and HTTP's",
    ),
    "registrar.protocols._smg.settings": (
        ("test_rules.py", "test_smg_unit.py"),
        "the gateway settings value beside the loop's and HTTP's; the worker spec it checks",
    ),
    "registrar.protocols._etcd.client": (
        ("test_etcd_unit.py", "test_etcd.py"),
        "one part of the etcd protocol; its tests are the protocol's",
    ),
    "registrar.protocols._etcd.transport": (
        ("test_etcd_unit.py", "test_etcd.py"),
        "one part of the etcd protocol; its tests are the protocol's",
    ),
    "registrar.protocols._etcd.watch": (
        ("test_etcd_unit.py", "test_etcd.py"),
        "one part of the etcd protocol; its tests are the protocol's",
    ),
    "registrar.protocols._httpconn": (
        ("test_hostile.py", "test_hostile_answers.py", "test_security.py"),
        "urllib3 under the HTTP transport: hostile answers, TLS",
    ),
    "registrar.protocols._httpvalues": (
        ("test_hostile_answers.py", "test_token_provider.py", "test_security.py"),
        "the HTTP transport's values: Retry-After, results, the token, its provider, basic auth",
    ),
    "registrar.protocols._smg.transport": (
        ("test_smg_unit.py", "test_smg_gateway.py"),
        "one part of the smg protocol; its tests are the protocol's",
    ),
    "registrar.surfaces.cli._register": (
        ("test_cli.py", "test_cli_config.py"),
        "one part of the `registrar` command; its tests run the command",
    ),
    "registrar.surfaces.cli._status": (
        ("test_cli.py",),
        "one part of the `registrar` command; its tests run the command",
    ),
}


def modules() -> list[str]:
    """Every module of the package, dotted (a package by its own name)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join(parts))
    return found


def named_for(module: str) -> list[str]:
    """The test files the naming rule finds for `module`."""
    parts = [part.lstrip("_") for part in module.split(".")]
    prefixes = [f"test_{parts[-1]}"]
    if len(parts) > 2:
        prefixes.append(f"test_{parts[-2]}_{parts[-1]}")
    return sorted(
        path.name
        for path in TESTS.glob("test_*.py")
        if any(path.stem == p or path.stem.startswith(f"{p}_") for p in prefixes)
    )


def test_every_module_has_tests_one_can_find() -> None:
    missing = [m for m in modules() if not named_for(m) and m not in TESTED_IN]
    hints = "\n".join(
        f'    "{m}": (("test_<file>.py",), "<why its tests are there>"),' for m in missing
    )
    assert not missing, (
        "modules whose tests cannot be found by name: add tests/test_<name>.py (or "
        "test_<name>_<topic>.py), or a line to TESTED_IN in tests/test_test_layout.py:\n" + hints
    )


def test_the_table_names_modules_and_test_files_that_exist() -> None:
    known = set(modules())
    stale = [m for m in TESTED_IN if m not in known]
    assert not stale, f"TESTED_IN names modules that no longer exist: {stale}"
    absent = [
        (m, f) for m, (files, _) in TESTED_IN.items() for f in files if not (TESTS / f).is_file()
    ]
    assert not absent, f"TESTED_IN names test files that do not exist: {absent}"
    reasons = [m for m, (_, why) in TESTED_IN.items() if not why.strip()]
    assert not reasons, f"TESTED_IN entries without a reason: {reasons}"


def test_the_table_lists_only_what_the_names_cannot_find() -> None:
    """An entry for a module the naming rule already finds says twice where its tests are."""
    doubled = [m for m in TESTED_IN if named_for(m)]
    assert not doubled, f"found by name already; remove from TESTED_IN: {doubled}"
