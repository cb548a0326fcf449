"""playbooks/site.yml on two lab hosts: converge, idempotence, check mode, reboot.

The second run is the installed collection's copy of site.yml (conftest.py's
`installed_site_second_run`): one run proves both that nothing changes and that the collection
converges the lab."""

from __future__ import annotations

import re
import subprocess

import pytest
from lab_harness import LabHosts
from site_lab import (
    MOUNT_PATH,
    changed_tasks,
    converge_hosts,
    converged,
    explain,
    recap,
    run_site,
)


def test_site_converges_two_hosts(lab: LabHosts) -> None:
    proc = converged(lab)
    counts = recap(proc)
    for name in converge_hosts(lab):
        assert counts[name]["failed"] == 0 and counts[name]["unreachable"] == 0, explain(proc)
        assert counts[name]["changed"] > 0, "a fresh host must change"
    # The roles ran in site.yml's order on every host.
    roles = re.findall(r"^TASK \[(\w+) : ", proc.stdout, re.MULTILINE)
    first_seen = list(dict.fromkeys(roles))
    assert first_seen == [
        "kernel_gate",
        "nvidia_driver",
        "rdma_client",
        "nvidia_fs",
        "nfs_rdma_mount",
        "cufile",
    ]


def test_cufile_handler_is_harmless_without_the_inference_service(lab: LabHosts) -> None:
    proc = converged(lab)
    assert "RUNNING HANDLER [cufile : Cufile | Look up the inference service]" in proc.stdout
    restart = proc.stdout.split(
        "RUNNING HANDLER [cufile : Cufile | Restart the running inference service", 1
    )[1].split("\n\n", 1)[0]
    assert "skipping:" in restart and "changed:" not in restart and "fatal:" not in restart


def test_second_run_changes_nothing(
    installed_site_second_run: subprocess.CompletedProcess[str],
) -> None:
    """The second run comes from the installed collection (the same roles and files as the
    checkout's site.yml; conftest.py's `installed_site_second_run`, which
    test_site_collection.py reads too)."""
    proc = installed_site_second_run
    assert proc.returncode == 0, explain(proc)
    assert "TASK [kvops.gds.nfs_rdma_mount : " in proc.stdout, explain(proc)
    for name, counts in recap(proc).items():
        assert counts["changed"] == 0, f"{name} changed on the second run:\n{explain(proc)}"
        assert counts["failed"] == 0


def test_check_diff_on_a_converged_host_reports_no_changes(lab: LabHosts) -> None:
    converged(lab)
    proc = run_site(lab, check=True, diff=True)
    assert proc.returncode == 0, explain(proc)
    for name, counts in recap(proc).items():
        assert counts["changed"] == 0, f"{name} would change in check mode:\n{explain(proc)}"
    assert "--- before" not in proc.stdout and "+++ after" not in proc.stdout


@pytest.mark.parametrize("role", ["nfs_rdma_mount", "cufile"])
def test_a_role_tag_runs_only_that_role(lab: LabHosts, role: str) -> None:
    converged(lab)
    proc = run_site(lab, "--tags", role)
    assert proc.returncode == 0, explain(proc)
    # Argument validation is tagged "always": it runs for every role, nothing else does.
    ran = set(re.findall(r"^TASK \[(\w+) : (?!Validating arguments)", proc.stdout, re.MULTILINE))
    assert ran == {role}
    assert all(c["changed"] == 0 for c in recap(proc).values())


def test_after_a_reboot_modules_and_mount_come_back_from_the_boot_files(lab: LabHosts) -> None:
    converged(lab)
    name = converge_hosts(lab)[0]
    lab.restart(name)
    boot = lab.doubles_log(name, "boot")
    last_boot = boot[max(i for i, line in enumerate(boot) if line.startswith("boot ")) :]
    # /etc/modules-load.d (rdma_client, nvidia_fs) replayed by the boot double ...
    assert "loaded rpcrdma" in last_boot and "loaded nvidia_fs" in last_boot, boot
    # ... and the fstab line mounted again (the lab boot mounts fstab NFS entries).
    assert lab.testinfra(name).mount_point(MOUNT_PATH).exists
    # The GDS directory lived on the tmpfs stand-in of the export, so it is created again (on
    # ONTAP it would still be there); nothing else changes.
    proc = run_site(lab, limit=name)
    assert proc.returncode == 0, explain(proc)
    assert set(changed_tasks(proc, name)) <= {
        "nfs_rdma_mount : Nfs_rdma_mount | Mount the ONTAP export over RDMA",
        "nfs_rdma_mount : Nfs_rdma_mount | Create the GDS directory for the service user",
    }, explain(proc)
    assert lab.testinfra(name).file(f"{MOUNT_PATH}/gds").user == "vllm"


def test_doca_over_the_coldplugged_in_box_modules_rebuilt_the_initramfs_then_rebooted(
    lab: LabHosts,
) -> None:
    """DOCA-OFED replaced the in-box ib_core/mlx5 loaded at boot, so the initramfs was rebuilt
    (the handler) and the kernel gate rebooted (the lab's reboot double, opt-in in the lab vars)
    before rpcrdma and nvidia_fs were loaded."""
    proc = converged(lab)
    for name in converge_hosts(lab):
        changed = changed_tasks(proc, name)
        assert (
            "rdma_client : Rdma_client | Ask the kernel gate for a reboot when DOCA-OFED "
            "replaced loaded modules" in changed
        ), explain(proc)
        assert "kernel_gate : Kernel_gate | Reboot the host for the kernel change" in changed
        assert lab.doubles_log(name, "update-initramfs") == ["-u -k all"]
        assert len(lab.doubles_log(name, "reboot")) == 1
