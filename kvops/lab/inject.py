"""The files a host gets copied in at every start (the "inject" tree).

Prepared from outside before the host starts, then copied over the merged root by the host's
init script with ``tar --no-overwrite-dir`` (existing directories keep their owner and mode).
Holds: the host's own fresh ed25519 host key (its public half goes to the lab known_hosts),
``authorized_keys`` for root and the lab user, /etc/hostname and /etc/hosts, the apt source of
the test repo, the host-level doubles from the package list and the per-host variant switch.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from kvops.lab import aptrepo
from kvops.lab.config import LAB_USER
from kvops.lab.errors import LabError, run

VARIANT_FILE = "etc/kvops-test-doubles/variant.env"
# Per-host switches of the doubles and the values each accepts (first = default).
# gdscheck, gdsio, mount.nfs and nvidia-smi have no switch: their doubles answer from the
# host's state (modules loaded, cufile.json, mounts), as the real tools do.
VARIANTS = {
    "RDMA": ("active", "down", "none"),
    "SYSTEMD": ("none", "double"),
}


# The lab's stand-in for /proc and /sys (the probe's path-root seam): the entries the kernel here
# cannot have are files kept by the doubles (modules, mounts, driver/nvidia*, module parameters);
# everything else is a link to the real one. Per-PID entries (/proc/<pid>) are not in it.
PROC_TREE = "/var/lib/kvops-test-doubles/proc"
SYS_TREE = "/var/lib/kvops-test-doubles/sys"
PROC_LINKS = (
    "cmdline",
    "cpuinfo",
    "meminfo",
    "version",
    "filesystems",
    "uptime",
    "loadavg",
    "stat",
    "net",
    "self",
    "sys",
    "partitions",
)
SYS_LINKS = ("bus", "devices", "kernel", "block", "fs", "firmware")


def _proc_tree(proc: Path, sys: Path) -> None:
    proc.mkdir(parents=True, exist_ok=True)
    for name in PROC_LINKS:
        (proc / name).symlink_to(f"/proc/{name}")
    (proc / "modules").symlink_to("../modules")
    sys.mkdir(parents=True, exist_ok=True)
    for name in SYS_LINKS:
        (sys / name).symlink_to(f"/sys/{name}")
    # /sys/class entry by entry (the hosts share this kernel), except infiniband: the modelled
    # RDMA NIC lives there (tests/lab/doubles/rdma-device).
    (sys / "class").mkdir()
    for entry in sorted(Path("/sys/class").iterdir()):
        if entry.name != "infiniband":
            (sys / "class" / entry.name).symlink_to(f"/sys/class/{entry.name}")


def lab_user_ids(base: Path) -> tuple[int, int]:
    """uid/gid of the lab user inside the base image (not on this machine)."""
    for line in (base / "etc/passwd").read_text().splitlines():
        fields = line.split(":")
        if fields[0] == LAB_USER:
            return int(fields[2]), int(fields[3])
    raise LabError(f"the base image has no user {LAB_USER!r}; remove the cached rootfs")


def render_variant(variant: Mapping[str, str]) -> str:
    """``RDMA=down`` lines; unknown keys or values are refused (a typo must not pass)."""
    unknown = sorted(set(variant) - set(VARIANTS))
    if unknown:
        raise LabError(f"unknown variant keys {unknown}; known: {', '.join(VARIANTS)}")
    lines = ["# kvops lab: per-host switch of the test doubles (empty = healthy)"]
    for key, value in sorted(variant.items()):
        if value not in VARIANTS[key]:
            raise LabError(f"variant {key}={value!r}: choose one of {', '.join(VARIANTS[key])}")
        lines.append(f"{key}={value}")
    return "\n".join(lines) + "\n"


def _write(root: Path, rel: str, text: str, mode: int, owner: tuple[int, int] = (0, 0)) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)
    os.chown(path, *owner)


def prepare_inject(
    inject: Path,
    *,
    base: Path,
    name: str,
    etc_hosts: str,
    authorized_key: str,
    spec: aptrepo.RepoSpec | None,
    spec_dir: Path | None,
    variant: Mapping[str, str],
) -> str:
    """Build the inject tree; returns the host's public host key line."""
    if inject.exists():
        shutil.rmtree(inject)
    inject.mkdir(parents=True)
    for rel in (
        "etc",
        "etc/ssh",
        "root",
        "home",
        "usr",
        "usr/sbin",
        "usr/lib",
        "var",
        "var/lib",
        "var/log",
    ):
        (inject / rel).mkdir(mode=0o755, exist_ok=True)
    (inject / "root").chmod(0o700)
    key = inject / "etc/ssh/ssh_host_ed25519_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{name}", "-f", str(key)])
    pub = key.with_suffix(".pub").read_text().split()
    host_key = f"{pub[0]} {pub[1]}"
    _write(inject, "etc/hostname", name + "\n", 0o644)
    _write(inject, "etc/hosts", etc_hosts, 0o644)
    uid, gid = lab_user_ids(base)
    for home, owner in (("root", (0, 0)), (f"home/{LAB_USER}", (uid, gid))):
        ssh_dir = inject / home / ".ssh"
        ssh_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        os.chown(ssh_dir, *owner)
        _write(inject, f"{home}/.ssh/authorized_keys", authorized_key, 0o600, owner)
    if (inject / "home" / LAB_USER).exists():
        # Only .ssh is new; the home directory itself keeps the base image's owner and mode.
        os.chown(inject / "home" / LAB_USER, uid, gid)
        (inject / "home" / LAB_USER).chmod(0o755)
    if spec is not None and spec_dir is not None:
        _write(inject, "etc/apt/sources.list.d/kvops-test-repo.list", spec.apt_source + "\n", 0o644)
        sources = aptrepo.Sources(
            doubles=spec_dir / "doubles",
            fixtures=spec_dir.parent / "fixtures",
            files=spec_dir / "files",
        )
        for double in spec.host_doubles:
            aptrepo.place_file(inject, double, sources)
    _write(inject, VARIANT_FILE, render_variant(variant), 0o644)
    _proc_tree(inject / PROC_TREE.lstrip("/"), inject / SYS_TREE.lstrip("/"))
    # The doubles log every call here, also when a non-root user runs them (nvidia-smi).
    log_dir = inject / "var/log/kvops-test-doubles"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_dir.chmod(0o1777)
    return host_key
