"""gdscheck verdicts, IOMMU, and the storage bench judges."""

from __future__ import annotations

from evidence_builders import command, data_item, edited, file_item, findings_for, fixture, healthy

from kvops.checks.model import Thresholds
from kvops.validate.judge import judge


def gdscheck(name: str) -> dict[str, object]:
    return command(["gdscheck", "-p"], fixture(f"gdscheck/{name}"))


def test_nfs_unsupported_gds10_fails() -> None:
    doc = edited(gdscheck=gdscheck("quadro-p1000-gds1.0-nvme-only-nfs-unsupported.txt"))
    [(severity, message)] = findings_for(doc, "GDS-040")
    assert severity == "FAIL" and "unsupported" in message


def test_gdscheck_missing_warns_with_install_hint() -> None:
    doc = edited(gdscheck=command(["gdscheck", "-p"], "", exit_code=127))
    findings = [f for f in judge(doc) if f.check_id == "GDS-040"]
    assert [str(f.severity) for f in findings] == ["WARN"]
    assert "gds-tools" in findings[0].remedy
    assert findings_for(doc, "GDS-041")[0][0] == "SKIP"


def test_platform_verification_failed() -> None:
    text = fixture("gdscheck/openshift-l40s-netapp-nfs-rdma-supported.txt").replace(
        "succeeded", "failed"
    )
    doc = edited(gdscheck=command(["gdscheck", "-p"], text))
    assert findings_for(doc, "GDS-041")[0][0] == "FAIL"


def test_iommu_from_cmdline_groups_and_gdscheck() -> None:
    on = file_item("/proc/cmdline", "ro intel_iommu=on\n")
    assert findings_for(edited(cmdline=on), "GDS-042")[0][0] == "WARN"  # default may be pt
    forced = file_item("/proc/cmdline", "ro iommu.passthrough=0\n")
    assert findings_for(edited(cmdline=forced), "GDS-042")[0][0] == "FAIL"
    passthrough = file_item("/proc/cmdline", "ro intel_iommu=on iommu=pt\n")
    assert findings_for(edited(cmdline=passthrough), "GDS-042")[0][0] == "PASS"
    groups = data_item("sysfs", "/sys/kernel/iommu_groups", {"group_count": 42})
    [(severity, message)] = findings_for(edited(iommu=groups), "GDS-042")
    assert severity == "WARN" and "iommu_groups/*/type" in message
    only_gdscheck = edited(cmdline=None, iommu=None)
    assert findings_for(only_gdscheck, "GDS-042") == [("PASS", "gdscheck: IOMMU disabled")]


def test_slow_link_share_warns() -> None:
    doc = healthy()
    doc["items"]["infiniband"]["data"]["devices"][0]["ports"][0]["rate"] = "200 Gb/sec (4X HDR)"
    [(severity, message)] = findings_for(doc, "GDS-050")
    assert severity == "WARN" and "11% of the 200 Gb/s link" in message
    lenient = [
        str(f.severity)
        for f in judge(doc, Thresholds(bench_min_link_share=0.1))
        if f.check_id == "GDS-050"
    ]
    assert lenient == ["PASS"]


def test_bench_not_requested_skips_and_failed_gdsio_fails() -> None:
    doc = edited(gdsio_write=None, gdsio_read=None, nvfs_stats_before_bench=None)
    assert findings_for(doc, "GDS-050")[0][0] == "SKIP"
    assert findings_for(doc, "GDS-051")[0][0] == "SKIP"
    broken = command(["gdsio"], "", exit_code=1, stderr="cuFileHandleRegister failed")
    [(severity, message)] = findings_for(edited(gdsio_write=broken), "GDS-050")
    assert severity == "FAIL" and "cuFileHandleRegister" in message


def test_cpu_only_bench_is_not_gds() -> None:
    lines = fixture("gdsio/quadro-p1000-ext4-nvme-xfer-types.txt").splitlines()
    cpu_only = "\n".join(ln for ln in lines if "CPUONLY" in ln)
    doc = edited(gdsio_write=command(["gdsio"], cpu_only), gdsio_read=None)
    assert findings_for(doc, "GDS-050")[0][0] == "FAIL"


def test_small_io_only_is_not_judged_against_the_link() -> None:
    doc = healthy()
    doc["items"].pop("gdsio_write")
    [(severity, message)] = findings_for(doc, "GDS-050")
    assert severity == "SKIP" and "1024 KiB" in message


def test_link_rate_unknown_skips() -> None:
    assert findings_for(edited(infiniband=None), "GDS-050")[0][0] == "SKIP"


def test_only_writes_counted_fails() -> None:
    doc = healthy()
    after = doc["items"]["nvfs_stats_after_bench"]
    after["stdout"] = after["stdout"].replace("Reads : n=312794", "Reads : n=0")
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "FAIL" and "+0 reads" in message


def test_truncated_gdscheck_is_a_warning_not_a_verdict() -> None:
    text = fixture("gdscheck/openshift-l40s-netapp-nfs-rdma-supported.txt")
    cut = text[: text.index("DRIVER CONFIGURATION")]
    doc = edited(gdscheck=command(["gdscheck", "-p"], cut, truncated=True))
    [(severity, message)] = findings_for(doc, "GDS-040")
    assert severity == "WARN" and "truncated" in message


def test_iommu_default_domain_type_decides() -> None:
    """A kernel built to default to pass-through has IOMMU groups of type identity and no
    iommu=pt on its command line: that is not a FAIL (it was)."""
    identity = {"group_count": 42, "types": {"identity": 42}}
    doc = edited(iommu=data_item("sysfs", "/sys/kernel/iommu_groups", identity))
    assert findings_for(doc, "GDS-042")[0][0] == "PASS"
    translated = {"group_count": 42, "types": {"identity": 2, "DMA-FQ": 40}}
    on_pt = file_item("/proc/cmdline", "ro iommu=pt\n")  # the types are the effective state
    doc = edited(iommu=data_item("sysfs", "/sys/kernel/iommu_groups", translated), cmdline=on_pt)
    [(severity, message)] = findings_for(doc, "GDS-042")
    assert severity == "FAIL" and "40 IOMMU groups translate DMA" in message


def test_acs_redirect_is_reported() -> None:
    assert findings_for(healthy(), "GDS-044")[0][0] == "PASS"
    doc = healthy()
    acs = doc["items"]["pci_acs"]
    acs["stdout"] = acs["stdout"].replace("ReqRedir- CmpltRedir-", "ReqRedir+ CmpltRedir+", 1)
    [(severity, message)] = findings_for(doc, "GDS-044")
    assert severity == "WARN" and "ACS redirect on 1 PCIe ports" in message
    denied = "17:02.0 PCI bridge: X\n\tCapabilities: <access denied>\n"
    doc = edited(pci_acs=command(["lspci", "-vvv"], denied))
    assert findings_for(doc, "GDS-044")[0][0] == "SKIP"


def test_counters_that_cannot_move_are_not_a_bypass() -> None:
    doc = healthy()
    before = doc["items"]["nvfs_stats_before_bench"]["stdout"]
    doc["items"]["nvfs_stats_after_bench"]["stdout"] = before  # nothing counted
    assert findings_for(doc, "GDS-051")[0][0] == "FAIL"
    doc["items"]["nvfs_params"] = data_item(
        "sysfs", "/sys/module/nvidia_fs/parameters", {"rw_stats_enabled": "0"}
    )
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "SKIP" and "echo 1 > /sys/module/nvidia_fs/parameters" in message
    del doc["items"]["nvfs_params"]
    cufile = doc["items"]["cufile_json"]
    text = cufile["stdout"]
    cufile["stdout"] = text.replace('"properties": {', '"properties": {"use_pci_p2pdma": true,', 1)
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "WARN" and "P2PDMA" in message


def test_counters_with_io_stats_disabled_cannot_tell() -> None:
    """nvidia-fs with rw_stats_enabled=0 prints `IO stats: Disabled` (gds-nvidia-fs
    src/nvfs-stat.c): zero Reads/Writes counters then prove nothing about the I/O path."""
    doc = healthy()
    for item_id in ("nvfs_stats_before_bench", "nvfs_stats_after_bench"):
        item = doc["items"][item_id]
        item["stdout"] = doc["items"]["nvfs_stats_before_bench"]["stdout"].replace(
            "IO stats: Enabled", "IO stats: Disabled"
        )
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "SKIP" and "cannot tell" in message
    assert "echo 1 > /sys/module/nvidia_fs/parameters/rw_stats_enabled" in message


def test_counters_with_io_stats_disabled_current_format() -> None:
    """The current driver leaves n= out of Reads/Writes when statistics are off."""
    doc = healthy()
    text = doc["items"]["nvfs_stats_before_bench"]["stdout"].replace(
        "IO stats: Enabled", "IO stats: Disabled"
    )
    lines = [ln for ln in text.splitlines() if not ln.startswith(("Reads", "Writes"))]
    lines += ["Reads : err=0 io_state_err=0", "Writes : err=0 io_state_err=0 pg-cache=0"]
    for item_id in ("nvfs_stats_before_bench", "nvfs_stats_after_bench"):
        doc["items"][item_id]["stdout"] = "\n".join(lines) + "\n"
    [(severity, message)] = findings_for(doc, "GDS-051")
    assert severity == "SKIP" and "cannot tell" in message
