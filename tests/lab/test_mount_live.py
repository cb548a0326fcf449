"""nfs_rdma_mount judges the live mount, not only fstab: a hand-made TCP mount is replaced.

A remount cannot change the transport, port or NFS version, and ansible.posix.mount compares
fstab only: a host whose export was mounted by hand with proto=tcp looked converged.
"""

from __future__ import annotations

from lab_harness import LabHosts
from site_lab import EXPORT, MOUNT_PATH, changed_tasks, converge_hosts, converged, explain, run_site

PROC_MOUNTS = "/usr/share/kvops-test-doubles/bin/proc-mounts"


def _live_options(lab: LabHosts, name: str) -> set[str]:
    lines = lab.ssh(name, [PROC_MOUNTS]).stdout.splitlines()
    ours = [ln.split() for ln in lines if f" {MOUNT_PATH} " in ln]
    assert len(ours) == 1, lines
    return set(ours[0][3].split(","))


def test_a_hand_made_tcp_mount_is_unmounted_and_mounted_over_rdma(lab: LabHosts) -> None:
    converged(lab)
    name = converge_hosts(lab)[0]
    lab.ssh(name, ["umount", MOUNT_PATH], sudo=True)
    tcp = "vers=4.1,proto=tcp,port=2049,hard"
    lab.ssh(name, ["mount", "-t", "nfs", "-o", tcp, EXPORT, MOUNT_PATH], sudo=True)
    assert {"proto=tcp", "port=2049"} <= _live_options(lab, name)
    # fstab still has the right line: only the live mount is wrong.
    assert "proto=rdma" in lab.read_file(name, "/etc/fstab")

    proc = run_site(lab, "--tags", "nfs_rdma_mount", limit=name)
    assert proc.returncode == 0, explain(proc)
    changed = changed_tasks(proc, name)
    assert (
        "nfs_rdma_mount : Nfs_rdma_mount | Unmount a live mount whose export, transport, port "
        "or version differ" in changed
    ), explain(proc)
    assert "proto tcp -> rdma" in proc.stdout and "port 2049 -> 20049" in proc.stdout
    assert {"proto=rdma", "port=20049", "vers=4.1"} <= _live_options(lab, name)
    assert lab.doubles_log(name, "mount.nfs")[-1].startswith(f"{EXPORT} {MOUNT_PATH} -o ")
    assert "proto=rdma" in lab.doubles_log(name, "mount.nfs")[-1]

    again = run_site(lab, "--tags", "nfs_rdma_mount", limit=name)
    assert again.returncode == 0, explain(again)
    assert changed_tasks(again, name) == [], explain(again)


def test_the_service_user_creates_the_gds_directory_where_the_export_root_is_its_own(
    lab: LabHosts,
) -> None:
    """With root squashed (ontap_export's default) only the owner of the volume root, the service
    uid, may create in it: the role then creates the GDS directory as that user (sudo -u vllm to
    a nologin account), not as root. The lab has no root squash; the export's root is given to
    uid 990 as ontap_export gives it on the volume."""
    converged(lab)
    name = converge_hosts(lab)[0]
    gds = f"{MOUNT_PATH}/gds"
    lab.ssh(name, ["rm", "-rf", gds], sudo=True)
    lab.ssh(name, ["chown", "990:990", MOUNT_PATH], sudo=True)
    try:
        proc = run_site(lab, "--tags", "nfs_rdma_mount", "-vvv", limit=name)
        assert proc.returncode == 0, explain(proc)
        stat = lab.ssh(name, ["stat", "-c", "%u %g %a", gds], sudo=True).stdout.split()
        assert stat == ["990", "990", "750"]
        # Ansible's become command for that task: sudo to the service user (-vvv shows it).
        assert "-u vllm /bin/sh -c" in proc.stdout, explain(proc)
        again = run_site(lab, "--tags", "nfs_rdma_mount", limit=name)
        assert again.returncode == 0 and changed_tasks(again, name) == [], explain(again)
    finally:
        lab.ssh(name, ["chown", "0:0", MOUNT_PATH], sudo=True)
