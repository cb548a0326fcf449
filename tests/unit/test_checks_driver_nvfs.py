"""Driver and nvidia-fs judges: versions, open module, module list, PeerDirect."""

from __future__ import annotations

from evidence_builders import (
    PROC_PROPRIETARY,
    command,
    edited,
    file_item,
    findings_for,
    fixture,
)

from kvops.checks.model import Thresholds
from kvops.validate.judge import judge

NO_SMI = command(["nvidia-smi"], "", exit_code=127)


def test_driver_below_minimum_fails() -> None:
    doc = edited()
    found = [
        (str(f.severity), f.message)
        for f in judge(doc, Thresholds(min_driver_version="580.1"))
        if f.check_id == "GDS-001"
    ]
    assert found == [("FAIL", "driver 570.124.06 < minimum 580.1")]


def test_driver_from_proc_when_nvidia_smi_missing() -> None:
    assert findings_for(edited(nvidia_smi=NO_SMI), "GDS-001")[0][0] == "PASS"


def test_no_driver_at_all_fails() -> None:
    gone = file_item("/proc/driver/nvidia/version", "", error="ENOENT: no such file")
    [(severity, message)] = findings_for(
        edited(nvidia_smi=NO_SMI, nvidia_driver_version=gone), "GDS-001"
    )
    assert severity == "FAIL" and "exit 127" in message and "ENOENT" in message


def test_proprietary_module_with_old_nvidia_fs_is_only_a_warning() -> None:
    proprietary = file_item("/proc/driver/nvidia/version", PROC_PROPRIETARY)
    doc = edited(
        nvidia_driver_version=proprietary,
        nvfs_version=file_item("/proc/driver/nvidia-fs/version", "version: 2.16\n"),
    )
    assert findings_for(doc, "GDS-002")[0][0] == "WARN"
    # "2.17" may be 2.17.5 or later: not provably old enough for the proprietary module
    doc["items"]["nvfs_version"]["stdout"] = "version: 2.17\n"
    assert findings_for(doc, "GDS-002")[0][0] == "FAIL"
    # without the version file, the stats' three-part version decides
    doc = edited(nvidia_driver_version=proprietary, nvfs_version=None, gdscheck=None)
    assert findings_for(doc, "GDS-011") == [("FAIL", "nvidia_fs 2.7.47 < minimum 2.12")]
    assert findings_for(doc, "GDS-002")[0][0] == "WARN"


def test_open_module_from_gdscheck_when_proc_missing() -> None:
    doc = edited(nvidia_driver_version=None)
    assert findings_for(doc, "GDS-002") == [("PASS", "open kernel module loaded")]


def test_nvidia_fs_not_loaded_fails() -> None:
    modules = file_item("/proc/modules", "nvidia 9789440 0 - Live 0x0\nrpcrdma 1 0 - Live 0x0\n")
    assert findings_for(edited(modules=modules), "GDS-010")[0][0] == "FAIL"


def test_nvidia_fs_version_minimum() -> None:
    doc = edited()
    found = [
        f for f in judge(doc, Thresholds(min_nvidia_fs_version="2.21")) if f.check_id == "GDS-011"
    ]
    assert [str(f.severity) for f in found] == ["FAIL"]


def test_peerdirect_from_gdscheck_when_stats_missing() -> None:
    doc = edited(nvfs_stats=None)
    # the NetApp recording says `--Mellanox PeerDirect : Disabled`
    assert findings_for(doc, "GDS-012") == [("WARN", "PeerDirect disabled in nvidia-fs")]
    doc["items"]["gdscheck"]["stdout"] = fixture(
        "gdscheck/h100-ubuntu-gds1.13-nfs-rdma-supported-nonroot.txt"
    )
    assert findings_for(doc, "GDS-012")[0][0] == "PASS"
