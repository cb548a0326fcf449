"""What a fleet run shares between hosts (known_hosts, private keys) gives each host exactly what
paramiko would have found on its own, and is read again when the file changes."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import paramiko
import pytest

from kvops.remote import ssh

needs_keygen = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="no ssh-keygen")


@pytest.fixture(autouse=True)
def _fresh_caches() -> None:
    ssh.clear_caches()


def keygen(path: Path, kind: str, passphrase: str = "") -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", kind, "-N", passphrase, "-C", "t", "-f", str(path)], check=True
    )
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@needs_keygen
def test_known_hosts_entries_are_what_paramiko_looks_up(tmp_path: Path) -> None:
    ed = keygen(tmp_path / "ed", "ed25519")
    ec = keygen(tmp_path / "ec", "ecdsa")
    other = keygen(tmp_path / "other", "ed25519")
    hashed = paramiko.HostKeys.hash_host("[gpu-02]:2222")
    known = tmp_path / "known_hosts"
    known.write_text(
        f"gpu-01 {ec}\n"
        f"gpu-01,10.0.0.1 {ed}\n"
        f"gpu-01 {other}\n"  # a second key of one type: paramiko compares the first
        f"{hashed} {ed}\n"
        "# comment\n"
    )
    reference = paramiko.HostKeys(str(known))
    for name in ("gpu-01", "10.0.0.1", "[gpu-02]:2222", "gpu-03"):
        mine = paramiko.HostKeys()
        for keytype, key in ssh._known_host_entries(known, name):
            mine.add(name, keytype, key)
        theirs = reference.lookup(name)
        got = mine.lookup(name)
        if theirs is None:
            assert got is None
            continue
        assert got is not None
        assert got.keys() == list(dict.fromkeys(theirs.keys()))  # same preferred type first
        for keytype in theirs:
            assert got[keytype] == theirs[keytype]
    assert ssh._known_host_entries(tmp_path / "missing", "gpu-01") == []


@needs_keygen
def test_known_hosts_is_parsed_once_and_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ed = keygen(tmp_path / "ed", "ed25519")
    known = tmp_path / "known_hosts"
    known.write_text(f"gpu-01 {ed}\n")
    parses: list[Path] = []
    real = ssh._parse_known_hosts
    monkeypatch.setattr(ssh, "_parse_known_hosts", lambda p: parses.append(p) or real(p))
    threads = [
        threading.Thread(target=ssh._known_host_entries, args=(known, "gpu-01")) for _ in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(parses) == 1
    assert ssh._known_host_entries(known, "gpu-02") == []
    with known.open("a") as fh:  # e.g. --accept-new-host-keys recorded a key
        fh.write(f"gpu-02 {ed}\n")
    assert [t for t, _ in ssh._known_host_entries(known, "gpu-02")] == ["ssh-ed25519"]
    assert len(parses) == 2


@needs_keygen
@pytest.mark.parametrize("kind", ["ed25519", "rsa", "ecdsa"])
def test_private_key_is_loaded_once_and_is_the_same_key(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "id"
    keygen(path, kind)
    key = ssh._private_key(str(path))
    assert key is not None
    assert key.get_fingerprint() == paramiko.PKey.from_path(path).get_fingerprint()
    assert ssh._private_key(str(path)) is key  # the next host reuses it
    path.unlink()
    path.with_suffix(".pub").unlink()
    time.sleep(0.01)
    keygen(path, kind)  # a new key at the same path is loaded again
    again = ssh._private_key(str(path))
    assert again is not None and again.get_fingerprint() != key.get_fingerprint()


@needs_keygen
def test_a_key_that_needs_a_passphrase_is_left_to_paramiko(tmp_path: Path) -> None:
    """paramiko then loads it per host with ansible_password as passphrase, as before; no
    passphrase or decrypted key is kept between hosts."""
    path = tmp_path / "id"
    keygen(path, "ed25519", passphrase="secret")
    assert ssh._private_key(str(path)) is None
    assert ssh._private_key(str(tmp_path / "missing")) is None


class RecordingEvent(threading.Event):
    """An Event that records the timeouts it was waited on with."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return super().wait(timeout)


class EofChannel:
    """TEST DOUBLE of a paramiko Channel after the host's EOF, before its exit status."""

    eof_received = True

    def __init__(self) -> None:
        self.status_event = RecordingEvent()

    def fileno(self) -> int:  # pragma: no cover - must not be selected on after EOF
        raise AssertionError("select on a channel at EOF returns at once: a busy loop")


def test_after_eof_the_wait_blocks_on_the_exit_status_event() -> None:
    """After EOF the wait is on the exit-status event (woken the instant paramiko sets it),
    capped at 0.5 s, never a select on the channel (which would spin) or a plain sleep. Judged
    by what was waited on, not by wall-clock bounds a loaded machine could break."""
    chan = EofChannel()
    ssh._wait_for(chan, 0.01)  # type: ignore[arg-type]
    ssh._wait_for(chan, 5)  # type: ignore[arg-type]
    assert chan.status_event.waits == [0.01, 0.5]


@needs_keygen
def test_marker_lines_do_not_break_known_hosts_and_revoked_keys_are_refused(
    tmp_path: Path,
) -> None:
    """`@cert-authority`/`@revoked` lines made paramiko's loader raise for every host. A host a
    CA covers that shows a bare, unlisted key (no certificate) is refused saying so."""
    ed = keygen(tmp_path / "ed", "ed25519")
    ca = keygen(tmp_path / "ca", "ed25519")
    bad = keygen(tmp_path / "bad", "ed25519")
    known = tmp_path / "known_hosts"
    known.write_text(
        f"@cert-authority *.gpu.example.com,!skip.gpu.example.com {ca}\n"
        f"gpu-01 {ed}\n"
        f"@revoked * {bad}\n"
        "gpu-02 ssh-ed25519 not-base64!\n"
    )
    assert [t for t, _ in ssh._known_host_entries(known, "gpu-01")] == ["ssh-ed25519"]
    parsed = ssh._known_hosts(known)
    assert parsed.skipped_lines == [4]
    assert parsed.authority_for("n1.gpu.example.com")
    assert not parsed.authority_for("skip.gpu.example.com")
    revoked_key = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "bad"))
    policy = ssh._KnownHostsPolicy(known, accept_new=True)
    with pytest.raises(ssh.HostKeyRefused, match="@revoked"):
        policy.missing_host_key(paramiko.SSHClient(), "gpu-09", revoked_key)
    unlisted = paramiko.Ed25519Key.from_private_key_file(str(tmp_path / "ed"))
    strict = ssh._KnownHostsPolicy(known, accept_new=False)
    with pytest.raises(ssh.HostKeyRefused, match=r"presented no certificate, though a @cert-aut"):
        strict.missing_host_key(paramiko.SSHClient(), "n1.gpu.example.com", unlisted)


def test_jump_hosts_use_their_own_credentials_never_the_targets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvops.remote.inventory import InventoryHost

    bastion = InventoryHost(
        "bastion",
        vars={"ansible_host": "10.0.0.9", "ansible_ssh_private_key_file": "/keys/bastion"},
    )
    target = InventoryHost(
        "gpu-01",
        vars={
            "ansible_password": "target-secret",
            "ansible_ssh_private_key_file": "/keys/target",
            "ansible_ssh_common_args": "-J ops@10.0.0.9,other-jump:2222",
        },
    )
    target.jump_hosts = [bastion, target]
    first, second = target.jumps
    assert ssh._hop_credentials(first) == ssh.Credentials("/keys/bastion", None)
    assert first.user == "ops"
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/config: agent/default keys only
    assert ssh._hop_credentials(second) == ssh.Credentials(None, None)
    (tmp_path / ".ssh").mkdir()
    (tmp_path / "jumpkey").write_text("")
    (tmp_path / ".ssh" / "config").write_text(
        f"Host other-jump\n  IdentityFile {tmp_path}/jumpkey\n"
    )
    assert ssh._hop_credentials(second) == ssh.Credentials(str(tmp_path / "jumpkey"), None)
