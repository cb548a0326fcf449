"""gdscheck -p parser on every recorded output: old Supported/Unsupported, new mode lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvops.parse.gdscheck import parse_gdscheck, rdma_device_status

FIXTURES = Path(__file__).parent.parent / "fixtures" / "gdscheck"


def load(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_netapp_l40s_nfs_supported() -> None:
    report = parse_gdscheck(load("openshift-l40s-netapp-nfs-rdma-supported.txt"))
    assert report.gds_release_version == "1.13.1.3"
    assert report.nvidia_fs_version == "2.20"
    assert report.libcufile_version == "2.12"
    assert report.modes("NFS") == ["supported"]
    assert report.direct_modes("nfs") == ["supported"]
    assert report.driver_properties["Mellanox PeerDirect"] == "Disabled"
    assert report.cufile["properties.use_compat_mode"] == "true"
    assert report.cufile["fs.lustre.posix_gds_min_kb"] == "0"  # no space before the colon
    assert report.gpus == [
        {
            "index": 0,
            "name": "NVIDIA L40S",
            "bar_index": 1,
            "bar_size_mib": 65536,
            "supports_gds": True,
            "iommu_state": "Disabled",
        }
    ]
    assert report.platform["Nvidia Driver Info Status"] == "Supported(Nvidia Open Driver Installed)"
    assert report.platform_verification is True
    assert report.warnings == []
    assert rdma_device_status(report) == (0, 0)


def test_gds116_mode_lists_and_compat_only_nfs() -> None:
    report = parse_gdscheck(load("nvidia-docs-l4-rhel9-gds1.16-nfs-compat.txt"))
    assert report.nvidia_fs_minimum_version == "2.12"
    assert report.libcufile_version is None
    assert report.modes("NVMe") == ["nvfs", "compat"]
    assert report.modes("NFS") == ["compat"]
    assert report.direct_modes("NFS") == []
    assert report.modes("WekaFS") == ["dmabuf", "compat"]
    assert report.modes("Userspace RDMA") == ["supported"]
    assert report.driver_properties["DmaBuf support"] == "Enabled"
    assert rdma_device_status(report) == (1, 0)
    assert report.cufile["fs.nfs.use_pci_p2pdma"] == "false"
    assert report.warnings == []


def test_nonroot_h100_with_prompt_and_log_warning() -> None:
    report = parse_gdscheck(load("h100-ubuntu-gds1.13-nfs-rdma-supported-nonroot.txt"))
    assert report.modes("NFS") == ["supported"]
    assert report.modes("NVMe P2PDMA") == ["unsupported"]
    assert report.messages == [
        "warn: error opening log file: Permission denied, logging will be disabled"
    ]
    assert len(report.gpus) == 8
    assert report.cufile["properties.max_direct_io_size_kb"] == "1024"
    assert report.warnings == []


def test_gds10_oldest_format_nfs_unsupported() -> None:
    report = parse_gdscheck(load("quadro-p1000-gds1.0-nvme-only-nfs-unsupported.txt"))
    assert report.gds_release_version == "1.0.0.82"
    assert report.arch is None
    assert report.modes("NFS") == ["unsupported"]
    assert report.direct_modes("NFS") == []
    assert report.gpus[0]["iommu_state"] is None
    assert report.platform == {
        "IOMMU": "disabled",
        "verification": "Platform verification succeeded",
    }
    assert report.platform_verification is True


@pytest.mark.parametrize("cut_at", ["GPU INFO:", "NFS ", "Platform verification"])
def test_truncated_output_keeps_what_was_read_and_warns(cut_at: str) -> None:
    text = load("openshift-l40s-netapp-nfs-rdma-supported.txt")
    report = parse_gdscheck(text[: text.index(cut_at)])
    assert report.gds_release_version == "1.13.1.3"
    assert report.platform_verification is None
    assert report.warnings


def test_failed_verification_is_false_not_none() -> None:
    text = load("openshift-l40s-netapp-nfs-rdma-supported.txt").replace(
        "Platform verification succeeded", "Platform verification error"
    )
    assert parse_gdscheck(text).platform_verification is False


def test_not_gdscheck_output() -> None:
    report = parse_gdscheck("bash: gdscheck: command not found\n")
    assert report.drivers == {}
    assert any("missing" in w for w in report.warnings)


def test_lines_without_section_banners_are_read_by_their_shape() -> None:
    """A partial copy (pasted from the middle) or an older layout without banners: what is
    there is still read, and the report says banners were missing."""
    text = (FIXTURES / "openshift-l40s-netapp-nfs-rdma-supported.txt").read_text()
    banners = ("ENVIRONMENT:", "DRIVER CONFIGURATION:", "CUFILE CONFIGURATION:", "GPU INFO:",
               "PLATFORM INFO:")  # fmt: skip
    stripped = "\n".join(ln for ln in text.splitlines() if ln.strip() not in banners)
    report = parse_gdscheck(stripped)
    assert report.direct_modes("NFS") == parse_gdscheck(text).direct_modes("NFS") != []
    assert report.platform_verification is True
    assert any("without a section banner" in w for w in report.warnings)
    assert not any("section 'drivers' missing" in w for w in report.warnings)
    middle = text[text.index(" NFS") :]  # copied from the NFS line on: header lost
    assert parse_gdscheck(middle).direct_modes("NFS") != []
