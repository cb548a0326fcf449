"""The repository roles pin their vendors' signing keys by fingerprint, and a --check preview on
a host without the vendor repositories yet previews their packages instead of failing.

The fingerprint filter is checked against gpg's own answer for the lab key
(`gpg --with-colons --show-keys tests/lab/files/lab-repo-key.asc`, recorded below) and against
the same key re-framed in the other OpenPGP packet format (RFC 4880 section 4.2), so neither the
armor nor the framing can be read wrong unnoticed.
"""

from __future__ import annotations

import base64
import importlib.util
import re
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from ansible.errors import AnsibleFilterError
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.template import Templar, trust_as_template

REPO = Path(__file__).resolve().parents[2]
ROLES = REPO / "roles"
LAB_KEY = REPO / "tests" / "lab" / "files" / "lab-repo-key.asc"
# The same key as a binary keyring, as DOCA serves doca_keyring.gpg (`gpg --dearmor` of the .asc).
LAB_KEYRING = REPO / "tests" / "lab" / "files" / "lab-repo-key.gpg"
LAB_KEY_FINGERPRINT = "B233E651D1F4CEA32271F977E6D611B401770A50"  # gpg --show-keys


def _filters() -> ModuleType:
    path = ROLES / "nvidia_driver" / "filter_plugins" / "openpgp_keys.py"
    spec = importlib.util.spec_from_file_location("openpgp_keys", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _armor(data: bytes) -> str:
    b64 = base64.b64encode(data).decode()
    lines = [b64[i : i + 64] for i in range(0, len(b64), 64)]
    return "\n".join(
        ["-----BEGIN PGP PUBLIC KEY BLOCK-----", "", *lines, "-----END PGP PUBLIC KEY BLOCK-----"]
    )


def test_the_fingerprint_is_the_one_gpg_prints() -> None:
    assert _filters().openpgp_fingerprints(LAB_KEY.read_text()) == [LAB_KEY_FINGERPRINT]


def test_the_fingerprint_does_not_depend_on_the_packet_framing() -> None:
    f = _filters()
    [(tag, body), *rest] = f._packets(f._dearmor(LAB_KEY.read_text()))
    assert tag == 6 and f._dearmor(LAB_KEY.read_text())[0] & 0x40 == 0  # gpg wrote old format
    new_format = bytes([0xC0 | 6, len(body)]) + body  # the same key packet, new format
    assert len(body) < 192
    assert f.openpgp_fingerprints(_armor(new_format)) == [LAB_KEY_FINGERPRINT]
    # Another key body is another fingerprint (the SHA-1 covers the whole packet body).
    changed = body[:-1] + bytes([body[-1] ^ 1])
    assert f.openpgp_fingerprints(_armor(bytes([0xC6, len(changed)]) + changed)) != [
        LAB_KEY_FINGERPRINT
    ]
    assert rest, "the lab key also carries its user id and signature packets"


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("<html>404 Not Found</html>", "not an ASCII-armored OpenPGP public key"),
        (_armor(b"\x01\x02"), "no packet header"),
        (_armor(bytes([0xC6, 50]) + b"\x04" * 10), "truncated OpenPGP packet"),
        (_armor(bytes([0xC6, 3]) + b"\x03ab"), "only v4 keys are supported"),
        (_armor(bytes([0xCD, 3]) + b"uid"), "holds no public key"),
    ],
)
def test_anything_but_a_v4_public_key_is_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(AnsibleFilterError, match=error):
        _filters().openpgp_fingerprints(text)


def test_vendor_fingerprints_are_compared_without_spaces_or_prefix() -> None:
    normalize = _filters().normalize_fingerprint
    assert normalize("eb69 3b30 35cd 5710 e231  e123 a4b4 6996 3bf8 63cc") == (
        "EB693B3035CD5710E231E123A4B469963BF863CC"
    )
    assert normalize("0xA024F6F0E6D6A281") == "A024F6F0E6D6A281"


def test_rdma_client_uses_the_same_filter_file() -> None:
    link = ROLES / "rdma_client" / "filter_plugins" / "openpgp_keys.py"
    assert link.is_symlink()
    assert link.resolve() == (ROLES / "nvidia_driver" / "filter_plugins" / "openpgp_keys.py")


def _render(expr: str, variables: dict[str, Any]) -> Any:
    # The roles' own filters (kvops.gds.normalize_fingerprint, ...), found as Ansible finds them
    # from the checkout: the checkout as the kvops.gds collection (ansible.cfg's collections_path).
    with warnings.catch_warnings():  # the collection finder may be set up by an earlier test
        warnings.simplefilter("ignore")
        init_plugin_loader([str(REPO / ".collections")])
    templar = Templar(loader=DataLoader(), variables=variables)
    return templar.template(trust_as_template(expr))


def _role_vars(role: str, os_family: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part in ("defaults", "vars"):
        loaded = yaml.safe_load((ROLES / role / part / "main.yml").read_text())
        out.update(
            {k: trust_as_template(v) if isinstance(v, str) else v for k, v in loaded.items()}
        )
    out["ansible_facts"] = {"os_family": os_family}
    return out


@pytest.mark.parametrize(
    ("os_family", "fingerprint"),
    # NVIDIA's SIGNATURES.md (github.com/NVIDIA/cuda-repo-management): gpg's
    # "Primary key fingerprint" of each key.
    [
        ("Debian", "EB693B3035CD5710E231E123A4B469963BF863CC"),
        ("RedHat", "610C7B14E068A878070DA4E99CD0A493D42D0685"),
    ],
)
def test_the_cuda_key_defaults_to_nvidias_published_fingerprint(
    os_family: str, fingerprint: str
) -> None:
    variables = _role_vars("nvidia_driver", os_family)
    got = _render("{{ nvidia_driver_cuda_repo_key_fingerprint | trim }}", variables)
    assert got == fingerprint


def _set_fact_expr(role: str, task_name: str, fact: str) -> str:
    tasks = yaml.safe_load((ROLES / role / "tasks" / "main.yml").read_text())
    [task] = [t for t in tasks if t.get("name") == task_name]
    return str(task["ansible.builtin.set_fact"][fact])


@pytest.mark.parametrize(
    ("check_mode", "manage", "repo_file_exists", "pending"),
    [
        (True, True, False, True),  # a fresh host previewed: the repository is still to come
        (True, True, True, False),  # added by an earlier run: its packages can be previewed
        (False, True, False, False),  # a real run adds the repository first
        (True, False, False, False),  # repositories managed elsewhere: preview as usual
    ],
)
def test_a_preview_waits_for_the_repository_only_where_it_is_missing(
    check_mode: bool, manage: bool, repo_file_exists: bool, pending: bool
) -> None:
    stat = {"stat": {"exists": repo_file_exists}} if check_mode and manage else {"skipped": True}
    driver = _set_fact_expr(
        "nvidia_driver",
        "Nvidia_driver | Record whether the CUDA repository is still to be added",
        "nvidia_driver_cuda_repo_pending",
    )
    got = _render(
        driver,
        {
            "ansible_check_mode": check_mode,
            "nvidia_driver_cuda_repo_manage": manage,
            "_nvidia_driver_repo_file": stat,
        },
    )
    assert got is pending
    doca = _set_fact_expr(
        "rdma_client",
        "Rdma_client | Record whether the DOCA repository is still to be added",
        "rdma_client_doca_repo_pending",
    )
    variables = {
        "ansible_check_mode": check_mode,
        "rdma_client_doca_repo_manage": manage,
        "rdma_client_stack": "doca-ofed",
        "_rdma_client_repo_file": stat,
    }
    assert _render(doca, variables) is pending
    assert _render(doca, {**variables, "rdma_client_stack": "rdma-core"}) is False


def _flat(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every task of a task list, those inside blocks (and their always/rescue) included."""
    out: list[dict[str, Any]] = []
    for t in tasks:
        out.append(t)
        for part in ("block", "rescue", "always"):
            out += _flat(t.get(part, []))
    return out


def _task(role: str, tasks_file: str, name: str) -> dict[str, Any]:
    tasks = yaml.safe_load((ROLES / role / "tasks" / tasks_file).read_text())
    [task] = [t for t in _flat(tasks) if t.get("name") == name]
    return dict(task)


def test_every_cuda_key_default_is_a_full_fingerprint_and_both_are_required() -> None:
    """Both OS families pin by 40 hex digits; an empty pin is refused unless the repository is
    unmanaged or trusted (before, RHEL imported NVIDIA's key unpinned)."""
    check = _task(
        "nvidia_driver", "main.yml", "Nvidia_driver | Check the platform and the settings"
    )
    [rule] = [
        c for c in check["vars"]["_nvidia_driver_checks"]
        if "nvidia_driver_cuda_repo_key_fingerprint" in c["msg"]
    ]  # fmt: skip
    base = {"nvidia_driver_cuda_repo_manage": True, "nvidia_driver_cuda_repo_trusted": False}
    for os_family in ("Debian", "RedHat"):
        variables = {**_role_vars("nvidia_driver", os_family), **base}
        variables["ansible_facts"] = {"os_family": os_family}
        assert _render(rule["ok"], variables) is True
        assert (
            _render(rule["ok"], {**variables, "nvidia_driver_cuda_repo_key_fingerprint": ""})
            is False
        )
        short = {**variables, "nvidia_driver_cuda_repo_key_fingerprint": "9CD0A493D42D0685"}
        assert _render(rule["ok"], short) is False
    name = (
        "install-RedHat | Import the CUDA repository's signing key, checked against its fingerprint"
    )
    imported = _task("nvidia_driver", "install-RedHat.yml", name)  # the block: check, import
    assert not any("fingerprint" in str(w) for w in imported["when"])  # never skipped
    rpm_key = _task(
        "nvidia_driver",
        "install-RedHat.yml",
        "install-RedHat | Import the checked CUDA repository key",
    )
    assert "fingerprint" in rpm_key["ansible.builtin.rpm_key"]


def test_an_unpinned_doca_key_is_allowed_only_with_a_warning() -> None:
    """Empty (dnf's default, or an operator's choice) is allowed but said at every run, --check
    included; a 16-digit key ID is refused (it is no pin)."""
    spec = yaml.safe_load((ROLES / "rdma_client" / "meta" / "argument_specs.yml").read_text())
    option = spec["argument_specs"]["main"]["options"]["rdma_client_doca_repo_key_fingerprint"]
    assert option["type"] == "str"
    check = _task("rdma_client", "main.yml", "Rdma_client | Check the platform and the settings")
    [rule] = [
        c for c in check["vars"]["_rdma_client_checks"]
        if "rdma_client_doca_repo_key_fingerprint" in c["msg"]
    ]  # fmt: skip
    for value, ok in (
        ("", True),
        ("70454E6B F5D9C2D3 B78709E8 DC726C5E 41B9CC50", True),
        ("A024F6F0E6D6A281", False),
        ("not hex at all", False),
    ):
        assert _render(rule["ok"], {"rdma_client_doca_repo_key_fingerprint": value}) is ok, value
    warning = _task(
        "rdma_client", "main.yml", "Rdma_client | Say that the DOCA repository key is not pinned"
    )
    assert "NOT pinned" in warning["ansible.builtin.debug"]["msg"]
    assert "rdma_client_doca_repo_key_fingerprint | length == 0" in warning["when"]
    assert "check_mode" not in warning  # a debug task runs in --check as in a real run


def test_a_binary_keyring_has_the_fingerprint_of_its_armored_form() -> None:
    """DOCA serves a binary keyring; the role reads the downloaded file as slurp's base64."""
    f = _filters()
    binary = base64.b64encode(LAB_KEYRING.read_bytes()).decode()
    armored = base64.b64encode(LAB_KEY.read_bytes()).decode()
    assert f.openpgp_fingerprints(binary, "base64") == [LAB_KEY_FINGERPRINT]
    assert f.openpgp_fingerprints(armored, "base64") == [LAB_KEY_FINGERPRINT]
    # apt reads a Signed-By file by its suffix (sources.list(5)).
    assert f.openpgp_key_suffix(binary) == ".gpg"
    assert f.openpgp_key_suffix(armored) == ".asc"


@pytest.mark.parametrize(
    ("data", "error"),
    [
        (b"<html>404 Not Found</html>", "no packet header"),
        # A GnuPG keybox (pubring.kbx) is not an OpenPGP keyring apt can read either.
        (b"\x00\x00\x00\x20\x01\x01\x00\x00KBXf", "no packet header"),
        (b"", "holds no public key"),
    ],
)
def test_a_download_that_is_no_key_is_a_clear_error(data: bytes, error: str) -> None:
    with pytest.raises(AnsibleFilterError, match=error):
        _filters().openpgp_fingerprints(base64.b64encode(data).decode(), "base64")
    with pytest.raises(AnsibleFilterError, match="not base64"):
        _filters().openpgp_fingerprints("*not base64*", "base64")


def _other_key() -> tuple[bytes, str]:
    """A second v4 primary key (the lab key's packet with its last byte changed: another key
    body, so another fingerprint) as a binary key packet, and its fingerprint."""
    f = _filters()
    [(_, body), *_] = f._packets(LAB_KEYRING.read_bytes())
    changed = body[:-1] + bytes([body[-1] ^ 1])
    packet = bytes([0xC6, len(changed)]) + changed
    [fingerprint] = f.openpgp_fingerprints(_armor(packet))
    assert fingerprint != LAB_KEY_FINGERPRINT
    return packet, fingerprint


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def test_a_second_key_in_a_binary_keyring_is_listed_and_refused() -> None:
    """DOCA's path: a served binary keyring with the pinned key AND another one (gpg --export of
    two keys, concatenated packets) names both, and the pin does not hold."""
    f = _filters()
    other, other_fpr = _other_key()
    for data in (LAB_KEYRING.read_bytes() + other, other + LAB_KEYRING.read_bytes()):
        fingerprints = f.openpgp_fingerprints(_b64(data), "base64")
        assert sorted(fingerprints) == sorted([LAB_KEY_FINGERPRINT, other_fpr])
        assert not f.openpgp_only_key(fingerprints, LAB_KEY_FINGERPRINT)
    alone = f.openpgp_fingerprints(_b64(LAB_KEYRING.read_bytes()), "base64")
    assert f.openpgp_only_key(alone, LAB_KEY_FINGERPRINT.lower())


def test_a_second_armored_block_is_listed_and_refused() -> None:
    """CUDA's path (text) and DOCA's (slurp of an armored file): the second block was not even
    read before; now both blocks' keys are listed."""
    f = _filters()
    other, other_fpr = _other_key()
    text = LAB_KEY.read_text().strip() + "\n" + _armor(other) + "\n"
    assert f.openpgp_fingerprints(text) == [LAB_KEY_FINGERPRINT, other_fpr]
    assert f.openpgp_fingerprints(_b64(text.encode()), "base64") == [
        LAB_KEY_FINGERPRINT,
        other_fpr,
    ]
    assert not f.openpgp_only_key(f.openpgp_fingerprints(text), LAB_KEY_FINGERPRINT)
    # The same key twice is still one key file too many: refused (a vendor never serves that).
    twice = LAB_KEY.read_text() + LAB_KEY.read_text()
    assert not f.openpgp_only_key(f.openpgp_fingerprints(twice), LAB_KEY_FINGERPRINT)


def test_one_armored_block_with_two_primary_keys_is_refused() -> None:
    f = _filters()
    other, other_fpr = _other_key()
    text = _armor(LAB_KEYRING.read_bytes() + other)
    assert f.openpgp_fingerprints(text) == [LAB_KEY_FINGERPRINT, other_fpr]
    assert not f.openpgp_only_key(f.openpgp_fingerprints(text), LAB_KEY_FINGERPRINT)


def test_subkeys_of_the_pinned_key_are_still_accepted() -> None:
    """A subkey (tag 14, RFC 4880 section 5.5.1.2) belongs to the primary key before it: DOCA's
    and CUDA's keys may carry them, and they are no second key."""
    f = _filters()
    other, _ = _other_key()
    subkey = bytes([0xC0 | 14, len(other) - 2]) + other[2:]
    for data in (LAB_KEYRING.read_bytes() + subkey, LAB_KEYRING.read_bytes() + subkey * 2):
        fingerprints = f.openpgp_fingerprints(_armor(data))
        assert fingerprints == [LAB_KEY_FINGERPRINT]
        assert f.openpgp_only_key(fingerprints, LAB_KEY_FINGERPRINT)
        assert f.openpgp_only_key(f.openpgp_fingerprints(_b64(data), "base64"), LAB_KEY_FINGERPRINT)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # Another armor type may hide keys a reader imports: refused, not skipped.
        (
            LAB_KEY.read_text().replace("PUBLIC KEY BLOCK", "PRIVATE KEY BLOCK"),
            "not an ASCII-armored OpenPGP public key",
        ),
        (
            LAB_KEY.read_text() + "-----BEGIN PGP PRIVATE KEY BLOCK-----\n",
            "armored block other than a public key",
        ),
        (LAB_KEY.read_text() + "\nxyz\n", "data outside its armored blocks"),
        (LAB_KEY.read_text().replace("-----END PGP PUBLIC KEY BLOCK-----", ""), "without its"),
        (_armor(bytes([0xC5, 3]) + b"\x04ab"), "holds a secret key"),
    ],
)
def test_a_key_file_that_could_hide_a_key_is_a_clear_error(text: str, error: str) -> None:
    with pytest.raises(AnsibleFilterError, match=error):
        _filters().openpgp_fingerprints(text)


@pytest.mark.parametrize(
    ("role", "task", "pin_var"),
    [
        (
            "nvidia_driver",
            "install-Debian | Refuse a CUDA repository key without the pinned fingerprint",
            "nvidia_driver_cuda_repo_key_fingerprint",
        ),
        (
            "rdma_client",
            "install-Debian | Refuse a DOCA repository key without the pinned fingerprint",
            "rdma_client_doca_repo_key_fingerprint",
        ),
        (
            "nvidia_driver",
            "install-RedHat | Refuse a CUDA repository key without the pinned fingerprint",
            "nvidia_driver_cuda_repo_key_fingerprint",
        ),
        (
            "rdma_client",
            "install-RedHat | Refuse a DOCA repository key without the pinned fingerprint",
            "rdma_client_doca_repo_key_fingerprint",
        ),
    ],
)
def test_the_key_check_refuses_a_key_with_another_fingerprint(
    role: str, task: str, pin_var: str
) -> None:
    """The apt roles' assert, rendered as Ansible renders it, over the lab key: its own
    fingerprint (spaced, lower case) passes; NVIDIA's, a suffix of it or a key ID does not, nor
    the lab key served with a second key."""
    assert_task = _task(role, task.split(" | ")[0] + ".yml", task)
    register = "_nvidia_driver_repo_key" if role == "nvidia_driver" else "_rdma_client_repo_key"
    filters = _filters().FilterModule().filters()

    def passes(pin: str, key: str = LAB_KEY.read_text()) -> bool:
        fingerprints = filters["openpgp_fingerprints"](key)
        local = {
            k: re.sub(
                rf"{register}\.content \| kvops\.gds\.openpgp_fingerprints(\('base64'\))?",
                "_fps",
                v,
            ).replace(f"{pin_var} | kvops.gds.normalize_fingerprint", "_pin")
            for k, v in assert_task["vars"].items()
        }
        variables: dict[str, Any] = {
            "_fps": fingerprints,
            "_pin": filters["normalize_fingerprint"](pin),
        }
        variables.update({k: _render(v, variables) for k, v in local.items()})
        return all(
            _render("{{ " + cond + " }}", variables)
            for cond in assert_task["ansible.builtin.assert"]["that"]
        )

    spaced = " ".join(LAB_KEY_FINGERPRINT[i : i + 4] for i in range(0, 40, 4)).lower()
    assert passes(spaced)
    assert not passes("EB693B3035CD5710E231E123A4B469963BF863CC")
    assert not passes(LAB_KEY_FINGERPRINT[-16:])  # a long key ID is not the fingerprint
    # The pinned key beside another one: refused (before, "the pin is among them" passed).
    other, _ = _other_key()
    assert not passes(LAB_KEY_FINGERPRINT, _armor(LAB_KEYRING.read_bytes() + other))
    assert not passes(LAB_KEY_FINGERPRINT, LAB_KEY.read_text() + _armor(other))
