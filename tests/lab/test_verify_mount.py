"""testinfra after site.yml: the fstab line, the NFS/RDMA mount, the GDS directory."""

from __future__ import annotations

import pytest
from lab_harness import LabHosts
from site_lab import EXPORT, MOUNT_OPTIONS, MOUNT_PATH, STACK, converged


@pytest.fixture(params=sorted(STACK))
def name(request: pytest.FixtureRequest, lab: LabHosts) -> str:
    converged(lab)
    return str(request.param)


def test_fstab_line(lab: LabHosts, name: str) -> None:
    fstab = lab.read_file(name, "/etc/fstab").splitlines()
    lines = [ln.split() for ln in fstab if ln.strip() and not ln.startswith("#")]
    ours = [f for f in lines if f[1] == MOUNT_PATH]
    assert ours == [[EXPORT, MOUNT_PATH, "nfs", MOUNT_OPTIONS, "0", "0"]], fstab
    opts = ours[0][3].split(",")
    assert {"proto=rdma", "port=20049", "vers=4.1", "hard"} <= set(opts)
    # The export is shared by every host: no set-uid or device file on it acts here.
    assert {"nosuid", "nodev"} <= set(opts)
    assert not any(o.startswith("proto=tcp") for o in opts)


def test_mounted_through_mount_nfs_with_the_rdma_options(lab: LabHosts, name: str) -> None:
    assert lab.testinfra(name).mount_point(MOUNT_PATH).exists
    calls = lab.doubles_log(name, "mount.nfs")
    assert calls and calls[0].startswith(f"{EXPORT} {MOUNT_PATH} -o ")
    assert "proto=rdma" in calls[0] and "port=20049" in calls[0]
    # /proc/mounts as a real kernel would show it (the double's view of its tmpfs stand-in).
    mounts = lab.ssh(name, ["/usr/share/kvops-test-doubles/bin/proc-mounts"]).stdout
    ours = [ln.split() for ln in mounts.splitlines() if f" {MOUNT_PATH} " in ln]
    assert ours and ours[0][0] == EXPORT and ours[0][2] == "nfs4"
    assert {"vers=4.1", "proto=rdma", "port=20049", "nosuid", "nodev"} <= set(ours[0][3].split(","))


def test_gds_directory_belongs_to_the_service_user(lab: LabHosts, name: str) -> None:
    host = lab.testinfra(name)
    d = host.file(f"{MOUNT_PATH}/gds")
    assert d.is_directory
    assert d.user == "vllm" and d.group == "vllm" and d.mode == 0o750
    # The fixed ids every host shares (sec=sys checks numbers), not whatever useradd picked.
    assert d.uid == 990 and d.gid == 990
    user = host.user("vllm")
    assert user.exists and user.uid == 990 and user.gid == 990
    assert user.shell == "/usr/sbin/nologin"
