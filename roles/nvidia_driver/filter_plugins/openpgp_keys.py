"""Filter of the repository roles: the fingerprints of an OpenPGP public key, armored or binary.

Why here and not gpg on the host: the roles pin each vendor repository key by fingerprint and
must refuse a downloaded key with another one BEFORE the repository is added; a fresh host has
only gpgv (which cannot list fingerprints), and the check must also run in --check mode.
nvidia_driver and rdma_client share this file (rdma_client's copy is a link to this one).

A pin is kept only when the file's ONE primary key is the pinned one: every armored block and
every binary packet is read, and any second primary key refuses the file (apt's Signed-By and
``rpm --import`` trust every key in it).

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
_SECRET_KEY_TAG = 5  # a secret key is a primary key too: no repository key file holds one
_ARMOR_BEGIN = "-----BEGIN PGP PUBLIC KEY BLOCK-----"
_ARMOR_END = "-----END PGP PUBLIC KEY BLOCK-----"


def _dearmor(text: str) -> bytes:
    """The packets of EVERY armored block in ``text``, concatenated: a second block is a second
    keyring that gpg and apt read as well (RFC 4880 section 6.2), so none may go unlisted."""
    lines = [ln.strip() for ln in text.strip().splitlines()]
    if _ARMOR_BEGIN not in lines:
        raise AnsibleFilterError(
            "not an ASCII-armored OpenPGP public key (no BEGIN/END PGP PUBLIC KEY BLOCK lines)"
        )
    out = b""
    pos = 0
    while pos < len(lines):
        line = lines[pos]
        if line.startswith("-----BEGIN PGP ") and line != _ARMOR_BEGIN:
            raise AnsibleFilterError(
                f"the key file holds an armored block other than a public key: {line}"
            )
        if line and line != _ARMOR_BEGIN:
            # Anything else outside the blocks could be a keyring that another reader finds.
            raise AnsibleFilterError(
                f"the key file holds data outside its armored blocks: {line[:40]!r}"
            )
        if not line:
            pos += 1
            continue
        try:
            end = lines.index(_ARMOR_END, pos + 1)
        except ValueError:
            raise AnsibleFilterError(f"an armored block without its {_ARMOR_END} line") from None
        body = lines[pos + 1 : end]
        if "" in body:  # armor headers ("Version: ...") end at the first blank line
            body = body[body.index("") + 1 :]
        data = "".join(ln for ln in body if not ln.startswith("="))  # "=XXXX": the CRC-24 line
        try:
            out += base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise AnsibleFilterError(
                f"the OpenPGP key's armor is not valid base64: {exc}"
            ) from None
        pos = end + 1
    return out


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
        if tag == _SECRET_KEY_TAG:
            raise AnsibleFilterError("the OpenPGP data holds a secret key: not a repository key")
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
    """Upper-case hex fingerprints of ALL the primary keys in a key file, in file order.

    Every armored block and every packet of a binary keyring counts (subkeys, tag 14, do not:
    they belong to the primary key before them). apt and rpm trust every primary key of the
    file, so a pin holds only when this list is exactly ``[pin]`` (see ``openpgp_only_key``).

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


def openpgp_only_key(fingerprints: Any, pin: str) -> bool:
    """True when the key file's primary keys (``openpgp_fingerprints``) are the pinned key alone.

    "The pin is among the keys" is no pin: a served file holding the real key and a second one
    makes apt (Signed-By) and rpm trust both, and the second key signs whatever its holder wants.
    """
    if not isinstance(fingerprints, list):
        raise AnsibleFilterError(
            f"expected a list of fingerprints, got {type(fingerprints).__name__}"
        )
    return [str(f) for f in fingerprints] == [normalize_fingerprint(pin)]


def openpgp_key_suffix(slurped: Any) -> str:
    """ ".asc" for an armored key file, ".gpg" for a binary keyring: apt reads a Signed-By file by
    its suffix (sources.list(5)), and a binary keyring named .asc is an unusable key to it."""
    return ".asc" if _is_armored(_slurped(slurped)) else ".gpg"


def normalize_fingerprint(value: Any) -> str:
    """ "EB69 3B30 ..." or "0xeb693b30..." -> "EB693B30...": how vendors print them vs ours."""
    text = str(value).replace(" ", "").upper()
    return text[2:] if text.startswith("0X") else text


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "openpgp_fingerprints": openpgp_fingerprints,
            "normalize_fingerprint": normalize_fingerprint,
            "openpgp_key_suffix": openpgp_key_suffix,
            "openpgp_only_key": openpgp_only_key,
        }
