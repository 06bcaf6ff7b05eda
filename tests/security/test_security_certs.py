"""`laminar certs init`: the files it writes, their modes, and what the certificates say."""

from __future__ import annotations

import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from laminar_cli.main import main


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def test_certs_init_writes_a_ca_and_one_certificate_per_host(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pki"
    assert main(["certs", "init", "--dir", str(out), "--hosts", "gpu-01,10.0.0.7"]) == 0
    assert "ca.pem" in capsys.readouterr().out
    assert sorted(p.name for p in out.iterdir()) == [
        "10.0.0.7-key.pem",
        "10.0.0.7.pem",
        "ca-key.pem",
        "ca.pem",
        "gpu-01-key.pem",
        "gpu-01.pem",
    ]
    for key in out.glob("*-key.pem"):
        assert mode(key) == 0o600, key
    assert mode(out) & 0o077 == 0
    ca = load(out / "ca.pem")
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    host = load(out / "gpu-01.pem")
    host.verify_directly_issued_by(ca)
    assert host.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "gpu-01"
    san = host.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["gpu-01", "localhost"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    usage = host.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    by_ip = load(out / "10.0.0.7.pem").extensions.get_extension_for_class(
        x509.SubjectAlternativeName
    )
    assert ipaddress.ip_address("10.0.0.7") in by_ip.value.get_values_for_type(x509.IPAddress)


def test_certs_init_again_reuses_the_ca_and_refuses_bad_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "pki"
    assert main(["certs", "init", "--dir", str(out), "--hosts", "a"]) == 0
    ca_before = (out / "ca.pem").read_bytes()
    assert main(["certs", "init", "--dir", str(out), "--hosts", "b"]) == 0
    assert "(reused)" in capsys.readouterr().out
    assert (out / "ca.pem").read_bytes() == ca_before
    load(out / "b.pem").verify_directly_issued_by(load(out / "ca.pem"))
    # Files named in the environment may not exist yet: certs init is what makes them.
    monkeypatch.setenv("LAMINAR_TLS_CA_FILE", str(tmp_path / "later" / "ca.pem"))
    assert main(["certs", "init", "--dir", str(tmp_path / "later"), "--hosts", "c"]) == 0
    for hosts in ("bad host!", ",", "ca"):
        assert main(["certs", "init", "--dir", str(out), "--hosts", hosts]) == 2
        assert "--hosts" in capsys.readouterr().err
