"""nvidia-fs stats parser: the docs' MiB and legacy MB samples, and the kernel's tab format."""

from __future__ import annotations

from pathlib import Path

from kvops.parse.nvfs_stats import io_counts, parse_nvfs_stats

FIXTURES = Path(__file__).parent.parent / "fixtures" / "nvidia-fs"

# The shape src/nvfs-stat.c prints (labels followed by tabs); values made up.
KERNEL_FORMAT = (
    "GDS Version: 1.17.1.22 \n"
    "NVFS statistics(ver: 4.0)\n"
    "NVFS Driver(version: 2.26.6)\n"
    "Mellanox PeerDirect Supported: False\n"
    "IO stats: Enabled, peer IO stats: Disabled\n"
    "Logging level: info\n\n"
    "Active Shadow-Buffer (MiB): 0\n"
    "Active Process: 1\n"
    "Reads\t\t\t\t: n=120 ok=118 err=2 readMiB=480 io_state_err=0\n"
    "Reads\t\t\t\t: Bandwidth(MiB/s)=812 Avg-Latency(usec)=90\n"
    "Writes\t\t\t\t: n=64 ok=64 err=0 writeMiB=256 io_state_err=0 pg-cache=0 "
    "pg-cache-fail=0 pg-cache-eio=0\n"
    "Batches\t\t\t\t: n=0 ok=0 err=0 Avg-Submit-Latency(usec)=0\n"
    "Ops\t\t\t\t: Read=0 Write=0 BatchIO=0\n"
)


def test_mib_sample_16_gpus() -> None:
    stats = parse_nvfs_stats((FIXTURES / "nvidia-docs-stats-gds1.0-16gpu-mib.txt").read_text())
    assert stats.gds_version == "1.0.0.71"
    assert stats.driver_version == "2.7.47"
    assert stats.stats_version == "4.0"
    assert stats.peerdirect_supported is True
    assert stats.unit == "MiB"
    assert stats.reads["n"] == 0 and stats.reads["mib"] == 0
    assert stats.sections["Sparse Reads"]["n"] == "6"
    assert len(stats.gpus) == 16
    assert stats.gpus[5] == {
        "bdf": "0000:34:00.0",
        "uuid": "e11b33d9-60f7-a721-220a-d14e5b15a52c",
        "registered_mib": 0.0,
        "cache_mib": 0.0,
        "max_pinned_mib": 128.0,
        "cross_root_port_pct": 0.0,
    }
    assert stats.warnings == []


def test_legacy_mb_sample_with_wrapped_line() -> None:
    text = (FIXTURES / "nvidia-docs-stats-legacy-mb-single-write.txt").read_text()
    stats = parse_nvfs_stats(text)
    assert stats.unit == "MB"
    assert stats.writes["n"] == 1 and stats.writes["ok"] == 1
    assert stats.writes["pg_cache_eio"] == 0  # folded from its own wrapped line
    assert stats.gpus[0]["registered_mib"] == 0.0  # pinned_MB
    assert stats.gpus[0]["cross_root_port_pct"] == 100.0
    assert io_counts(stats) == (0, 1)
    assert stats.warnings == []


def test_kernel_tab_format() -> None:
    stats = parse_nvfs_stats(KERNEL_FORMAT)
    assert stats.gds_version == "1.17.1.22"
    assert stats.driver_version == "2.26.6"
    assert stats.peerdirect_supported is False
    assert stats.reads["mib"] == 480 and stats.reads["bandwidth_mib_s"] == 812
    assert stats.ops == {"read": 0, "write": 0, "batchio": 0}
    assert io_counts(stats) == (120, 64)


def test_truncated_stats_warn_and_have_no_counts() -> None:
    stats = parse_nvfs_stats(KERNEL_FORMAT[: KERNEL_FORMAT.index("Writes")])
    assert io_counts(stats) is None
    assert any("truncated" in w for w in stats.warnings)


def test_empty_input() -> None:
    stats = parse_nvfs_stats("")
    assert stats.warnings == ["no nvidia-fs statistics found"]


def test_io_stats_state() -> None:
    """`IO stats: Disabled` (rw_stats_enabled=0): the driver prints Reads/Writes without n=
    (gds-nvidia-fs src/nvfs-stat.c), which is not a truncated copy."""
    assert parse_nvfs_stats(KERNEL_FORMAT).io_stats_enabled is True
    off = KERNEL_FORMAT.replace("IO stats: Enabled", "IO stats: Disabled")
    off = off.replace("n=120 ok=118 err=2 readMiB=480 ", "err=2 ").replace("n=64 ok=64 ", "")
    stats = parse_nvfs_stats(off)
    assert stats.io_stats_enabled is False and io_counts(stats) is None
    assert not any("truncated" in w for w in stats.warnings), stats.warnings
    assert parse_nvfs_stats("Reads : n=1\n").io_stats_enabled is None
