"""The roles refuse a wrongly provisioned host with a message that says what to fix.

A private one-host lab, dirtied on purpose by installing the wrong packages first: a
proprietary driver, an RDMA stack of the other kind, no RDMA stack before nvidia-fs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from lab_harness import LabHosts
from site_lab import explain, failure_messages, recap, run_role, run_site

HOST = "kvguard-1"
NO_RDMA = "kvnordma-1"


@pytest.fixture(scope="module")
def guard(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    lab = lab_factory(hosts=1, name_prefix="kvguard")
    lab.ssh(HOST, ["apt-get", "update", "-qq"], sudo=True)
    return lab


def _apt(lab: LabHosts, *argv: str) -> None:
    lab.ssh(
        HOST,
        ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-y", "-q", *argv],
        sudo=True,
    )


def _installed(lab: LabHosts, package: str) -> bool:
    proc = lab.ssh(HOST, ["dpkg-query", "-W", "-f=${Status}", package], check=False)
    return proc.returncode == 0 and proc.stdout.endswith(" installed")


def test_check_mode_on_a_fresh_host_previews_without_changing_it(guard: LabHosts) -> None:
    proc = run_site(guard, check=True, diff=True, limit=HOST)
    assert proc.returncode == 0, explain(proc)
    assert recap(proc)[HOST]["changed"] > 0  # it would change things ...
    assert not _installed(guard, "nvidia-driver-580-open")  # ... but changed nothing
    assert "192.0.2.50:/kvcache" not in guard.read_file(HOST, "/etc/fstab")
    assert guard.doubles_log(HOST, "modprobe") == []


def test_nvidia_fs_refuses_to_install_before_the_rdma_stack(
    guard: LabHosts, tmp_path: Path
) -> None:
    proc = run_role(guard, tmp_path, "nvidia_fs", limit=HOST)
    assert proc.returncode != 0, explain(proc)
    assert "none of rdma-core, doca-ofed is installed" in failure_messages(proc)
    assert not _installed(guard, "nvidia-fs-dkms")


def test_rdma_client_refuses_doca_on_top_of_distro_rdma_core(
    guard: LabHosts, tmp_path: Path
) -> None:
    _apt(guard, "install", "rdma-core")
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
        assert "rdma_client_stack is doca-ofed but packages of the other stack are installed" in msg
        assert "(rdma-core)" in msg
        assert not _installed(guard, "doca-ofed")
    finally:
        _apt(guard, "purge", "rdma-core")


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
        assert "packages of the other stack are installed (doca-ofed)" in failure_messages(proc)
    finally:
        _apt(guard, "purge", "doca-ofed")


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
