"""Host certificates judged as ssh(1) judges them (kvops/remote/ssh_cert.py), with certificates
made here: by cryptography's SSHCertificateBuilder, and by the real `ssh-keygen -s` for what only it
produces (an SHA-1 `ssh-rsa` CA signature)."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from pathlib import Path

import paramiko
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    SSHCertificateBuilder,
    SSHCertificateType,
)

from kvops.remote import ssh, ssh_cert
from kvops.remote.ssh_cert import Authority, CertificateRefused, verify_host_certificate

NOW_S = 1_800_000_000
CERT_TYPE = "ssh-ed25519-cert-v01@openssh.com"
needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


def wire(key: ed25519.Ed25519PublicKey) -> bytes:
    return base64.b64decode(key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).split()[1])


CA = ed25519.Ed25519PrivateKey.generate()
OTHER_CA = ed25519.Ed25519PrivateKey.generate()
HOST_KEY = ed25519.Ed25519PrivateKey.generate()


def make_cert(
    *,
    signer: ed25519.Ed25519PrivateKey = CA,
    kind: SSHCertificateType = SSHCertificateType.HOST,
    principals: tuple[bytes, ...] = (b"gpu-01.example.com",),
    valid_after: int = NOW_S - 60,
    valid_before: int = NOW_S + 3600,
    critical: dict[bytes, bytes] | None = None,
) -> bytes:
    builder = (
        SSHCertificateBuilder()
        .public_key(HOST_KEY.public_key())
        .type(kind)
        .key_id(b"gpu-01")
        .valid_after(valid_after)
        .valid_before(valid_before)
    )
    builder = (
        builder.valid_principals(list(principals))
        if principals
        else builder.valid_for_all_principals()
    )
    for name, value in (critical or {}).items():
        builder = builder.add_critical_option(name, value)
    cert = builder.sign(signer)
    return base64.b64decode(cert.public_bytes().split()[1])


def judge(
    blob: bytes,
    name: str = "gpu-01.example.com",
    authorities: tuple[Authority, ...] = (Authority(("*.example.com",), wire(CA.public_key())),),
    revoked: tuple[bytes, ...] = (),
) -> None:
    verify_host_certificate(CERT_TYPE, blob, name, authorities, revoked, NOW_S)


def test_a_valid_host_certificate_from_a_trusted_ca_passes() -> None:
    judge(make_cert())
    judge(make_cert(principals=(b"*.example.com",)))  # host certificates may use wildcards
    # a non-22 port: the CA line may name [host]:port, or the bare host (ssh's fallback)
    bracketed = Authority(("[gpu-01.example.com]:2222",), wire(CA.public_key()))
    judge(make_cert(), "[gpu-01.example.com]:2222", (bracketed,))
    judge(make_cert(), "[gpu-01.example.com]:2222")


@pytest.mark.parametrize(
    ("cert", "reason"),
    [
        (dict(valid_before=NOW_S - 1, valid_after=NOW_S - 3600), r"expired \(valid 2027-\S+ to 2"),
        (dict(valid_before=NOW_S), "expired"),  # valid_before is exclusive
        (dict(valid_after=NOW_S + 1), "not yet valid"),
        (dict(principals=(b"gpu-02.example.com",)), "wrong principal: gpu-01.example.com is not"),
        (dict(principals=()), "wrong principal: it lists none"),  # OpenSSH 10.3
        (dict(kind=SSHCertificateType.USER), "not a host certificate"),
        (dict(signer=OTHER_CA), "unknown CA: SHA256:.* is not a @cert-authority at all"),
        (dict(critical={b"force-command": b"/bin/true"}), "critical options force-command"),
    ],
)
def test_each_refusal_names_its_reason(cert: dict[str, object], reason: str) -> None:
    with pytest.raises(CertificateRefused, match=reason):
        judge(make_cert(**cert))  # type: ignore[arg-type]


def test_a_ca_trusted_only_for_other_hosts_or_negated_is_unknown_here() -> None:
    elsewhere = Authority(("*.other.org",), wire(CA.public_key()))
    with pytest.raises(CertificateRefused, match="not a @cert-authority for this host"):
        judge(make_cert(), authorities=(elsewhere,))
    negated = Authority(("*.example.com", "!gpu-01.example.com"), wire(CA.public_key()))
    with pytest.raises(CertificateRefused, match="unknown CA"):
        judge(make_cert(), authorities=(negated,))


def test_revoked_ca_or_revoked_host_key_is_refused_though_the_ca_is_trusted() -> None:
    with pytest.raises(CertificateRefused, match=r"its CA SHA256:\S+ is @revoked"):
        judge(make_cert(), revoked=(wire(CA.public_key()),))
    with pytest.raises(CertificateRefused, match=r"certified key SHA256:\S+ is @revoked"):
        judge(make_cert(), revoked=(wire(HOST_KEY.public_key()),))


def test_a_tampered_certificate_has_a_bad_signature() -> None:
    blob = bytearray(make_cert())
    blob[-1] ^= 0x01
    with pytest.raises(CertificateRefused, match="bad signature"):
        judge(bytes(blob))
    # a principal swapped after signing: the signature no longer covers the body
    forged = make_cert().replace(b"gpu-01.example.com", b"gpu-66.example.com")
    with pytest.raises(CertificateRefused, match="bad signature"):
        judge(forged, "gpu-66.example.com")


def test_host_patterns_follow_openssh() -> None:
    assert ssh_cert.host_matches(["*.Example.COM"], "gpu-01.example.com")  # case-insensitive
    assert ssh_cert.host_matches(["gpu-0?"], "gpu-07")
    assert not ssh_cert.host_matches(["gpu-[0-9]"], "gpu-7")  # no [] classes in OpenSSH
    assert not ssh_cert.host_matches(["*", "!gpu-07"], "gpu-07")
    hashed = paramiko.HostKeys.hash_host("gpu-07")
    assert ssh_cert.host_matches([hashed], "gpu-07")
    assert not ssh_cert.host_matches([hashed], "gpu-08")
    assert ssh_cert.split_host("[10.0.0.5]:2222") == ("10.0.0.5", 2222)
    assert ssh_cert.split_host("10.0.0.5") == ("10.0.0.5", 22)


@needs_keygen
def test_ssh_keygen_certificates_and_an_sha1_ca_signature(tmp_path: Path) -> None:
    """What `ssh-keygen -s -h -n -V` makes passes; the same certificate signed with the RSA CA's
    SHA-1 `ssh-rsa` algorithm is refused, as ssh's default CASignatureAlgorithms does."""

    def keygen(name: str, kind: str) -> Path:
        path = tmp_path / name
        subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-f", str(path)], check=True)
        return path

    ca, host = keygen("rsa_ca", "rsa"), keygen("host", "ecdsa")
    ca_blob = base64.b64decode(ca.with_suffix(".pub").read_text().split()[1])
    authorities = (Authority(("10.0.0.5",), ca_blob),)
    for algorithm, ok in (("rsa-sha2-512", True), ("ssh-rsa", False)):
        subprocess.run(
            ["ssh-keygen", "-q", "-s", str(ca), "-t", algorithm, "-I", "h", "-h",
             "-n", "10.0.0.5,gpu-01", "-V", "-5m:+1h", str(host.with_suffix(".pub"))],
            check=True,
        )  # fmt: skip
        cert_type, b64 = (tmp_path / "host-cert.pub").read_text().split()[:2]
        blob = base64.b64decode(b64)
        assert ssh_cert.signature_algorithm(cert_type, blob) == algorithm
        now_s = time.time()
        if ok:
            verify_host_certificate(cert_type, blob, "[10.0.0.5]:2222", authorities, (), now_s)
        else:
            with pytest.raises(CertificateRefused, match="signed with ssh-rsa"):
                verify_host_certificate(cert_type, blob, "10.0.0.5", authorities, (), now_s)


def test_the_policy_refuses_a_bad_certificate_in_one_line_even_accepting_new_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ssh.py hands the presented certificate (paramiko's public_blob) to the verifier; a bad
    one is HostKeyRefused naming host and reason, a good one connects and records nothing."""
    ca_line = CA.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    known = tmp_path / "known_hosts"
    known.write_text(f"@cert-authority *.example.com {ca_line}\n")
    ssh.clear_caches()
    monkeypatch.setattr(ssh.time, "time", lambda: NOW_S)
    policy = ssh._KnownHostsPolicy(known, accept_new=True)
    host_line = HOST_KEY.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    key = paramiko.Ed25519Key(data=base64.b64decode(host_line.split()[1]))
    for blob, name, refused in (
        (make_cert(), "gpu-01.example.com", None),
        (make_cert(valid_before=NOW_S), "gpu-01.example.com", "expired"),
    ):
        key.load_certificate(f"{CERT_TYPE} {base64.b64encode(blob).decode()}")
        if refused is None:
            policy.missing_host_key(paramiko.SSHClient(), name, key)
            continue
        with pytest.raises(ssh.HostKeyRefused) as exc:
            policy.missing_host_key(paramiko.SSHClient(), name, key)
        assert str(exc.value).startswith(f"host certificate of {name} refused: {refused}")
        assert "\n" not in str(exc.value)
    assert known.read_text() == f"@cert-authority *.example.com {ca_line}\n"
