"""Judge an OpenSSH host certificate the way ssh(1) does: pure, no I/O.

Why this exists: a fleet whose known_hosts trusts a host CA (`@cert-authority` lines) has no
plain host keys to compare, so without this every such host was refused. paramiko negotiates
the `*-cert-v01@openssh.com` host key types and checks that the server holds the certified key,
but nothing of the certificate itself; these are the checks OpenSSH adds on top, in its order:

- the CA's signature over the certificate must verify (sshkey.c `cert_parse`);
- neither the certified key nor the CA may be `@revoked` (hostfile.c `check_key_not_revoked`);
- the signing key must be a `@cert-authority` whose host patterns match the host, first as
  `[host]:port`, then as the bare host for a non-22 port (sshconnect.c `check_host_key`,
  "checking without port identifier"); patterns use `*`/`?`, `!` negates, hashed `|1|` works
  (sshd(8) "SSH_KNOWN_HOSTS FILE FORMAT");
- it must be a host certificate, valid now (`valid_after <= now < valid_before`), list the host
  among its principals (host certificates may use `*`/`?` wildcards there) and carry no
  critical options, signed with an algorithm of the default CASignatureAlgorithms (no SHA-1
  `ssh-rsa`) (sshkey.c `sshkey_cert_check_host`, ssh_config(5) CASignatureAlgorithms);
- an EMPTY principal list matches no host: OpenSSH 10.3 made that the rule
  (https://www.openssh.com/txt/release-10.3, "treats an empty principals section as never
  matching any principal"); earlier releases read it as "any host", which let a CA's slip
  certify every host at once.

Sources: https://github.com/openssh/openssh-portable/blob/master/PROTOCOL.certkeys,
https://github.com/openssh/openssh-portable/blob/master/sshconnect.c,
https://github.com/openssh/openssh-portable/blob/master/hostfile.c,
https://man.openbsd.org/ssh-keygen.1#CERTIFICATES.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import hmac
import re
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    SSHCertificate,
    SSHCertificateType,
    SSHCertPublicKeyTypes,
    load_ssh_public_identity,
)

CERT_SUFFIX = "-cert-v01@openssh.com"
# ssh_config(5) CASignatureAlgorithms default (OpenSSH >= 8.2): everything but SHA-1 ssh-rsa.
CA_SIGNATURE_ALGORITHMS = (
    "ssh-ed25519",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
    "rsa-sha2-512",
    "rsa-sha2-256",
)
# PROTOCOL.certkeys: the strings between a certificate's type and its serial (nonce + key).
_KEY_STRINGS = {
    "ssh-rsa" + CERT_SUFFIX: 3,  # nonce, e, n
    "ecdsa-sha2-nistp256" + CERT_SUFFIX: 3,  # nonce, curve, public key
    "ecdsa-sha2-nistp384" + CERT_SUFFIX: 3,
    "ecdsa-sha2-nistp521" + CERT_SUFFIX: 3,
    "ssh-ed25519" + CERT_SUFFIX: 2,  # nonce, public key
}


class CertificateRefused(ValueError):
    """The certificate does not prove the host's identity; the message says why, in one line."""


@dataclass(frozen=True)
class Authority:
    """One `@cert-authority` line: its host patterns and the CA key (SSH wire format)."""

    patterns: tuple[str, ...]
    key_blob: bytes


def fingerprint(blob: bytes) -> str:
    """OpenSSH's SHA256 fingerprint of a key in wire format (`ssh-keygen -l`)."""
    digest = base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
    return f"SHA256:{digest}"


def split_host(known_hosts_name: str) -> tuple[str, int]:
    """`[host]:port` (paramiko's and OpenSSH's name for a non-22 port) -> (host, port)."""
    if known_hosts_name.startswith("[") and "]:" in known_hosts_name:
        host, port = known_hosts_name[1:].rsplit("]:", 1)
        if port.isdigit():
            return host, int(port)
    return known_hosts_name, 22


def _glob(name: str, pattern: str) -> bool:
    """OpenSSH match_pattern: `*` any run, `?` one character, nothing else special."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, name, re.DOTALL) is not None


def _hashed(name: str, entry: str) -> bool:
    """A `|1|salt|hash` known_hosts name: HMAC-SHA1 of the name keyed with the salt."""
    parts = entry.split("|")
    if len(parts) != 4:
        return False
    try:
        salt, want = base64.b64decode(parts[2]), base64.b64decode(parts[3])
    except ValueError:
        return False
    return hmac.compare_digest(hmac.new(salt, name.encode(), hashlib.sha1).digest(), want)


def host_matches(patterns: Sequence[str], name: str) -> bool:
    """Whether a known_hosts host field covers `name`: some pattern matches and no `!`
    pattern does (case-insensitive, as OpenSSH's match_hostname)."""
    lowered = name.lower()
    matched = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        body = pattern[1:] if negated else pattern
        hit = _hashed(lowered, body) if body.startswith("|1|") else _glob(lowered, body.lower())
        if hit and negated:
            return False
        matched = matched or hit
    return matched


def names_to_match(known_hosts_name: str) -> list[str]:
    """The names a `@cert-authority` line is matched against, in ssh's order."""
    host, port = split_host(known_hosts_name)
    return [known_hosts_name] if port == 22 else [known_hosts_name, host]


def authority_covers(authorities: Sequence[Authority], known_hosts_name: str) -> bool:
    names = names_to_match(known_hosts_name)
    return any(host_matches(a.patterns, n) for a in authorities for n in names)


def _wire(key: SSHCertPublicKeyTypes) -> bytes:
    line = key.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
    return base64.b64decode(line.split()[1])


class _Reader:
    """SSH wire format fields, front to back (RFC 4251 section 5)."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, size: int) -> bytes:
        if self.pos + size > len(self.data):
            raise CertificateRefused("certificate is truncated")
        out = self.data[self.pos : self.pos + size]
        self.pos += size
        return out

    def string(self) -> bytes:
        return self.take(int.from_bytes(self.take(4), "big"))


def signature_algorithm(cert_type: str, blob: bytes) -> str:
    """The algorithm name inside the certificate's signature field (PROTOCOL.certkeys: the
    last field; its first string is the algorithm). cryptography keeps it private."""
    reader = _Reader(blob)
    reader.string()  # the certificate type
    for _ in range(_KEY_STRINGS[cert_type]):
        reader.string()
    reader.take(8 + 4)  # serial, type
    for _ in range(2):  # key id, principals
        reader.string()
    reader.take(8 + 8)  # valid after, valid before
    for _ in range(4):  # critical options, extensions, reserved, signature key
        reader.string()
    return _Reader(reader.string()).string().decode("ascii", "replace")


def _when(epoch_s: int) -> str:
    if epoch_s >= 2**63:
        return "forever"
    return dt.datetime.fromtimestamp(epoch_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def verify_host_certificate(
    cert_type: str,
    blob: bytes,
    known_hosts_name: str,
    authorities: Sequence[Authority],
    revoked: Sequence[bytes],
    now_s: float,
) -> SSHCertificate:
    """The certificate, when it proves `known_hosts_name`; else CertificateRefused naming the
    reason (bad signature, revoked, unknown CA, not a host certificate, not yet valid, expired,
    wrong principal, no principals, critical options, SHA-1 signature)."""
    if cert_type not in _KEY_STRINGS:
        raise CertificateRefused(f"certificate type {cert_type} is not supported")
    line = cert_type.encode() + b" " + base64.b64encode(blob)
    try:
        cert = load_ssh_public_identity(line)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CertificateRefused(f"certificate cannot be read ({exc})") from exc
    if not isinstance(cert, SSHCertificate):
        raise CertificateRefused("a plain key, not a certificate")
    ca_blob = _wire(cert.signature_key())
    ca = fingerprint(ca_blob)
    try:
        cert.verify_cert_signature()
    except InvalidSignature as exc:
        raise CertificateRefused(f"bad signature: it does not verify with its CA {ca}") from exc
    if _wire(cert.public_key()) in revoked:
        raise CertificateRefused(f"the certified key {fingerprint(_wire(cert.public_key()))} "
                                 "is @revoked")  # fmt: skip
    if ca_blob in revoked:
        raise CertificateRefused(f"its CA {ca} is @revoked")
    names = names_to_match(known_hosts_name)
    trusted = [a for a in authorities if a.key_blob == ca_blob]
    if not any(host_matches(a.patterns, n) for a in trusted for n in names):
        where = "for this host" if trusted else "at all"
        raise CertificateRefused(f"unknown CA: {ca} is not a @cert-authority {where}")
    if cert.type != SSHCertificateType.HOST:
        raise CertificateRefused("not a host certificate (it is a user certificate)")
    window = f"valid {_when(cert.valid_after)} to {_when(cert.valid_before)}"
    if now_s < cert.valid_after:
        raise CertificateRefused(f"not yet valid ({window})")
    if now_s >= cert.valid_before:
        raise CertificateRefused(f"expired ({window})")
    host = split_host(known_hosts_name)[0].lower()
    principals = [p.decode("utf-8", "replace") for p in cert.valid_principals]
    if not principals:
        raise CertificateRefused("wrong principal: it lists none (matches no host)")
    if not any(_glob(host, p) for p in principals):
        raise CertificateRefused(f"wrong principal: {host} is not among {', '.join(principals)}")
    if cert.critical_options:
        names_ = ", ".join(k.decode("utf-8", "replace") for k in cert.critical_options)
        raise CertificateRefused(f"critical options {names_} (none are defined for hosts)")
    algorithm = signature_algorithm(cert_type, blob)
    if algorithm not in CA_SIGNATURE_ALGORITHMS:
        raise CertificateRefused(f"signed with {algorithm}, not in CASignatureAlgorithms")
    return cert
