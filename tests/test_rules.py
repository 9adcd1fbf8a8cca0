"""The settings values: each concern validated once, when its value is made, with one line
naming the field; a transport given directly needs no URL; a CA may be a directory."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from bootstrap_lab import BootstrapLab
from support import ScriptedTransport, accepted, sglang_payload

from registrar import ConfigError, HttpSettings, Registrar, State, etcd_registrar
from registrar.core._settings import LoopSettings, default_of
from registrar.protocols._etcd.settings import EtcdSettings
from registrar.protocols._smg.settings import SmgSettings


def test_a_given_transport_needs_no_url_and_no_http_option(registrars: list[Registrar]) -> None:
    transport = ScriptedTransport([accepted()])
    # A timeout and token no HTTP request would use are refused, not silently dropped.
    with pytest.raises(ConfigError, match=r"^Registrar got unexpected options timeout, token: a "):
        Registrar(payload={"a": 1}, transport=transport, timeout=-1, token="a\nb")
    reg = Registrar(payload={"a": 1}, transport=transport)
    registrars.append(reg)
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    assert transport.registered == [{"a": 1}]


def test_without_transport_or_url_the_error_names_url() -> None:
    with pytest.raises(ConfigError, match=r"^url must be an http\(s\) URL such as .*, got None$"):
        Registrar(payload={"a": 1})


def test_options_are_split_into_the_settings_values(registrars: list[Registrar]) -> None:
    loop = LoopSettings(max_attempts=None, watch_interval=None)
    transport = ScriptedTransport([accepted()])
    reg = Registrar(payload={"a": 1}, transport=transport, max_attempts=None, watch_interval=None)
    registrars.append(reg)
    assert reg.settings == loop
    reg.start()
    assert reg.wait_for(State.REGISTERED, timeout=5)
    http = HttpSettings("http://127.0.0.1:8998/", timeout=(1, 2))
    assert (http.url, http.timeout) == ("http://127.0.0.1:8998", (1.0, 2.0))
    reg = Registrar("http://127.0.0.1:8998/", sglang_payload(), timeout=(1, 2))
    assert reg.status().url == "http://127.0.0.1:8998"
    with pytest.raises(ConfigError, match="unexpected options bogus"):
        Registrar("http://127.0.0.1:8998", sglang_payload(), bogus=1)  # type: ignore[call-arg]


def test_a_ca_directory_is_accepted_where_a_bundle_is(tmp_path: Path) -> None:
    assert HttpSettings("https://127.0.0.1:1", verify=str(tmp_path)).verify == str(tmp_path)
    assert Registrar("https://127.0.0.1:1", sglang_payload(), verify=str(tmp_path))
    missing = str(tmp_path / "nope")
    with pytest.raises(ConfigError, match=r"^verify '.*nope' is not a readable file or dir"):
        HttpSettings("https://127.0.0.1:1", verify=missing)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LoopSettings(max_retry_after=-1), "max_retry_after must be a number of seconds"),
        (lambda: LoopSettings(max_elapsed=0), "max_elapsed must be a positive number of seconds"),
        (lambda: HttpSettings("http://127.0.0.1:1", timeout=0), "timeout must be positive"),
        (lambda: EtcdSettings("ftp://x", "/k"), "endpoints 'ftp://x' must start with http://"),
        (lambda: EtcdSettings("http://127.0.0.1:2379", "/k", ttl=0), "ttl must be a positive"),
        (
            lambda: EtcdSettings("http://127.0.0.1:2379", "/k", username="u"),
            "username and password go together",
        ),
        (lambda: SmgSettings((), "http://127.0.0.1:1"), "gateways must name at least one"),
        (
            lambda: SmgSettings("http://127.0.0.1:2", "http://127.0.0.1:1", "mixed"),
            "worker_type must be one of prefill, decode, regular",
        ),
        (
            lambda: SmgSettings(("http://127.0.0.1:2",) * 2, "http://127.0.0.1:1"),
            "gateways must not give a gateway URL twice",
        ),
    ],
)
def test_each_rule_is_one_line_naming_the_field(make: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()  # type: ignore[operator]
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_the_per_protocol_defaults_are_read_from_the_settings() -> None:
    assert default_of(HttpSettings, "timeout") == 5.0
    assert default_of(EtcdSettings, "timeout") == 2.0
    assert default_of(LoopSettings, "max_attempts") == 5


def test_etcd_registrar_invents_no_url() -> None:
    reg = etcd_registrar("http://127.0.0.1:2379,http://127.0.0.2:2379", "/k", {"a": 1})
    assert "127.0.0.1:2379" in reg.status().url


def _ca_directory(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A self-signed certificate for 127.0.0.1, its key, and a CA directory holding it under
    its subject hash (as `openssl rehash` names it)."""
    cert, key, folder = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "cas"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    digest = subprocess.run(
        ["openssl", "x509", "-hash", "-noout", "-in", str(cert)],
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    folder.mkdir()
    shutil.copy(cert, folder / f"{digest}.0")
    return cert, key, folder


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_a_ca_directory_verifies_a_real_tls_server(
    registrars: list[Registrar], tmp_path: Path
) -> None:
    cert, key, folder = _ca_directory(tmp_path)
    with BootstrapLab(certfile=str(cert), keyfile=str(key)) as server:
        reg = Registrar(server.url, sglang_payload(), verify=str(folder), watch_interval=None)
        registrars.append(reg)
        reg.start()
        # Verified against the directory (without it, verification fails: test_security.py).
        assert reg.wait_for(State.REGISTERED, timeout=10)
        assert reg.status().last_error is None
