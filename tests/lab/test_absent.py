"""Every role's ``*_state: absent`` on a converged host: what the roles put there goes away.

A private one-host lab (DOCA-OFED host), converged with playbooks/site.yml, then the same
playbook with every role absent, twice: the second absent run changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from lab_harness import LabHosts
from site_lab import EXPORT, MOUNT_PATH, explain, recap, run_site

pytestmark = [pytest.mark.lab, pytest.mark.own_lab, pytest.mark.own_lab_b]

HOST = "kvabs-1"
ABSENT = {
    "nvidia_driver_state": "absent",
    "rdma_client_state": "absent",
    "nvidia_fs_state": "absent",
    "nfs_rdma_mount_state": "absent",
    "cufile_state": "absent",
    "rdma_client_stack": "doca-ofed",
}


@pytest.fixture(scope="module")
def gone(lab_factory: Callable[..., LabHosts]) -> LabHosts:
    lab = lab_factory(hosts=1, name_prefix="kvabs")
    proc = run_site(lab, limit=HOST, extra_vars={"rdma_client_stack": "doca-ofed"})
    assert proc.returncode == 0, explain(proc)
    absent = run_site(lab, limit=HOST, extra_vars=ABSENT)
    assert absent.returncode == 0, explain(absent)
    return lab


def _installed(lab: LabHosts, package: str) -> bool:
    proc = lab.ssh(HOST, ["dpkg-query", "-W", "-f=${Status}", package], check=False)
    return proc.returncode == 0 and proc.stdout.endswith(" installed")


@pytest.mark.parametrize(
    "package",
    [
        "nvidia-driver-580-open",
        "nvidia-persistenced",
        "doca-ofed",
        "mlnx-nfsrdma-dkms",
        "nvidia-gds",
        "nvidia-fs-dkms",
    ],
)
def test_the_packages_are_removed(gone: LabHosts, package: str) -> None:
    assert not _installed(gone, package), package


def test_the_mount_fstab_line_and_config_files_are_gone(gone: LabHosts) -> None:
    host = gone.testinfra(HOST)
    assert not host.mount_point(MOUNT_PATH).exists
    assert EXPORT not in gone.read_file(HOST, "/etc/fstab")
    for path in (
        "/etc/cufile.json",
        "/etc/modules-load.d/rpcrdma.conf",
        "/etc/modules-load.d/nvidia-fs.conf",
        "/etc/modprobe.d/nvidia-fs.conf",
    ):
        assert not host.file(path).exists, path


def test_the_driver_module_file_is_gone(gone: LabHosts) -> None:
    """The driver package's DKMS step is undone with it (its prerm, as `dkms remove`): no
    nvidia.ko is left for modinfo or modprobe to find."""
    proc = gone.ssh(HOST, ["/usr/sbin/modinfo", "nvidia"], check=False)
    assert proc.returncode == 1 and "Module nvidia not found" in proc.stderr, proc


def test_a_second_absent_run_changes_nothing(gone: LabHosts) -> None:
    proc = run_site(gone, limit=HOST, extra_vars=ABSENT)
    assert proc.returncode == 0, explain(proc)
    assert recap(proc)[HOST]["changed"] == 0, explain(proc)
