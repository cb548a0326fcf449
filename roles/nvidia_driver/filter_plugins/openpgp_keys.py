"""Filter of the repository roles: the fingerprints of an OpenPGP public key, armored or binary.

Why here and not gpg on the host: the roles pin each vendor repository key by fingerprint and
must refuse a downloaded key with another one BEFORE the repository is added; a fresh host has
only gpgv (which cannot list fingerprints), and the check must also run in --check mode.
nvidia_driver and rdma_client share this file (rdma_client's copy is a link to this one).

A key arrives as the text of an ASCII-armored block (``uri`` ``return_content``: the CUDA keys)
or as ``slurp``'s base64 of a downloaded file, which may be a binary keyring (DOCA's
``doca_keyring.gpg``) or armored; ``openpgp_key_suffix`` names the file suffix apt expects of each
(sources.list(5), Signed-By: ``.asc`` armored, ``.gpg`` binary).

Fingerprint of a v4 key (RFC 4880 section 12.2, https://www.rfc-editor.org/rfc/rfc4880#section-12.2):
SHA-1 over 0x99, the two-octet length of the public-key packet body, and the body. Packet
framing: RFC 4880 section 4.2; ASCII armor: section 6.2.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import Any

from ansible.errors import AnsibleFilterError

_PUBLIC_KEY_TAG = 6  # primary key packets only: a repository pin names the primary key


def _dearmor(text: str) -> bytes:
    lines = [ln.strip() for ln in text.strip().splitlines()]
    try:
        start = lines.index("-----BEGIN PGP PUBLIC KEY BLOCK-----")
        end = lines.index("-----END PGP PUBLIC KEY BLOCK-----", start)
    except ValueError:
        raise AnsibleFilterError(
            "not an ASCII-armored OpenPGP public key (no BEGIN/END PGP PUBLIC KEY BLOCK lines)"
        ) from None
    body = lines[start + 1 : end]
    if "" in body:  # armor headers ("Version: ...") end at the first blank line
        body = body[body.index("") + 1 :]
    data = "".join(ln for ln in body if not ln.startswith("="))  # "=XXXX": the CRC-24 line
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AnsibleFilterError(f"the OpenPGP key's armor is not valid base64: {exc}") from None


def _packets(data: bytes) -> list[tuple[int, bytes]]:
    """(tag, body) of each packet: old and new formats, definite lengths (keys use nothing else)."""
    out: list[tuple[int, bytes]] = []
    pos = 0
    while pos < len(data):
        header = data[pos]
        if not header & 0x80:
            raise AnsibleFilterError(f"malformed OpenPGP data: no packet header at byte {pos}")
        if header & 0x40:  # new format
            tag = header & 0x3F
            first = data[pos + 1]
            if first < 192:
                length, pos = first, pos + 2
            elif first < 224:
                length, pos = ((first - 192) << 8) + data[pos + 2] + 192, pos + 3
            elif first == 255:
                length, pos = int.from_bytes(data[pos + 2 : pos + 6], "big"), pos + 6
            else:
                raise AnsibleFilterError("partial-length OpenPGP packets are not a public key")
        else:  # old format
            tag = (header >> 2) & 0x0F
            size = {0: 1, 1: 2, 2: 4}.get(header & 0x03)
            if size is None:
                raise AnsibleFilterError("indeterminate-length OpenPGP packets are not a key")
            length = int.from_bytes(data[pos + 1 : pos + 1 + size], "big")
            pos += 1 + size
        body = data[pos : pos + length]
        if len(body) != length:
            raise AnsibleFilterError("truncated OpenPGP packet")
        out.append((tag, body))
        pos += length
    return out


def _slurped(value: Any) -> bytes:
    if not isinstance(value, str):
        raise AnsibleFilterError(f"expected slurp's base64 content, got {type(value).__name__}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AnsibleFilterError(f"not base64 (slurp's content): {exc}") from None


def _is_armored(data: bytes) -> bool:
    return data.lstrip().startswith(b"-----BEGIN PGP PUBLIC KEY BLOCK-----")


def _fingerprints(data: bytes) -> list[str]:
    fingerprints = []
    for tag, body in _packets(data):
        if tag != _PUBLIC_KEY_TAG:
            continue
        if not body or body[0] != 4:
            version = body[0] if body else "none"
            raise AnsibleFilterError(f"OpenPGP key version {version}: only v4 keys are supported")
        digest = hashlib.sha1(b"\x99" + len(body).to_bytes(2, "big") + body, usedforsecurity=False)
        fingerprints.append(digest.hexdigest().upper())
    if not fingerprints:
        raise AnsibleFilterError("the OpenPGP data holds no public key")
    return fingerprints


def openpgp_fingerprints(key: Any, encoding: str = "text") -> list[str]:
    """Upper-case hex fingerprints of the primary keys in a key.

    ``encoding="text"``: ``key`` is an ASCII-armored block. ``encoding="base64"``: ``key`` is the
    base64 of a key file (``slurp``), binary packets or an armored block.
    """
    if encoding == "base64":
        data = _slurped(key)
        if _is_armored(data):
            return _fingerprints(_dearmor(data.decode("ascii", "replace")))
        return _fingerprints(data)
    if encoding != "text":
        raise AnsibleFilterError(f"encoding must be 'text' or 'base64', not {encoding!r}")
    if not isinstance(key, str):
        raise AnsibleFilterError(f"expected the key's text, got {type(key).__name__}")
    return _fingerprints(_dearmor(key))


def openpgp_key_suffix(slurped: Any) -> str:
    """".asc" for an armored key file, ".gpg" for a binary keyring: apt reads a Signed-By file by
    its suffix (sources.list(5)), and a binary keyring named .asc is an unusable key to it."""
    return ".asc" if _is_armored(_slurped(slurped)) else ".gpg"


def normalize_fingerprint(value: Any) -> str:
    """"EB69 3B30 ..." or "0xeb693b30..." -> "EB693B30...": how vendors print them vs ours."""
    text = str(value).replace(" ", "").upper()
    return text[2:] if text.startswith("0X") else text


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "openpgp_fingerprints": openpgp_fingerprints,
            "normalize_fingerprint": normalize_fingerprint,
            "openpgp_key_suffix": openpgp_key_suffix,
        }
