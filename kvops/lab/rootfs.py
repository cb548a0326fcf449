"""The base Debian root filesystem of every lab host: built once, cached as a tree.

mmdebstrap takes about a minute or two; its tree is kept as ``rootfs-<key>`` in the cache dir
(reused by later runs on the same machine) as the read-only lower layer of every host's
overlayfs. ``<key>`` hashes the recipe below, so changing the recipe rebuilds instead of
silently reusing a stale image. The tree is built in a scratch folder and renamed into place, so
a build killed midway leaves nothing that looks finished. (Earlier versions also kept a
``rootfs-<key>.tar.zst`` and unpacked the tree from it: on a fresh machine that was about 50 s of
compressing and unpacking before the first lab host started. Such an archive is still unpacked
when it is there and the tree is not.)

The image is made offline on purpose: the Debian sources list is moved aside and resolv.conf
emptied (otherwise apt waits on DNS); the only apt source a host gets is the lab's repo of test
packages. Host keys are removed: every host gets fresh ones at start.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kvops.lab.config import LAB_USER
from kvops.lab.errors import LabError, run

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
VARIANT = "minbase"
# python3-apt: Ansible's apt module; acl: become_user to an unprivileged user; systemd: the real
# systemctl/systemd-analyze for unit files (it is not PID 1: sshd is).
INCLUDE = (
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "procps",
    "acl",
    "systemd",
)
RECIPE_VERSION = 1

SSHD_CONFIG = """\
# kvops lab: key-only logins, one host key type (written at host start), no DNS lookups.
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UseDNS no
"""
# Packages' maintainer scripts must not try to start daemons inside a lab host.
POLICY_RC_D = "#!/bin/sh\n# kvops lab: no service starts from maintainer scripts\nexit 101\n"


def recipe_key() -> str:
    """Short hash of everything that shapes the image."""
    recipe = json.dumps(
        [SUITE, MIRROR, VARIANT, INCLUDE, RECIPE_VERSION, SSHD_CONFIG, POLICY_RC_D, LAB_USER]
    )
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise builds between concurrent sessions (CI next to a developer's `make lab`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def archive_path(cache_dir: Path) -> Path:
    return cache_dir / f"rootfs-{recipe_key()}.tar.zst"


def base_dir(cache_dir: Path) -> Path:
    return cache_dir / f"rootfs-{recipe_key()}"


def ensure_base(cache_dir: Path, *, log: bool = True) -> Path:
    """Return the base root filesystem, building and caching it when missing."""
    target = base_dir(cache_dir)
    if _is_built(target):
        return target
    with _locked(cache_dir / ".rootfs.lock"):
        if _is_built(target):
            return target
        archive = archive_path(cache_dir)
        if archive.exists():
            _unpack(archive, target)
        else:
            _build(target, log=log)
    return target


def _is_built(tree: Path) -> bool:
    return (tree / "usr" / "sbin" / "sshd").exists()


def _say(log: bool, message: str) -> None:
    if log:
        print(f"lab: {message}", flush=True)


def _build(target: Path, *, log: bool) -> None:
    if shutil.which("mmdebstrap") is None:
        raise LabError(
            "mmdebstrap is missing: apt-get install -y --no-install-recommends "
            "mmdebstrap zstd iproute2 openssh-client dpkg-dev"
        )
    started = time.monotonic()
    _say(log, f"building the base root filesystem with mmdebstrap ({SUITE}, about 1-2 min)")
    work = Path(tempfile.mkdtemp(prefix="rootfs-build-", dir=target.parent))
    try:
        tree = work / "rootfs"
        run(
            [
                "mmdebstrap",
                f"--variant={VARIANT}",
                f"--include={','.join(INCLUDE)}",
                SUITE,
                str(tree),
                MIRROR,
            ],
            timeout_s=1200,
        )
        _make_offline(tree)
        if target.exists():  # a tree without sshd: not finished, whatever left it
            shutil.rmtree(target)
        tree.rename(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    _say(log, f"base root filesystem cached in {target} ({time.monotonic() - started:.0f} s)")


def _make_offline(tree: Path) -> None:
    """Turn the fresh image into a lab host template (offline apt, no keys, the lab user)."""
    sources = tree / "etc/apt/sources.list"
    if sources.exists():
        sources.rename(tree / "etc/apt/sources.list.kvops-offline")
    resolv = tree / "etc/resolv.conf"
    resolv.unlink(missing_ok=True)
    resolv.write_text("")
    for key in (tree / "etc/ssh").glob("ssh_host_*"):
        key.unlink()
    (tree / "etc/ssh/sshd_config.d/kvops-lab.conf").write_text(SSHD_CONFIG)
    policy = tree / "usr/sbin/policy-rc.d"
    policy.write_text(POLICY_RC_D)
    policy.chmod(0o755)
    (tree / "etc/hostname").write_text("kvops-lab\n")
    (tree / "srv/kvops-test-repo").mkdir(parents=True, exist_ok=True)
    run(["chroot", str(tree), "useradd", "--create-home", "--shell", "/bin/bash", LAB_USER])
    sudoers = tree / f"etc/sudoers.d/{LAB_USER}-lab"
    sudoers.write_text(f"{LAB_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n")
    sudoers.chmod(0o440)


def _unpack(archive: Path, target: Path) -> None:
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    run(
        ["tar", "--zstd", "--numeric-owner", "-C", str(partial), "-xf", str(archive)], timeout_s=600
    )
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)
