"""The roles refuse a wrongly provisioned host with a message that says what to fix.

A private one-host lab, dirtied on purpose by installing the wrong packages first: a
proprietary driver, a conflicting RDMA stack (MLNX_OFED under DOCA-OFED, DOCA under the
distribution's stack), no OFED kernel stack before nvidia-fs, nvidia-fs built before DOCA-OFED.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import yaml
from ci_rule import unavailable
from lab_harness import LabHosts
from site_lab import (
    HERE,
    SITE_VARS,
    changed_tasks,
    explain,
    failure_messages,
    recap,
    run_role,
    run_site,
)

from kvops.lab.wheelhouse import serve_directory

HOST = "kvguard-1"
NO_RDMA = "kvnordma-1"


@pytest.fixture(scope="module")
def guard(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    lab = lab_factory(hosts=1, name_prefix="kvguard")
    lab.ssh(HOST, ["apt-get", "update", "-qq"], sudo=True)
    return lab


_THROUGH_HOLDS = ["--allow-change-held-packages"]


def _apt(lab: LabHosts, *argv: str) -> None:
    lab.ssh(
        HOST,
        # The roles hold what they install: a test's cleanup purges through the holds.
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q", *_THROUGH_HOLDS, *argv],
        sudo=True,
    )


def _installed(lab: LabHosts, package: str) -> bool:
    proc = lab.ssh(HOST, ["dpkg-query", "-W", "-f=${Status}", package], check=False)
    return proc.returncode == 0 and proc.stdout.endswith(" installed")


# The lab's signing key for repository tests (tests/lab/files/lab-repo-key.asc, made with
# `gpg --quick-gen-key ... ed25519`; `gpg --show-keys` prints this fingerprint).
LAB_KEY_FINGERPRINT = "B233E651D1F4CEA32271F977E6D611B401770A50"
NVIDIA_CUDA_KEY_FINGERPRINT = "EB693B3035CD5710E231E123A4B469963BF863CC"
# A fresh host has no NVIDIA or DOCA repository: the lab's one apt source carries every vendor
# test package too, so while a test runs these are made uninstallable (priority -1) and only the
# distribution's packages resolve, as on a fresh Ubuntu server.
NO_VENDOR_REPOS = "/etc/apt/preferences.d/kvops-test-no-vendor-repos"
_VENDOR_PACKAGES = "nvidia-* libnvidia-* cuda-* libcufile* gds-tools-* doca-* mlnx-*"
_REPO_FILES = ("/etc/apt/sources.list.d/cuda.sources", "/etc/apt/sources.list.d/doca.sources")
_DOCA_KEYRINGS = ("/etc/apt/keyrings/doca.gpg", "/etc/apt/keyrings/doca.asc")


@pytest.fixture()
def key_server(guard: LabHosts) -> Iterator[str]:
    """The lab key served over HTTP on the lab bridge, as a vendor serves its repository key."""
    server, url = serve_directory(HERE / "files", guard.gateway_ip)
    try:
        yield url
    finally:
        server.shutdown()


def _managed_repos(url: str, fingerprint: str) -> dict[str, Any]:
    """The roles add their repositories themselves, from ``url``, pinned to ``fingerprint``.
    The CUDA key is served armored (NVIDIA's .pub), the DOCA key as a binary keyring (DOCA's
    doca_keyring.gpg): the same lab key in both forms."""
    return {
        "nvidia_driver_cuda_repo_manage": True,
        "nvidia_driver_cuda_repo_url": f"{url}/cuda/",
        "nvidia_driver_cuda_repo_key_url": f"{url}/lab-repo-key.asc",
        "nvidia_driver_cuda_repo_key_fingerprint": fingerprint,
        "rdma_client_doca_repo_manage": True,
        "rdma_client_doca_repo_url": f"{url}/doca/",
        "rdma_client_doca_repo_key_url": f"{url}/lab-repo-key.gpg",
        "rdma_client_doca_repo_key_fingerprint": fingerprint,
    }


def test_check_mode_on_a_fresh_host_previews_without_changing_it(
    guard: LabHosts, key_server: str
) -> None:
    """A fresh host without NVIDIA's or Mellanox's repository: the preview verifies the repository
    keys, says which packages the repositories would bring, and fails on nothing (before, apt
    answered "No package matching" for every vendor package)."""
    pins = f"Package: {_VENDOR_PACKAGES}\nPin: version *\nPin-Priority: -1\n"
    guard.write_file(HOST, NO_VENDOR_REPOS, pins)
    try:
        proc = run_site(
            guard, check=True, diff=True, limit=HOST,
            extra_vars=_managed_repos(key_server, LAB_KEY_FINGERPRINT),
        )  # fmt: skip
    finally:
        guard.ssh(HOST, ["rm", "-f", NO_VENDOR_REPOS], sudo=True)
    assert proc.returncode == 0, explain(proc)
    assert recap(proc)[HOST]["changed"] > 0  # it would change things ...
    out = proc.stdout
    assert f"nvidia_driver: CUDA repository key {LAB_KEY_FINGERPRINT}" in out
    assert f"rdma_client: DOCA repository key {LAB_KEY_FINGERPRINT}" in out
    assert "the CUDA repository is not on this host yet" in out
    assert "nvidia-driver-580-open, nvidia-persistenced cannot be resolved now" in out
    assert "doca-ofed, mlnx-nfsrdma-dkms cannot be resolved now" in out
    assert "nvidia-gds, nvidia-fs, nvidia-fs-dkms cannot be resolved now" in out
    assert not _installed(guard, "nvidia-driver-580-open")  # ... but changed nothing
    for path in (*_REPO_FILES, "/etc/apt/keyrings/cuda.asc", *_DOCA_KEYRINGS):
        assert guard.ssh(HOST, ["test", "-e", path], check=False).returncode != 0, path
    # The downloaded key's temporary file is gone too.
    assert guard.ssh(HOST, ["sh", "-c", "ls /tmp/*.doca-key"], check=False).returncode != 0
    assert "192.0.2.50:/kvcache" not in guard.read_file(HOST, "/etc/fstab")
    assert guard.doubles_log(HOST, "modprobe") == []


def test_a_repository_key_with_another_fingerprint_is_refused_before_the_repository(
    guard: LabHosts, tmp_path: Path, key_server: str
) -> None:
    """The lab key served where NVIDIA's key should be: both roles refuse it with both
    fingerprints in the message, and add neither the repository nor the key."""
    pinned = _managed_repos(key_server, NVIDIA_CUDA_KEY_FINGERPRINT)
    for role, name in (("nvidia_driver", "CUDA"), ("rdma_client", "DOCA")):
        proc = run_role(guard, tmp_path, role, limit=HOST, extra_vars=pinned)
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert f"has fingerprint(s) {LAB_KEY_FINGERPRINT}, not the pinned" in msg, msg
        assert NVIDIA_CUDA_KEY_FINGERPRINT in msg and f"the {name} repository was not added" in msg
    for path in (*_REPO_FILES, "/etc/apt/keyrings/cuda.asc", *_DOCA_KEYRINGS):
        assert guard.ssh(HOST, ["test", "-e", path], check=False).returncode != 0, path
    assert not _installed(guard, "nvidia-driver-580-open")


@contextlib.contextmanager
def _signing_key(home: Path, uid: str) -> Iterator[tuple[str, Callable[..., bytes]]]:
    """A real ed25519 signing key made here in its own GNUPGHOME: its fingerprint and a `gpg`
    runner for that home; the agent is stopped afterwards."""
    if shutil.which("gpg") is None:
        unavailable("gpg is missing (as root, `scripts/system-deps.sh` installs it)")
    home.mkdir(mode=0o700)
    env = {**os.environ, "GNUPGHOME": str(home)}

    def gpg(*argv: str) -> bytes:
        return subprocess.run(
            ["gpg", "--batch", *argv], env=env, capture_output=True, check=True
        ).stdout

    try:
        gpg("--passphrase", "", "--quick-gen-key", uid, "ed25519", "sign", "never")
        colons = gpg("--with-colons", "--list-keys").decode().splitlines()
        yield next(line.split(":")[9] for line in colons if line.startswith("fpr:")), gpg
    finally:
        subprocess.run(["gpgconf", "--kill", "all"], env=env, check=False, capture_output=True)


def _another_key(home: Path) -> tuple[str, bytes, bytes]:
    """A second real signing key made here: its fingerprint, binary and armored exports."""
    with _signing_key(home, "not the vendor <x@example.invalid>") as (fingerprint, gpg):
        return fingerprint, gpg("--export", fingerprint), gpg("--armor", "--export", fingerprint)


def test_a_repository_key_file_with_a_second_key_is_refused(
    guard: LabHosts, tmp_path: Path
) -> None:
    """The pinned key served together with another key (apt would trust both): the CUDA key as
    two armored blocks, DOCA's as one binary keyring of two keys. Both roles refuse, naming both
    fingerprints, and add neither the repository nor the key."""
    other, binary, armored = _another_key(tmp_path / "gnupg")
    served = tmp_path / "served"
    served.mkdir()
    files = HERE / "files"
    (served / "lab-repo-key.asc").write_bytes((files / "lab-repo-key.asc").read_bytes() + armored)
    (served / "lab-repo-key.gpg").write_bytes((files / "lab-repo-key.gpg").read_bytes() + binary)
    server, url = serve_directory(served, guard.gateway_ip)
    try:
        pinned = _managed_repos(url, LAB_KEY_FINGERPRINT)
        for role, name in (("nvidia_driver", "CUDA"), ("rdma_client", "DOCA")):
            proc = run_role(guard, tmp_path, role, limit=HOST, extra_vars=pinned)
            assert proc.returncode != 0, explain(proc)
            msg = failure_messages(proc)
            assert f"has fingerprint(s) {LAB_KEY_FINGERPRINT}, {other}, not the pinned" in msg, msg
            assert f"the {name} repository was not added" in msg, msg
    finally:
        server.shutdown()
    for path in (*_REPO_FILES, "/etc/apt/keyrings/cuda.asc", *_DOCA_KEYRINGS):
        assert guard.ssh(HOST, ["test", "-e", path], check=False).returncode != 0, path


def test_nvidia_fs_refuses_to_install_before_the_rdma_stack(
    guard: LabHosts, tmp_path: Path
) -> None:
    proc = run_role(guard, tmp_path, "nvidia_fs", limit=HOST)
    assert proc.returncode != 0, explain(proc)
    msg = failure_messages(proc)
    assert "none of mlnx-ofed-kernel-dkms, mlnx-ofed-kernel-modules" in msg
    assert "Install DOCA-OFED first" in msg
    assert not _installed(guard, "nvidia-fs-dkms")


_DOCA = ["doca-ofed", "mlnx-nfsrdma-dkms", "mlnx-ofed-kernel-dkms", "mlnx-ofed-kernel-utils"]
_DOCA_ALL = [*_DOCA, "mlnx-tools", "rdma-core", "ibverbs-utils"]
_GDS_ALL = [
    "nvidia-driver-580-open",
    "nvidia-gds",
    "nvidia-gds-12-9",
    "gds-tools-12-9",
    "libcufile-12-9",
    "nvidia-fs",
    "nvidia-fs-dkms",
]


def _signed_flat_repo(directory: Path) -> str:
    """An empty flat apt repository laid out as DOCA's (InRelease, and doca_keyring.gpg, a binary
    keyring, in the repository directory), signed by a key made here; returns its fingerprint."""
    with _signing_key(directory.parent / "gnupg", "kvops lab DOCA <lab@example.invalid>") as (
        fingerprint,
        gpg,
    ):
        directory.mkdir()
        (directory / "doca_keyring.gpg").write_bytes(gpg("--export", fingerprint))
        packages = b""  # no packages: the lab's own source carries the DOCA test doubles
        (directory / "Packages").write_bytes(packages)
        # A flat repository's Release (https://wiki.debian.org/DebianRepository/Format).
        (directory / "Release").write_text(
            f"Origin: kvops-lab\nLabel: doca\nDate: {formatdate(usegmt=True)}\nSHA256:\n"
            f" {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n"
        )
        gpg("--local-user", fingerprint, "--clearsign", "--output",
            str(directory / "InRelease"), str(directory / "Release"))  # fmt: skip
    return fingerprint


def test_doca_replaces_the_distro_rdma_core_in_place(guard: LabHosts, tmp_path: Path) -> None:
    """With the DOCA repository added as the role adds it by default: the key is the binary
    keyring doca_keyring.gpg beside InRelease, pinned, and apt verifies the repository with it."""
    fingerprint = _signed_flat_repo(tmp_path / "doca")
    server, url = serve_directory(tmp_path, guard.gateway_ip)
    repo = {
        "rdma_client_stack": "doca-ofed",
        "rdma_client_doca_repo_manage": True,
        "rdma_client_doca_repo_url": f"{url}/doca/",
        "rdma_client_doca_repo_key_fingerprint": fingerprint,
    }
    _apt(guard, "install", "rdma-core=44.0-2", "ibverbs-utils=44.0-2")
    try:
        proc = run_role(guard, tmp_path, "rdma_client", limit=HOST, extra_vars=repo)
        assert proc.returncode == 0, explain(proc)
        assert f"rdma_client: DOCA repository key {fingerprint}" in proc.stdout
        # The bytes checked are the bytes apt trusts, under the suffix apt reads them by.
        served = (tmp_path / "doca" / "doca_keyring.gpg").read_bytes()
        installed = guard.ssh(HOST, ["base64", "-w0", "/etc/apt/keyrings/doca.gpg"]).stdout
        assert installed == base64.b64encode(served).decode()
        sources = guard.read_file(HOST, "/etc/apt/sources.list.d/doca.sources")
        assert "Signed-By: /etc/apt/keyrings/doca.gpg" in sources, sources
        assert _installed(guard, "doca-ofed") and _installed(guard, "mlnx-nfsrdma-dkms")
        version = guard.ssh(HOST, ["dpkg-query", "-W", "-f=${Version}", "rdma-core"]).stdout
        assert "mlnx" in version  # DOCA's build over Debian's, not a second stack beside it
        # rpcrdma loaded: the one mlnx-nfsrdma-dkms rebuilt for OFED's kernel stack.
        assert "rpcrdma" in guard.doubles_log(HOST, "modprobe")
        again = run_role(guard, tmp_path, "rdma_client", limit=HOST, extra_vars=repo)
        assert again.returncode == 0 and recap(again)[HOST]["changed"] == 0, explain(again)
        # apt really checks the repository against that keyring: another key in it, and apt
        # refuses the repository.
        other = base64.b64encode((HERE / "files" / "lab-repo-key.gpg").read_bytes()).decode()
        swap = ["sh", "-c", "base64 -d > /etc/apt/keyrings/doca.gpg"]
        guard.ssh(HOST, swap, sudo=True, input_text=other)
        refused = guard.ssh(HOST, ["apt-get", "update"], sudo=True, check=False)
        said = refused.stdout + refused.stderr
        assert "NO_PUBKEY" in said and f"{url}/doca" in said, said
    finally:
        server.shutdown()
        guard.ssh(HOST, ["rm", "-f", _REPO_FILES[1], *_DOCA_KEYRINGS], sudo=True)
        _apt(guard, "purge", *_DOCA_ALL)
        guard.ssh(HOST, ["rm", "-f", "/etc/modules-load.d/rpcrdma.conf"], sudo=True)


def test_doca_without_its_nfsrdma_modules_cannot_load_rpcrdma(guard: LabHosts) -> None:
    # What the role's mlnx-nfsrdma-dkms prevents (the double follows the real module ABI).
    _apt(guard, "install", "doca-ofed")
    try:
        guard.ssh(HOST, ["modprobe", "-r", "rpcrdma"], sudo=True, check=False)
        proc = guard.ssh(HOST, ["modprobe", "rpcrdma"], sudo=True, check=False)
        assert proc.returncode == 1
        assert "could not insert 'rpcrdma'" in proc.stderr
    finally:
        _apt(guard, "purge", *_DOCA_ALL)


def test_rdma_client_refuses_doca_over_mlnx_ofed(guard: LabHosts, tmp_path: Path) -> None:
    _apt(guard, "install", "mlnx-ofed-basic")
    try:
        proc = run_role(
            guard,
            tmp_path,
            "rdma_client",
            limit=HOST,
            extra_vars={"rdma_client_stack": "doca-ofed"},
        )
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert "rdma_client_stack is doca-ofed but packages of a conflicting stack" in msg
        assert "(mlnx-ofed-basic)" in msg and "Never mix MLNX_OFED and DOCA-OFED" in msg
        assert not _installed(guard, "doca-ofed")
    finally:
        _apt(guard, "purge", "mlnx-ofed-basic", "mlnx-ofed-kernel-dkms", "mlnx-ofed-kernel-utils")


def test_rdma_client_refuses_rdma_core_on_top_of_doca(guard: LabHosts, tmp_path: Path) -> None:
    _apt(guard, "install", "doca-ofed")
    try:
        proc = run_role(
            guard,
            tmp_path,
            "rdma_client",
            limit=HOST,
            extra_vars={"rdma_client_stack": "rdma-core"},
        )
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert "conflicting stack are installed (doca-ofed, mlnx-ofed-kernel-dkms)" in msg
        assert "set rdma_client_stack to doca-ofed" in msg
    finally:
        _apt(guard, "purge", *_DOCA_ALL)


def test_nvidia_driver_refuses_a_proprietary_driver(guard: LabHosts, tmp_path: Path) -> None:
    _apt(guard, "install", "nvidia-driver-580")
    try:
        proc = run_role(guard, tmp_path, "nvidia_driver", limit=HOST)
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert "the proprietary NVIDIA kernel module is installed (nvidia-driver-580)" in msg
        assert "nvidia-fs (GDS) works only with the open kernel modules" in msg
        assert not _installed(guard, "nvidia-driver-580-open")
    finally:
        _apt(guard, "purge", "nvidia-driver-580")


def test_nvidia_driver_refuses_an_open_package_with_a_proprietary_module(
    guard: LabHosts, tmp_path: Path
) -> None:
    """The package is the open one, at the pinned version, but the module file modprobe would
    load is the proprietary nvidia.ko (built by hand over the DKMS one, as NVIDIA's .run
    installer leaves a host): the package-name guard cannot see it; the license guard must,
    since modinfo answers from the module file. Once that module is loaded (a boot would),
    validate FAILs GDS-002 from the banner it printed in /proc/driver/nvidia/version."""
    site_vars = yaml.safe_load(SITE_VARS.read_text())["all"]["children"]["gpu_hosts"]["vars"]
    pinned = site_vars["nvidia_driver_version"]
    _apt(guard, "install", f"nvidia-driver-580-open={pinned}")
    kernel = guard.ssh(HOST, ["uname", "-r"]).stdout.strip()
    dkms = f"/lib/modules/{kernel}/updates/dkms/nvidia.ko"
    deb = f"/srv/kvops-test-repo/nvidia-driver-580_{pinned.split(':', 1)[-1]}_all.deb"
    member = "./usr/share/kvops-test-doubles/modules/nvidia-driver/nvidia.ko"

    def license_() -> str:
        return guard.ssh(HOST, ["/usr/sbin/modinfo", "-F", "license", "nvidia"]).stdout.strip()

    try:
        assert license_() == "Dual MIT/GPL"  # what the open package's DKMS step installed
        swap = f"dpkg-deb --fsys-tarfile {deb} | tar -xOf - {member} > {dkms}"
        guard.ssh(HOST, ["sh", "-c", swap], sudo=True)
        assert license_() == "NVIDIA"
        proc = run_role(guard, tmp_path, "nvidia_driver", limit=HOST)
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert 'is not the open one (modinfo -F license nvidia: "NVIDIA";' in msg, msg
        assert "nvidia" not in _loaded(guard)  # refused before loading it

        guard.ssh(HOST, ["modprobe", "nvidia"], sudo=True)
        banner = guard.read_file(HOST, "/var/lib/kvops-test-doubles/proc/driver/nvidia/version")
        assert "NVIDIA UNIX x86_64 Kernel Module" in banner, banner
        validate = [sys.executable, "-m", "kvops", "validate", "-i", str(guard.inventory_path),
                    "-i", str(SITE_VARS), "-i", str(HERE / "validate_lab_vars.yml"),
                    "--limit", HOST, "--json", "--timeout", "90"]  # fmt: skip
        run = subprocess.run(validate, capture_output=True, text=True, env=guard.env(), timeout=300)
        report = json.loads(run.stdout)
        [driver] = [f for f in report["hosts"][HOST]["findings"] if f["check_id"] == "GDS-002"]
        assert driver["severity"] == "FAIL", driver
        assert "proprietary kernel module" in driver["message"], driver
    finally:
        guard.ssh(HOST, ["modprobe", "-r", "nvidia"], sudo=True, check=False)
        _apt(guard, "purge", "nvidia-driver-580-open")
        guard.ssh(HOST, ["rm", "-f", dkms], sudo=True)


@pytest.fixture(scope="module")
def no_rdma(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    """A host without any RDMA device (RDMA=none: the lab's RDMA model is off)."""
    return lab_factory(hosts=1, name_prefix="kvnordma", variants={NO_RDMA: {"RDMA": "none"}})


def test_rdma_client_fails_clearly_without_rdma_devices(no_rdma: LabHosts, tmp_path: Path) -> None:
    proc = run_role(no_rdma, tmp_path, "rdma_client", limit=NO_RDMA)
    assert proc.returncode != 0, explain(proc)
    msg = failure_messages(proc)
    assert "rdma_client: expected at least 1 RDMA device(s) from ibv_devices, found 0" in msg


def test_cufile_fails_clearly_when_rdma_discovery_finds_nothing(
    no_rdma: LabHosts, tmp_path: Path
) -> None:
    proc = run_role(no_rdma, tmp_path, "cufile", limit=NO_RDMA)  # lab vars: discovery on
    assert proc.returncode != 0, explain(proc)
    assert "no RDMA device with a network interface was found under" in failure_messages(proc)


def test_nvidia_fs_built_before_doca_fails_the_peerdirect_check(
    guard: LabHosts, tmp_path: Path
) -> None:
    # nvidia-fs built on a host without the OFED kernel stack, DOCA-OFED installed afterwards:
    # the module has no PeerDirect (GDS troubleshooting guide 12.18); the role must say so.
    packages = ["nvidia-driver-580-open", "nvidia-fs-dkms=2.25.7-1"]
    _apt(guard, "install", *packages)
    _apt(guard, "install", "doca-ofed", "mlnx-nfsrdma-dkms")
    try:
        proc = run_role(guard, tmp_path, "nvidia_fs", limit=HOST)
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert 'says "Mellanox PeerDirect Supported: False"' in msg
        assert "rebuild nvidia-fs" in msg
    finally:
        _apt(guard, "purge", *_GDS_ALL, *_DOCA_ALL)


GATE_STATE = "/var/lib/kvops/reboot-pending.json"


def _loaded(lab: LabHosts) -> set[str]:
    return {ln.split()[0] for ln in lab.ssh(HOST, ["lsmod"]).stdout.splitlines()[1:]}


def test_doca_over_loaded_in_box_modules_records_a_pending_reboot_without_reboot(
    guard: LabHosts, tmp_path: Path
) -> None:
    """kernel_gate_reboot false: DOCA-OFED installed while the in-box ib_core/mlx5 are loaded
    (coldplugged at boot) is a pending reboot; rpcrdma is not loaded next to them, the run
    passes and says so, and the next boot clears it."""
    opt_out = {"rdma_client_stack": "doca-ofed", "kernel_gate_reboot": False}
    assert {"ib_core", "mlx5_core"} <= _loaded(guard)
    calls_before = len(guard.doubles_log(HOST, "modprobe"))  # earlier tests' calls stay logged
    try:
        proc = run_role(guard, tmp_path, "rdma_client", limit=HOST, extra_vars=opt_out)
        assert proc.returncode == 0, explain(proc)
        assert "REBOOT PENDING (rdma_client: DOCA-OFED changed while the in-box RDMA" in proc.stdout
        assert "rdma_client: pending the reboot: rpcrdma not loaded" in proc.stdout
        assert "rpcrdma" not in _loaded(guard)
        assert "rpcrdma" not in guard.doubles_log(HOST, "modprobe")[calls_before:]
        boot_id = guard.read_file(HOST, "/var/lib/kvops-test-doubles/boot_id").strip()
        assert f'"boot_id": "{boot_id}"' in guard.read_file(HOST, GATE_STATE)

        again = run_role(guard, tmp_path, "rdma_client", limit=HOST, extra_vars=opt_out)
        assert again.returncode == 0, explain(again)
        assert "a reboot is pending since an earlier run" in again.stdout
        assert recap(again)[HOST]["changed"] == 0, explain(again)

        guard.restart(HOST)  # the boot loads OFED's modules and rpcrdma from modules-load.d
        after = run_role(guard, tmp_path, "rdma_client", limit=HOST, extra_vars=opt_out)
        assert after.returncode == 0, explain(after)
        for pending in ("REBOOT PENDING", "pending the reboot:", "a reboot is pending"):
            assert pending not in after.stdout, explain(after)
        assert guard.ssh(HOST, ["test", "-e", GATE_STATE], check=False).returncode != 0
        assert "rpcrdma" in _loaded(guard)
    finally:
        _apt(guard, "purge", *_DOCA_ALL)
        guard.ssh(HOST, ["rm", "-f", "/etc/modules-load.d/rpcrdma.conf", GATE_STATE], sudo=True)


def test_a_stack_change_rebuilds_nvidia_fs_and_the_gate_reboots(
    guard: LabHosts, tmp_path: Path
) -> None:
    """nvidia-fs built before DOCA-OFED (no PeerDirect); rdma_client then installs DOCA in the
    same play as nvidia_fs: nvidia-fs is rebuilt against it, the gate reboots (the lab's reboot
    double, kernel_gate_reboot true in the lab vars) and PeerDirect is there."""
    _apt(guard, "install", "nvidia-driver-580-open", "nvidia-fs-dkms=2.25.7-1")
    try:
        proc = run_role(
            guard,
            tmp_path,
            "rdma_client",
            limit=HOST,
            extra_vars={"rdma_client_stack": "doca-ofed"},
            then=("nvidia_fs",),
        )
        assert proc.returncode == 0, explain(proc)
        rebuilt = "nvidia_fs : Nvidia_fs | Rebuild nvidia-fs against the changed RDMA stack"
        assert rebuilt in changed_tasks(proc, HOST), explain(proc)
        assert guard.doubles_log(HOST, "nvidia-fs-dkms")[-1].endswith("peerdirect=True")
        assert guard.doubles_log(HOST, "reboot"), "the gate did not reboot"
        assert "nvidia_fs: Mellanox PeerDirect Supported: True" in proc.stdout
    finally:
        _apt(guard, "purge", *_GDS_ALL, *_DOCA_ALL)


def test_nvidia_driver_refuses_unsigned_dkms_modules_under_secure_boot(
    guard: LabHosts, tmp_path: Path
) -> None:
    _apt(guard, "install", "mokutil")
    guard.write_file(HOST, "/etc/kvops-test-doubles/secure-boot", "enabled\n")
    try:
        proc = run_role(guard, tmp_path, "nvidia_driver", limit=HOST)
        assert proc.returncode != 0, explain(proc)
        msg = failure_messages(proc)
        assert "Secure Boot is enabled" in msg
        assert "linux-modules-nvidia-580-open-generic" in msg  # the signed precompiled path
        assert "nvidia_driver_secure_boot_mok_enrolled" in msg  # the MOK path
        assert not _installed(guard, "nvidia-driver-580-open")
    finally:
        guard.ssh(HOST, ["rm", "-f", "/etc/kvops-test-doubles/secure-boot"], sudo=True)
        _apt(guard, "purge", "mokutil")


def test_the_distro_rdma_core_is_an_explicit_non_gds_choice(
    guard: LabHosts, tmp_path: Path
) -> None:
    """rdma_client_stack rdma-core: NFS over RDMA works (rpcrdma loads), the role says GDS is
    not available, and nvidia_fs with nvidia_fs_require_peerdirect false reports PeerDirect
    False instead of failing (with the default true it refuses: see above)."""
    _apt(guard, "install", "nvidia-driver-580-open")
    non_gds = {
        "rdma_client_stack": "rdma-core",
        "rdma_client_version": "44.0-2",
        "nvidia_fs_require_peerdirect": False,
    }
    try:
        proc = run_role(
            guard, tmp_path, "rdma_client", limit=HOST, extra_vars=non_gds, then=("nvidia_fs",)
        )
        assert proc.returncode == 0, explain(proc)
        assert "GPUDirect Storage needs the OFED kernel stack (doca-ofed)" in proc.stdout
        assert "nvidia_fs: Mellanox PeerDirect Supported: False" in proc.stdout
        assert "rpcrdma" in _loaded(guard)
        version = guard.ssh(HOST, ["dpkg-query", "-W", "-f=${Version}", "rdma-core"]).stdout
        assert version == "44.0-2"
    finally:
        _apt(guard, "purge", *_GDS_ALL, "rdma-core", "ibverbs-utils")
        guard.ssh(HOST, ["rm", "-f", "/etc/modules-load.d/rpcrdma.conf"], sudo=True)
