"""Bad input is rejected before anything changes, with a message that names the problem.

meta/argument_specs.yml (types, choices, required) and the cross-field asserts at the top of
each role, run against a lab host. No play here changes the host.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from lab_harness import LabHosts
from site_lab import explain, failure_messages, recap, run_role

ADDRESS = {"nfs_rdma_mount_export_address": "192.0.2.50"}

CASES: list[tuple[str, str, dict[str, Any], list[str]]] = [
    (
        "wrong-type-int",
        "nfs_rdma_mount",
        {**ADDRESS, "nfs_rdma_mount_rsize": "lots"},
        ["argument 'nfs_rdma_mount_rsize' is of type str", "unable to convert to int"],
    ),
    (
        "wrong-type-bool",
        "nvidia_driver",
        {"nvidia_driver_hold": "perhaps"},
        ["argument 'nvidia_driver_hold' is of type str", "unable to convert to bool"],
    ),
    (
        "wrong-type-dict",
        "cufile",
        {"cufile_overrides": ["properties"]},
        ["argument 'cufile_overrides' is of type list", "unable to convert to dict"],
    ),
    (
        "unknown-choice-stack",
        "rdma_client",
        {"rdma_client_stack": "mlnx-ofed"},
        ["rdma_client_stack must be one of: rdma-core, doca-ofed, got: mlnx-ofed"],
    ),
    (
        "unknown-choice-nfs-version",
        "nfs_rdma_mount",
        {**ADDRESS, "nfs_rdma_mount_nfs_version": "4.2"},
        ["nfs_rdma_mount_nfs_version must be one of: 3, 4.0, 4.1, got: 4.2"],
    ),
    (
        "cufile-key-typo",
        "cufile",
        {"cufile_overrides": {"properties": {"allow_compat_mod": False}}},
        ['"properties.allow_compat_mod" (did you mean "properties.allow_compat_mode"?)'],
    ),
    (
        "cufile-gdscheck-name",
        "cufile",
        {"cufile_overrides": {"properties": {"use_compat_mode": False}}},
        ['"properties.use_compat_mode" (did you mean "properties.allow_compat_mode"?)'],
    ),
    (
        "ontap-floor",
        "nfs_rdma_mount",
        {
            **ADDRESS,
            "nfs_rdma_mount_nfs_version": "3",
            "nfs_rdma_mount_max_connect": 0,
            "nfs_rdma_mount_ontap_version": "9.14.1",
        },
        ["ONTAP 9.14.1 does not serve NFSv3 over RDMA", "needs ONTAP 9.15.1 or later"],
    ),
    (
        "max-connect-needs-4.1",
        "nfs_rdma_mount",
        {**ADDRESS, "nfs_rdma_mount_nfs_version": "4.0", "nfs_rdma_mount_max_connect": 8},
        ["max_connect is NFSv4.1 session trunking: only with NFS 4.1 (got vers=4.0)"],
    ),
    (
        "rsize-range",
        "nfs_rdma_mount",
        {**ADDRESS, "nfs_rdma_mount_rsize": 1000},
        ["nfs_rdma_mount_rsize must be a multiple of 4096 in 4096..1048576 (got 1000)"],
    ),
    (
        "cufile-cache-vs-batch",
        "cufile",
        {"cufile_overrides": {"properties": {"per_buffer_cache_size_kb": 4096}}},
        ["per_buffer_cache_size_kb (131072 / 4096) must be >= io_batchsize (128)"],
    ),
    (
        "nvidia-fs-option",
        "nvidia_fs",
        {"nvidia_fs_module_options": {"rw_stat_enabled": 1}},
        ["nvidia_fs_module_options has unknown nvidia-fs parameters (unknown: rw_stat_enabled;"],
    ),
    (
        "driver-version-branch",
        "nvidia_driver",
        {"nvidia_driver_version": "570.172.08-0ubuntu1"},
        ['nvidia_driver: nvidia_driver_version must start with "580." (got "570.172.08-0ubuntu1")'],
    ),
]


@pytest.mark.parametrize(
    ("role", "extra_vars", "expected"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_bad_input_fails_clearly(
    lab: LabHosts, tmp_path: Path, role: str, extra_vars: dict[str, Any], expected: list[str]
) -> None:
    name = lab.names[-1]
    proc = run_role(lab, tmp_path, role, limit=name, extra_vars=extra_vars)
    assert proc.returncode != 0, explain(proc)
    fatal = failure_messages(proc)
    for text in expected:
        assert text in fatal, f"{text!r} not in:\n{fatal}\n{explain(proc)}"
    assert recap(proc)[name]["changed"] == 0


def test_missing_export_address_is_rejected(lab: LabHosts, tmp_path: Path) -> None:
    name = lab.names[-1]
    # Without the lab's role variables: nothing sets nfs_rdma_mount_export_address.
    proc = run_role(lab, tmp_path, "nfs_rdma_mount", limit=name, site_vars=False)
    assert proc.returncode != 0, explain(proc)
    fatal = failure_messages(proc)
    assert "missing required arguments: nfs_rdma_mount_export_address" in fatal, explain(proc)
    # The GDS directory's owner ids are fixed per site, never picked per host (sec=sys).
    assert "nfs_rdma_mount_gds_dir_gid, nfs_rdma_mount_gds_dir_uid" in fatal, explain(proc)
    assert recap(proc)[name]["changed"] == 0
